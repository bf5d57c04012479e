"""Image decoding: identical to the training conversion for every format and mode, and safe on hostile input."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from model.data.images import load_pil_image
from service.errors import ImageTooLarge, UndecodableImage
from service.images import ImageLimits, decode
from service.settings import DEFAULT_IMAGE_FORMATS

LIMITS = ImageLimits(max_bytes=1 << 20, max_pixels=4_000_000, formats=DEFAULT_IMAGE_FORMATS)


def photo(width: int = 40, height: int = 30, mode: str = "RGB") -> Image.Image:
    """A deterministic, asymmetric test picture (gradients plus a bright corner block)."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.stack([x * 255 // width, y * 255 // height, (x + y) * 127 // (width + height)], -1).astype(np.uint8)
    rgb[: height // 3, : width // 4] = 255
    rgb = np.clip(rgb.astype(int) + rng.integers(-8, 8, rgb.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(rgb, "RGB").convert(mode)


def encode(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    return buf.getvalue()


def training_pixels(data: bytes, tmp_path, size: int, mode: str) -> np.ndarray:
    path = tmp_path / "image"
    path.write_bytes(data)
    return load_pil_image(path, size, mode)


@pytest.mark.parametrize("color_mode", ["L", "RGB"])
@pytest.mark.parametrize(
    "fmt, source_mode, save_args",
    [
        ("PNG", "RGB", {}),
        ("PNG", "RGBA", {}),
        ("PNG", "L", {}),
        ("PNG", "LA", {}),
        ("PNG", "P", {}),
        ("PNG", "1", {}),
        ("PNG", "I;16", {}),
        ("JPEG", "RGB", {"quality": 90}),
        ("JPEG", "L", {}),
        ("JPEG", "CMYK", {}),
        ("WEBP", "RGB", {"lossless": True}),
        ("WEBP", "RGBA", {"quality": 80}),
        ("BMP", "RGB", {}),
        ("BMP", "P", {}),
        ("GIF", "P", {}),
        ("TIFF", "RGB", {}),
        ("TIFF", "F", {}),
    ],
)
def test_conversion_matches_training_for_every_format_and_mode(tmp_path, fmt, source_mode, save_args, color_mode):
    data = encode(photo(mode=source_mode), fmt, **save_args)
    got = decode(data, LIMITS, 28, color_mode)
    assert got.dtype == np.uint8 and got.shape == ((28, 28) if color_mode == "L" else (28, 28, 3))
    np.testing.assert_array_equal(got, training_pixels(data, tmp_path, 28, color_mode))


def test_exif_orientation_is_honoured(tmp_path):
    upright = photo(40, 30)
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: viewers turn it 90 degrees clockwise
    data = encode(upright.transpose(Image.Transpose.ROTATE_90), "JPEG", exif=exif.tobytes(), quality=95)
    got = decode(data, LIMITS, 28, "L")
    np.testing.assert_array_equal(got, training_pixels(data, tmp_path, 28, "L"))
    # the bright block sits top-left once the orientation is applied, as in the upright original
    assert got[:6, :4].mean() > 200 and got[-6:, -4:].mean() < got[:6, :4].mean()


def test_only_the_first_frame_of_an_animation_is_used():
    frames = [Image.new("L", (28, 28), 255), Image.new("L", (28, 28), 0)]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:])
    assert decode(buf.getvalue(), LIMITS, 28, "L").min() == 255


def test_images_of_the_model_size_are_not_resampled():
    pixels = photo(28, 28, "L")
    np.testing.assert_array_equal(decode(encode(pixels, "PNG"), LIMITS, 28, "L"), np.asarray(pixels))


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares ``width`` x ``height`` pixels and carries none: how a pixel bomb starts."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


@pytest.mark.parametrize(
    "data, error, fragment",
    [
        (b"x" * (LIMITS.max_bytes + 1), ImageTooLarge, "bytes"),
        (png_header(4000, 1001), ImageTooLarge, "pixels"),  # over our limit: refused before decoding
        (png_header(100_000, 100_000), ImageTooLarge, "decompression bomb"),  # over Pillow's own guard too
        (b"", UndecodableImage, "empty"),
        (b"definitely not an image", UndecodableImage, "accepted format"),
        (encode(photo(), "PNG")[:200], UndecodableImage, "cannot decode"),  # truncated
        (encode(photo(), "PPM"), UndecodableImage, "accepted format"),  # decodable by Pillow, not accepted
    ],
    ids=["bytes", "pixels", "bomb", "empty", "garbage", "truncated", "format-not-accepted"],
)
def test_hostile_or_broken_input_is_refused_with_the_right_error(data, error, fragment):
    with pytest.raises(error, match=fragment) as refused:
        decode(data, LIMITS, 28, "L")
    assert refused.value.status == (413 if error is ImageTooLarge else 400)
