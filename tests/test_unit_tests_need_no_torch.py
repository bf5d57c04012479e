"""The contract's and the service's unit tests run without PyTorch, as for a contributor without the training extra.

They use the shipped models (``models/``) instead of models trained by session fixtures. Here they run in
a child pytest whose ``import torch`` fails; the end-to-end tests that compare against PyTorch or export
tiny models are not among them.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT

UNIT_TESTS = [
    "tests/contract",
    "tests/service/test_classifier.py",
    "tests/service/test_runtime.py",
    "tests/service/test_registry.py",
    "tests/service/engine/test_scheduler.py",
    "tests/service/engine/test_batching.py",
    "tests/service/attention/test_attention.py",
    "tests/service/test_metrics.py",
    "tests/service/http/test_middleware.py",
]


def test_the_unit_tests_pass_with_torch_unimportable(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None  # import torch fails\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    probe = subprocess.run(
        [sys.executable, "-c", "import torch"], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    assert probe.returncode != 0 and "torch" in probe.stderr  # the block works
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *UNIT_TESTS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1]
