"""Untrusted bytes to the pixels the model was trained on, refusing anything that could hurt the host.

Limits are checked in the cheapest order: encoded size before opening, declared pixel count from
the header before decoding a single pixel (the decompression-bomb guard; Pillow's own guard stays
on behind it). Conversion is the training one (``model/data/images.py::load_pil_image``): EXIF
orientation applied, converted to the model's colour mode, bilinear resize to its input size.
Small images are decoded on the event loop (a thread hop would cost more than the decode); large
ones in a small thread pool so that one big upload cannot stall every other request. A plain PNG
already in the model's size and mode skips Pillow for libspng (``service/png.py``): same pixels,
a fifth of the time.
"""

from __future__ import annotations

import asyncio
import io
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from contract.images import resize_image
from service import png
from service.errors import ImageTooLarge, UndecodableImage


@dataclass(frozen=True)
class ImageLimits:
    max_bytes: int
    max_pixels: int
    formats: tuple[str, ...]


def open_image(data: bytes, limits: ImageLimits) -> Image.Image:
    """Parse only the header; raise 413 for too many bytes or pixels, 400 for anything not an image."""
    if len(data) > limits.max_bytes:
        raise ImageTooLarge(f"image of {len(data)} bytes exceeds the limit of {limits.max_bytes} bytes")
    if not data:
        raise UndecodableImage("empty image")
    try:
        im = Image.open(io.BytesIO(data), formats=limits.formats)
    except Image.DecompressionBombError as e:
        raise ImageTooLarge(f"image refused as a decompression bomb: {e}") from e
    except UnidentifiedImageError as e:
        raise UndecodableImage(f"not an image in an accepted format ({', '.join(limits.formats)})") from e
    except Exception as e:  # Pillow raises many types on malformed headers
        raise UndecodableImage(f"cannot read the image header: {_reason(e)}") from e
    width, height = im.size
    if width < 1 or height < 1:
        raise UndecodableImage(f"image has no pixels ({width}x{height})")
    if width * height > limits.max_pixels:
        raise ImageTooLarge(f"image of {width}x{height} pixels exceeds the limit of {limits.max_pixels} pixels")
    return im


def to_pixels(
    im: Image.Image, image_size: int, color_mode: str, resize: str = "bilinear", resize_size: int | None = None
) -> np.ndarray:
    """Decode and convert exactly like training: uint8 (H, W) for "L", (H, W, C) otherwise; resized as the
    manifest says (``contract.images.resize_image``)."""
    try:
        im.load()  # decodes the first frame (GIF, multi-page TIFF) only
        ImageOps.exif_transpose(im, in_place=True)  # same pixels as training's copy, without copying
        if im.mode != color_mode:  # converting to the same mode would only copy
            im = im.convert(color_mode)
        im = resize_image(im, image_size, resize, resize_size)
        return np.asarray(im, dtype=np.uint8)
    except Exception as e:  # truncated data, corrupt chunks, unsupported modes...
        raise UndecodableImage(f"cannot decode the image: {_reason(e)}") from e


def decode(
    data: bytes,
    limits: ImageLimits,
    image_size: int,
    color_mode: str,
    resize: str = "bilinear",
    resize_size: int | None = None,
) -> np.ndarray:
    pixels = _fast_png(data, limits, image_size, color_mode) if resize_size in (None, image_size) else None
    if pixels is not None:
        return pixels
    return to_pixels(open_image(data, limits), image_size, color_mode, resize, resize_size)


def _fast_png(data: bytes, limits: ImageLimits, image_size: int, color_mode: str) -> np.ndarray | None:
    if len(data) > limits.max_bytes or "PNG" not in limits.formats or image_size * image_size > limits.max_pixels:
        return None
    return png.decode(data, image_size, color_mode)


def _reason(e: Exception) -> str:
    text = str(e).splitlines()[0][:200] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class ImageDecoder:
    """Decodes on the event loop or in its own threads, depending on the declared pixel count."""

    def __init__(self, limits: ImageLimits, *, inline_max_pixels: int, threads: int) -> None:
        self.limits = limits
        self.inline_max_pixels = inline_max_pixels
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="decode")

    async def decode(
        self, data: bytes, image_size: int, color_mode: str, resize: str = "bilinear", resize_size: int | None = None
    ) -> np.ndarray:
        if image_size * image_size <= self.inline_max_pixels and resize_size in (None, image_size):
            pixels = _fast_png(data, self.limits, image_size, color_mode)  # already the model's size: no resize
            if pixels is not None:
                return pixels
        im = open_image(data, self.limits)
        width, height = im.size
        if width * height <= self.inline_max_pixels:
            return to_pixels(im, image_size, color_mode, resize, resize_size)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, to_pixels, im, image_size, color_mode, resize, resize_size)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
