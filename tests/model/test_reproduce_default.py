"""The shipped ViT is reproducible: retraining with its recorded command lands within 0.5% of it.

Slow (about 40 minutes on 2 cores): run with `make test-all` or `pytest -m slow`.
"""

import json
import shlex
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_module

SHIPPED = ROOT / "models" / "vit" / "1" / "manifest.json"


@pytest.mark.slow
def test_retraining_reproduces_the_shipped_accuracy(tmp_path):
    manifest = json.loads(SHIPPED.read_text())
    args = shlex.split(manifest["training"]["command"])[3:]  # drop "python -m model.train_vit"
    args = [a for a in args if a not in ("--no-progress",)]
    if "--out" in args:
        i = args.index("--out")
        del args[i : i + 2]
    proc = run_module("model.train_vit", *args, "--out", str(tmp_path), "--no-progress", timeout=4 * 3600)
    assert proc.returncode == 0, proc.stderr
    retrained = json.loads((Path(tmp_path) / "metrics.json").read_text())["evaluation"]["test_accuracy"]
    shipped = manifest["evaluation"]["pytorch_test_accuracy"]
    assert abs(retrained - shipped) <= 0.005, (retrained, shipped)
