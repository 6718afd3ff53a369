"""LTX-2: Lightricks' joint video and audio model (aitk.models.ltx2.model)."""
