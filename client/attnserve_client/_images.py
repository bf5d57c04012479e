"""Whatever a caller holds as an image, turned into the bytes of one multipart ``file`` part.

Encoded files (paths, bytes, file objects) are sent as they are: the service decodes them exactly
as it decodes training images, so the client never re-encodes them. Pixels (numpy arrays, PIL
images) are written as lossless PNG; arrays need only numpy, through the tiny encoder below.
"""

from __future__ import annotations

import io
import mimetypes
import os
import struct
import sys
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy
    from PIL import Image

    ImageInput = str | os.PathLike[str] | bytes | bytearray | memoryview | IO[bytes] | Image.Image | numpy.ndarray
else:
    ImageInput = Any

Upload = tuple[str, bytes, str]  # (filename, content, content type), as httpx takes a file part

_PNG_COLOR_TYPES = {1: 0, 2: 4, 3: 2, 4: 6}  # channels -> PNG colour type (grey, grey+alpha, RGB, RGBA)


def uploads(images: ImageInput | Sequence[ImageInput]) -> list[Upload]:
    """One upload per image; a list, a tuple or a 4-D array (N, H, W, C) holds several."""
    if isinstance(images, (list, tuple)) or (_is_ndarray(images) and images.ndim == 4):
        items = list(images)
    else:
        items = [images]
    if not items:
        raise ValueError("no images given")
    return [_upload(image, i) for i, image in enumerate(items)]


def _upload(image: ImageInput, index: int) -> Upload:
    if isinstance(image, (str, os.PathLike)):
        path = Path(image)
        return path.name, path.read_bytes(), _content_type(path.name)
    if isinstance(image, (bytes, bytearray, memoryview)):
        return f"image-{index}", bytes(image), "application/octet-stream"
    if _is_ndarray(image):
        return f"image-{index}.png", encode_png(image), "image/png"
    if _is_pil_image(image):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return f"image-{index}.png", buffer.getvalue(), "image/png"
    if hasattr(image, "read"):
        data = image.read()
        if not isinstance(data, bytes):
            raise TypeError(f"images[{index}]: open the file in binary mode ('rb'), got {type(data).__name__}")
        name = Path(getattr(image, "name", None) or f"image-{index}").name
        return name, data, _content_type(name)
    raise TypeError(
        f"images[{index}]: cannot send a {type(image).__name__}; give a path, bytes, a binary file, "
        "a PIL image or a numpy array"
    )


def _content_type(filename: str) -> str:
    return mimetypes.guess_type(filename)[0] or "application/octet-stream"


def _is_ndarray(value: object) -> bool:
    numpy = sys.modules.get("numpy")  # an array can only exist if numpy was imported
    return numpy is not None and isinstance(value, numpy.ndarray)


def _is_pil_image(value: object) -> bool:
    pil = sys.modules.get("PIL.Image")
    return pil is not None and isinstance(value, pil.Image)


def encode_png(pixels: numpy.ndarray) -> bytes:
    """A uint8 array (H, W), (H, W, 1), (H, W, 2), (H, W, 3) or (H, W, 4) as a PNG file."""
    import numpy as np

    if pixels.dtype != np.uint8:
        raise ValueError(
            f"image arrays must be uint8 (0-255), got {pixels.dtype}; "
            "for floats in [0, 1] send (x * 255).round().astype('uint8')"
        )
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if pixels.ndim != 3 or pixels.shape[2] not in _PNG_COLOR_TYPES:
        raise ValueError(f"image arrays must be (H, W) or (H, W, C) with C in 1-4, got shape {pixels.shape}")
    height, width, channels = pixels.shape
    rows = np.ascontiguousarray(pixels).reshape(height, width * channels)
    raw = np.concatenate([np.zeros((height, 1), np.uint8), rows], axis=1).tobytes()  # filter type 0 per row
    header = struct.pack(">IIBBBBB", width, height, 8, _PNG_COLOR_TYPES[channels], 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw)) + _chunk(b"IEND", b"")


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))
