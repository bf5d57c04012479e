"""The serving runtime carries no PyTorch: importing and building the app must not pull it in."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.service.service_testing import ROOT

PROBE = """
import json, sys
import service.process, service.__main__
service.process.create_app()
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {"torch", "torchvision", "model", "export", "onnx"})
print(json.dumps(heavy))
"""


def test_importing_the_service_pulls_in_no_torch_model_or_export():
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
