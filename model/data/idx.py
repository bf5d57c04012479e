"""Reader for the IDX format (LeCun's MNIST format) that Fashion-MNIST ships in, gzipped or not."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


class IdxFormatError(ValueError):
    pass


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file: magic (0, 0, dtype code, ndim), ndim big-endian uint32 sizes, data."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _DTYPES:
        raise IdxFormatError(f"{path} is not an IDX file (bad magic number)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_DTYPES[raw[2]])
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - header != expected:
        raise IdxFormatError(f"{path}: header says {dims} but the payload has {len(raw) - header} bytes")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))
