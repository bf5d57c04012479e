"""deploy/gpu_check.py: its verdicts on canned inputs, and a dry run (CPU against CPU) of every step
on the shipped models. The CUDA path itself needs an NVIDIA GPU and is not run here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

from deploy.gpu_check import CPU, CUDA, compare_outputs, provider_problems
from tests.deploy.parsing import ROOT


def test_provider_problems():
    ready = {"name": "vit", "version": "1", "status": "ready", "provider": CUDA}
    assert provider_problems([ready], CUDA) == []
    assert provider_problems([ready, {**ready, "name": "x", "status": "unsupported", "provider": None}], CUDA) == []
    assert provider_problems([{**ready, "provider": CPU}], CUDA) == [f"vit/1 runs on {CPU}, not {CUDA}"]
    assert "failed" in provider_problems([{**ready, "status": "failed", "reason": "no CUDA"}], CUDA)[0]
    assert provider_problems([], CUDA) == ["no model is loaded"]


def test_compare_outputs():
    logits = np.array([[1.0, 2.0, 0.5], [3.0, 0.0, 1.0]], dtype=np.float32)
    same = compare_outputs({"logits": logits}, {"logits": logits.copy()})
    assert same == {"max_abs_diff": {"logits": 0.0}, "top1_agreement": 1.0}
    flipped = logits.copy()
    flipped[0, 0] = 2.5
    r = compare_outputs({"logits": logits}, {"logits": flipped})
    assert r["max_abs_diff"]["logits"] == pytest.approx(1.5) and r["top1_agreement"] == 0.5


def run_check(tmp_path, *args: str) -> subprocess.CompletedProcess:
    # a `torch` that cannot be imported: the check and the services it starts must not need it
    fake = tmp_path / "no_torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('torch must not be imported by the serving path')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTNSERVE_")}
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(fake.parent), str(ROOT)]),
            # one onnxruntime thread and small batches: fast warm-up on a 2-core machine
            "ATTNSERVE_INTRA_OP_THREADS": "1",
            "ATTNSERVE_MAX_BATCH_SIZE": "8",
            "ATTNSERVE_MAX_IMAGES_PER_REQUEST": "8",
            "ATTNSERVE_MAX_RUNNING_SEQUENCES": "16",
            "ATTNSERVE_MAX_BEAM_SIZE": "4",
        }
    )
    return subprocess.run(
        [sys.executable, "-m", "deploy.gpu_check", "--repository", str(ROOT / "models"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_dry_run_on_the_cpu(tmp_path):
    """Every step of the check, with the CPU as the checked provider, on the shipped models."""
    out = tmp_path / "check.json"
    proc = run_check(
        tmp_path, "--provider", "cpu", "--seconds", "0.5", "--concurrency", "2", "--sentences", "4", "--json", str(out)
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["ok"] and all(c["ok"] for c in report["checks"])
    checks = {c["check"] for c in report["checks"]}
    assert {
        "vit/1 session provider",
        "GET /models on CPUExecutionProvider",
        "POST /classify cpu vs cpu",
        "greedy translations cpu vs cpu",
        "load cpu classify",
        "load cpu translate",
        "load cpu-reference translate",
    } <= checks
    assert {(m["name"], m["provider"]) for m in report["models"]} == {("vit", CPU), ("translator", CPU)}
    (vit,) = report["classifiers"]
    assert vit["max_abs_diff"]["logits"] == 0.0 and vit["top1_agreement"] == 1.0
    classify = report["classify"]
    assert len(classify["cpu"]) == 10 and classify["cpu"] == classify["cpu-reference"]  # the manifest's samples
    # the shipped ViT classifies its own real test samples: each sample file names its class
    assert [r[0]["index"] for r in classify["cpu"]] == list(range(10))
    translations = report["translations"]
    assert len(translations["texts"]) == 4 and all(translations["cpu"])
    assert translations["cpu"] == translations["cpu-reference"]
    throughput = report["throughput"]
    assert set(throughput) == {f"{s}/{e}" for s in ("cpu", "cpu-reference") for e in ("classify", "translate")}
    assert all(t["units_per_s"] > 0 and t["errors"] == 0 for t in throughput.values())
    assert "throughput: 2 concurrent clients" in proc.stdout and "GPU check: every check passed" in proc.stdout


@pytest.mark.skipif(CUDA in ort.get_available_providers(), reason="this onnxruntime offers CUDA")
def test_cuda_check_fails_without_cuda(tmp_path):
    proc = run_check(tmp_path, "--provider", "cuda")
    assert proc.returncode == 1
    assert f"[FAIL] provider offered: {CUDA} in" in proc.stdout and "GPU check: FAILED" in proc.stdout


def test_dry_run_compares_the_decoder_caches(tmp_path):
    """Step 6 on the CPU: the bare loop with the cache on the host and on the device decodes the same tokens,
    and a third service whose cache is on the device answers as the CPU reference does."""
    out = tmp_path / "check.json"
    proc = run_check(
        tmp_path,
        *("--provider", "cpu", "--seconds", "0.3", "--concurrency", "2", "--sentences", "4", "--json", str(out)),
        *("--decoder-cache", "host", "--extra-decoder-cache", "device", "--decoding-batches", "1,3"),
        *("--decoding-rounds", "1"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    checks = {c["check"] for c in report["checks"]}
    assert {"greedy translations cpu-device-cache vs cpu", "load cpu-device-cache translate"} <= checks
    assert report["translations"]["cpu-device-cache"] == report["translations"]["cpu-reference"]
    decoding = report["decoding"]
    assert [(d["model"], d["batch"], d["beam"]) for d in decoding] == [
        ("translator/3", b, k) for b in (1, 3) for k in (1, 4)
    ]
    assert all(d["host_tok_s"] > 0 and d["device_tok_s"] > 0 for d in decoding)
    assert "decoding translator/3 batch 3 beam 4: device cache vs host" in checks
