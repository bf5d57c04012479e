"""Write real test images as PNG files, for curl examples and manual checks (no torch needed).

``python -m model.data.sample --index 0 --out ankle_boot.png`` writes Fashion-MNIST test image 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from PIL import Image

from model.data.images import DatasetError, load_fashion_mnist


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m model.data.sample", description=__doc__.splitlines()[0])
    p.add_argument("--index", type=int, nargs="+", default=[0], help="test-split indices")
    p.add_argument("--out", type=Path, required=True, help="a .png path (one index) or a folder")
    p.add_argument("--data-dir", type=Path)
    args = p.parse_args(argv)
    try:
        data = load_fashion_mnist(args.data_dir)
        for i in args.index:
            if not 0 <= i < len(data.test_labels):
                raise DatasetError(f"index {i} is outside the test split (0..{len(data.test_labels) - 1})")
            label = data.label_names[data.test_labels[i]]
            path = args.out if args.out.suffix == ".png" and len(args.index) == 1 else args.out / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(data.test_images[i, :, :, 0]).save(path)
            print(f"{path}\t{label}")
    except DatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
