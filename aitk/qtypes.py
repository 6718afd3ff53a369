"""The weight qtypes aitk quantizes to (optimum-quanto names), in one torch-free place:
the preflight checks `model.qtype` without importing torch."""

QTYPES = ("qfloat8", "qint8", "qint4")
