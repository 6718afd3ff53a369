from aitk.models.prx_pixel.model import PRXPixelModel

__all__ = ["PRXPixelModel"]
