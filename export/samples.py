"""A classifier entry's sample images: a few real test images the service offers to try the model.

``python -m export.samples --repository models --name vit --version 1`` adds them to an existing
entry (the export writes them into new ones): the first test image of each class, as PNG files
beside the graph, listed in the manifest (``samples``) and sha256-checked like every other file.
They are the model's input size (28 x 28 for Fashion-MNIST), a few hundred bytes each.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from contract.manifest import describe_files, read_manifest, write_manifest
from model.cli import CliError, run_cli
from model.data import load_image_dataset

DEFAULT_COUNT = 10


def pick(labels: np.ndarray, count: int) -> list[int]:
    """Indices of the first example of each class, in class order, then more in test order, ``count`` in all."""
    first = [int(np.flatnonzero(labels == c)[0]) for c in np.unique(labels)]
    rest = [i for i in range(len(labels)) if i not in set(first)]
    return (first + rest)[:count]


def write_samples(
    entry_dir: Path, images: np.ndarray, labels: np.ndarray, names: list[str], count: int = DEFAULT_COUNT
) -> list[dict]:
    """Write the PNGs into ``entry_dir``; returns the manifest's ``samples`` section."""
    samples = []
    for n, i in enumerate(pick(labels, count)):
        label = names[int(labels[i])]
        file = f"sample-{n}-{re.sub(r'[^a-z0-9]+', '-', label.lower()).strip('-')}.png"
        pixels = images[i][..., 0] if images.shape[-1] == 1 else images[i]
        Image.fromarray(pixels).save(entry_dir / file, optimize=True)
        samples.append({"file": file, "label": label, "index": int(labels[i]), "test_index": int(i)})
    return samples


def add_to_entry(entry_dir: Path, images: np.ndarray, labels: np.ndarray, count: int = DEFAULT_COUNT) -> list[dict]:
    manifest = read_manifest(entry_dir)
    for old in manifest.get("samples", []):
        (entry_dir / old["file"]).unlink(missing_ok=True)
        manifest["files"].pop(old["file"], None)
    samples = write_samples(entry_dir, images, labels, manifest["labels"], count)
    manifest["samples"] = samples
    manifest["files"] = {**manifest["files"], **describe_files(entry_dir, [s["file"] for s in samples])}
    write_manifest(entry_dir, manifest)
    return samples


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m export.samples", description=__doc__.split("\n\n")[0])
    p.add_argument("--repository", type=Path, default=Path("models"))
    p.add_argument("--name", default="vit")
    p.add_argument("--version", default="1")
    p.add_argument("--count", type=int, default=DEFAULT_COUNT)
    p.add_argument("--data-dir", type=Path, default=None)
    args = p.parse_args(argv)
    entry = args.repository / args.name / args.version
    if not (entry / "manifest.json").is_file():
        raise CliError(f"{entry} is not a model-repository entry (no manifest.json)")
    manifest = read_manifest(entry)
    dataset = manifest.get("evaluation", {}).get("dataset")
    if not dataset or manifest.get("task") != "image-classification":
        raise CliError(f"{entry} is not an image classifier evaluated on a known dataset")
    data = load_image_dataset(dataset, args.data_dir)
    samples = add_to_entry(entry, data.test_images, data.test_labels, args.count)
    print(f"wrote {len(samples)} samples into {entry}: {', '.join(s['label'] for s in samples)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_cli(main)
