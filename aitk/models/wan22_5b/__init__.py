"""Wan 2.2 TI2V 5B: one transformer on the Wan 2.2 VAE (aitk.models.wan22_5b.model)."""
