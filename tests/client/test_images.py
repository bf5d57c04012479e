"""Every image form the SDK accepts becomes one upload whose bytes decode to the same pixels.

Encoded files go as they are (the service decodes them exactly like its training images); pixels
(numpy arrays, PIL images) are written as lossless PNG, by the SDK's own encoder for arrays so
numpy alone is enough.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from attnserve_client._images import encode_png, uploads
from PIL import Image

from tests.service.service_testing import png_bytes

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("shape", [(5, 7), (5, 7, 1), (5, 7, 2), (5, 7, 3), (5, 7, 4)])
def test_arrays_become_lossless_pngs(shape):
    pixels = RNG.integers(0, 256, shape, dtype=np.uint8)
    decoded = np.asarray(Image.open(io.BytesIO(encode_png(pixels))))
    np.testing.assert_array_equal(decoded, pixels.reshape(decoded.shape))
    np.testing.assert_array_equal(decoded.reshape(pixels.shape), pixels)


def test_non_contiguous_arrays_encode_as_what_they_show():
    pixels = RNG.integers(0, 256, (8, 6, 3), dtype=np.uint8)[::2, ::-1]
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(encode_png(pixels)))), pixels)


def test_each_form_gives_one_upload(tmp_path):
    pixels = RNG.integers(0, 256, (6, 6), dtype=np.uint8)
    png = png_bytes(pixels)
    path = tmp_path / "cat.png"
    path.write_bytes(png)
    with open(path, "rb") as file:
        got = uploads(
            [
                path,
                str(path),
                png,
                bytearray(png),
                memoryview(png),
                file,
                io.BytesIO(png),
                Image.fromarray(pixels),
                pixels,
            ]
        )
    assert [name for name, _, _ in got[:2]] == ["cat.png", "cat.png"] and got[0][2] == "image/png"
    assert [content for _, content, _ in got[:7]] == [png] * 7  # encoded files are sent untouched
    for _, content, _ in got:
        np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(content))), pixels)


def test_a_single_image_a_list_and_a_batch_array():
    pixels = np.zeros((4, 4, 1), np.uint8)
    assert len(uploads(pixels)) == 1 and len(uploads((pixels, pixels))) == 2
    assert len(uploads(np.zeros((3, 4, 4, 1), np.uint8))) == 3  # (N, H, W, C)


@pytest.mark.parametrize(
    ("image", "raised", "match"),
    [
        (np.zeros((4, 4), np.float32), ValueError, "uint8"),
        (np.zeros((4, 4, 5), np.uint8), ValueError, "shape"),
        (io.StringIO("text"), TypeError, "binary mode"),
        (42, TypeError, "cannot send a int"),
        ([], ValueError, "no images"),
    ],
    ids=["float pixels", "five channels", "text file", "a number", "empty list"],
)
def test_what_cannot_be_an_image_is_refused_before_sending(image, raised, match):
    with pytest.raises(raised, match=match):
        uploads(image)
