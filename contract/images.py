"""An image to a classifier's input size, as the manifest's ``preprocessing`` says: the service and the
importer's parity check run this one function (Pillow), so what is checked is what is served.

``resize`` names Pillow's filter; ``resize_size`` (when set) is the square size resized to first, then
the centre ``image_size`` square is cut out, as Hugging Face image processors do with
``do_center_crop`` (e.g. DeiT: bicubic to 256, crop 224).
"""

from __future__ import annotations

from PIL import Image

RESAMPLE = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def resize_image(
    im: Image.Image, image_size: int, resize: str = "bilinear", resize_size: int | None = None
) -> Image.Image:
    first = resize_size or image_size
    if im.size != (first, first):
        im = im.resize((first, first), RESAMPLE[resize])
    if first != image_size:
        top = (first - image_size) // 2
        im = im.crop((top, top, top + image_size, top + image_size))
    return im
