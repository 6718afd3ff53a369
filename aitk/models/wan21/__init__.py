"""Wan 2.1 video archs (`wan21`, `wan21_i2v`); Wan 2.2 14B builds on them (aitk.models.wan22)."""
