"""The libspng fast path: taken only where its pixels cannot differ from Pillow's, and then identical."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from service import png
from service.errors import ImageTooLarge, UndecodableImage
from service.images import ImageLimits, decode, open_image, to_pixels
from service.settings import DEFAULT_IMAGE_FORMATS
from tests.service.test_image_decoding import encode, photo, training_pixels

LIMITS = ImageLimits(max_bytes=1 << 20, max_pixels=4_000_000, formats=DEFAULT_IMAGE_FORMATS)
pytestmark = pytest.mark.skipif(not png.available(), reason="pyspng is not installed")  # it is a dependency


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    out, pos = [], 8
    while pos < len(data):
        (length,) = struct.unpack_from(">I", data, pos)
        out.append((data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]))
        pos += 12 + length
    return out


def assemble(parts: list[tuple[bytes, bytes]]) -> bytes:
    return png.SIGNATURE + b"".join(chunk(kind, body) for kind, body in parts)


def insert(data: bytes, kind: bytes, body: bytes, before: bytes = b"IDAT") -> bytes:
    parts = chunks(data)
    at = next(i for i, (k, _) in enumerate(parts) if k == before)
    return assemble(parts[:at] + [(kind, body)] + parts[at:])


def interlaced(pixels: np.ndarray) -> bytes:
    """An Adam7-interlaced PNG of uint8 (H, W) or (H, W, 3) pixels (Pillow writes none), rows unfiltered."""
    h, w = pixels.shape[:2]
    color = 0 if pixels.ndim == 2 else 2
    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]
    raw = b""
    for x0, y0, dx, dy in passes:
        sub = pixels[y0::dy, x0::dx]
        if sub.size:
            raw += b"".join(b"\x00" + row.tobytes() for row in sub)
    ihdr = struct.pack(">IIBBBBB", w, h, 8, color, 0, 0, 1)
    return assemble([(b"IHDR", ihdr), (b"IDAT", zlib.compress(raw)), (b"IEND", b"")])


def pillow_pixels(data: bytes, size: int = 28, mode: str = "L") -> np.ndarray:
    return to_pixels(open_image(data, LIMITS), size, mode)


def fast_and_identical(data: bytes, tmp_path, mode: str = "L") -> np.ndarray:
    assert png.plain(data, 28, mode)
    fast = png.decode(data, 28, mode)
    assert fast is not None and fast.dtype == np.uint8
    np.testing.assert_array_equal(fast, pillow_pixels(data, 28, mode))
    np.testing.assert_array_equal(fast, training_pixels(data, tmp_path, 28, mode))
    np.testing.assert_array_equal(decode(data, LIMITS, 28, mode), fast)
    return fast


def test_real_fashion_mnist_pngs_take_the_fast_path_with_pillows_pixels(fashion_pngs, fashion_test, tmp_path):
    images, _ = fashion_test
    for data, image in zip(fashion_pngs[:16], images):
        np.testing.assert_array_equal(fast_and_identical(data, tmp_path), image[..., 0])


@pytest.mark.parametrize("mode", ["L", "RGB"])
@pytest.mark.parametrize(
    "save_args",
    [{"compress_level": 0}, {"compress_level": 1}, {"compress_level": 9}, {"optimize": True}, {"dpi": (300, 300)}],
)
def test_every_encoding_of_the_models_mode_and_size_is_identical(tmp_path, mode, save_args):
    fast_and_identical(encode(photo(28, 28, mode), "PNG", **save_args), tmp_path, mode)


@pytest.mark.parametrize("mode", ["L", "RGB"])
def test_interlaced_pngs_are_identical(tmp_path, mode):
    pixels = np.asarray(photo(28, 28, mode))
    np.testing.assert_array_equal(fast_and_identical(interlaced(pixels), tmp_path, mode), pixels)


@pytest.mark.parametrize(
    "kind, body",
    [
        (b"gAMA", struct.pack(">I", 45455)),
        (b"sRGB", b"\x00"),
        (b"pHYs", struct.pack(">IIB", 2835, 2835, 1)),
        (b"sBIT", b"\x05"),
    ],
)
def test_chunks_pillow_does_not_apply_keep_the_fast_path(tmp_path, kind, body):
    fast_and_identical(insert(encode(photo(28, 28, "L"), "PNG"), kind, body), tmp_path)


def exif_png(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(photo(28, 28, "L").transpose(Image.Transpose.ROTATE_90), "PNG", exif=exif.tobytes())


@pytest.mark.parametrize(
    "data, mode",
    [
        (encode(photo(28, 28, "L"), "PNG"), "RGB"),  # greyscale for an RGB model: Pillow converts
        (encode(photo(28, 28, "RGB"), "PNG"), "L"),
        (encode(photo(28, 28, "RGBA"), "PNG"), "RGB"),
        (encode(photo(28, 28, "LA"), "PNG"), "L"),
        (encode(photo(28, 28, "P"), "PNG"), "L"),  # palette
        (encode(photo(28, 28, "I;16"), "PNG"), "L"),  # 16-bit
        (encode(photo(28, 28, "1"), "PNG"), "L"),  # 1-bit
        (encode(photo(30, 28, "L"), "PNG"), "L"),  # resized by Pillow
        (encode(photo(28, 28, "L"), "PNG", transparency=0), "L"),  # tRNS
        (exif_png(6), "L"),  # eXIf: orientation
        (insert(encode(photo(28, 28, "L"), "PNG"), b"tEXt", b"Comment\x00hello"), "L"),  # text may carry EXIF
        (insert(encode(photo(28, 28, "L"), "PNG"), b"prVt", b"data"), "L"),  # unknown chunk
        (encode(photo(28, 28, "L"), "GIF"), "L"),
    ],
    ids=[
        "L-for-RGB",
        "RGB-for-L",
        "RGBA",
        "LA",
        "palette",
        "16-bit",
        "1-bit",
        "other-size",
        "tRNS",
        "eXIf",
        "tEXt",
        "private-chunk",
        "gif",
    ],
)
def test_files_whose_pixels_pillow_changes_go_through_pillow(tmp_path, data, mode):
    assert not png.plain(data, 28, mode) and png.decode(data, 28, mode) is None
    np.testing.assert_array_equal(decode(data, LIMITS, 28, mode), training_pixels(data, tmp_path, 28, mode))


def test_exif_orientation_in_a_png_is_still_honoured():
    upright = np.asarray(photo(28, 28, "L"))
    np.testing.assert_array_equal(decode(exif_png(6), LIMITS, 28, "L"), upright)


def broken_crc(data: bytes, kind: bytes) -> bytes:
    parts, pos = chunks(data), 8
    for k, body in parts:
        if k == kind:
            end = pos + 8 + len(body)
            return data[:end] + bytes(b ^ 0xFF for b in data[end : end + 4]) + data[end + 4 :]
        pos += 12 + len(body)
    raise AssertionError(kind)


def test_a_bad_checksum_pillow_checks_is_pillows_400():
    data = broken_crc(insert(encode(photo(28, 28, "L"), "PNG"), b"gAMA", struct.pack(">I", 45455)), b"gAMA")
    assert not png.plain(data, 28, "L")
    with pytest.raises(UndecodableImage):  # Pillow refuses to identify it
        decode(data, LIMITS, 28, "L")


def test_a_bad_image_data_checksum_is_ignored_as_pillow_ignores_it(tmp_path):
    fast_and_identical(broken_crc(encode(photo(28, 28, "L"), "PNG"), b"IDAT"), tmp_path)


def outcome(data: bytes) -> np.ndarray | str:
    try:
        return decode(data, LIMITS, 28, "L")
    except UndecodableImage as e:
        return e.message


@pytest.mark.parametrize("damage", ["garbage-idat", "short-idat", "truncated", "no-iend"])
def test_broken_files_get_exactly_pillows_outcome(monkeypatch, damage):
    good = encode(photo(28, 28, "L"), "PNG", compress_level=0)
    parts = chunks(good)
    if damage == "garbage-idat":
        data = assemble([(k, b"\x78\x9c" + b"\xff" * 40 if k == b"IDAT" else b) for k, b in parts])
    elif damage == "short-idat":
        data = assemble([(k, zlib.compress(b"\x00" * 29 * 10) if k == b"IDAT" else b) for k, b in parts])
    elif damage == "truncated":
        data = good[: len(good) // 2]
    else:
        data = assemble(parts[:-1])
    assert png.decode(data, 28, "L") is None
    got = outcome(data)
    monkeypatch.setattr(png, "pyspng", None)
    expected = outcome(data)  # Pillow alone: an error for some, pixels for others (it forgives a missing IEND)
    assert type(got) is type(expected)
    if isinstance(expected, str):
        assert got == expected
    else:
        np.testing.assert_array_equal(got, expected)
    if damage in ("garbage-idat", "truncated"):
        assert isinstance(got, str) and "cannot decode" in got


def test_limits_still_apply_first():
    data = encode(photo(28, 28, "L"), "PNG")
    with pytest.raises(ImageTooLarge, match="bytes"):
        decode(data, ImageLimits(len(data) - 1, LIMITS.max_pixels, LIMITS.formats), 28, "L")
    with pytest.raises(UndecodableImage, match="accepted format"):
        decode(data, ImageLimits(LIMITS.max_bytes, LIMITS.max_pixels, ("JPEG",)), 28, "L")


def test_without_pyspng_pillow_decodes_everything(monkeypatch, fashion_pngs, fashion_test):
    monkeypatch.setattr(png, "pyspng", None)
    assert not png.available() and png.decode(fashion_pngs[0], 28, "L") is None
    np.testing.assert_array_equal(decode(fashion_pngs[0], LIMITS, 28, "L"), fashion_test[0][0][..., 0])
