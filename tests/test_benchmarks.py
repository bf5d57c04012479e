"""The benchmarks run end to end on the tiny models (smoke tests: no figure is asserted)."""

from __future__ import annotations

import re

from tests.conftest import run_module


def test_bench_translate_runs_and_prints_its_table(tiny_translator_repository, tiny_translator_checkpoint):
    proc = run_module(
        "benchmarks.bench_translate",
        "--repository",
        str(tiny_translator_repository),
        "--rounds",
        "1",
        "--checkpoint",
        str(tiny_translator_checkpoint),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    for row in (
        "cached vs uncached decoding",
        "bare loop, batch 16, beam 4, 64 tokens",
        "PyTorch eager",
        "continuous vs static batching",
        "time to first streamed token",
        "batch 32 vs one at a time",
        "arriving 10 ms apart",
        "bare loop vs CTranslate2, batch 16, beam 4, 64 tokens",
    ):
        assert row in proc.stdout
    assert re.search(r"greedy translations identical\s+32/32 sentences", proc.stdout)  # CTranslate2 decodes our model


def test_bench_attention_runs_and_prints_its_table(tiny_vit_repository, tiny_translator_repository, tmp_path):
    import shutil

    repo = tmp_path / "models"
    shutil.copytree(tiny_vit_repository / "vit", repo / "vit")
    shutil.copytree(tiny_translator_repository / "translator", repo / "translator")
    proc = run_module(
        "benchmarks.bench_attention",
        "--repository",
        str(repo),
        "--rounds",
        "1",
        "--seconds",
        "1",
        "--clients",
        "4",
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    for row in (
        "classify no-attention",
        "classify shipped, return_attention",
        "translate shipped",
        "target: classify without attention >= 0.97",
        "target: translate without attention >= 0.97",
    ):
        assert row in proc.stdout


def test_bench_classify_runs_and_judges_every_target(tiny_vit_repository):
    proc = run_module(
        "benchmarks.bench_classify",
        "--repository",
        str(tiny_vit_repository),
        "--rounds",
        "1",
        "--duration",
        "1",
        "--clients",
        "1",
        "4",
        "--multi-images",
        "4",
        "--multi-clients",
        "2",
        "--bare-seconds",
        "0.2",
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"round 1/1: bare onnxruntime best \d+ img/s", proc.stdout)
    for line in (
        "(1) 4 single-image clients:",
        "(2) 4 images/request",
        "(3) batched vs unbatched by clients",
        "(4) 1 client p50",
        "targets (1) and (2) are judged against the higher",
    ):
        assert line in proc.stdout


def test_bench_classify_alternates_which_service_goes_first():
    from benchmarks.bench_classify import Run, in_round_order

    runs = [Run(name, c, 1) for c in (1, 8) for name in ("batched", "unbatched")] + [Run("batched", 8, 16)]
    order = lambda r: [(x.service, x.clients, x.images_per_request) for x in in_round_order(runs, r)]
    assert order(0) == order(2) == [(r.service, r.clients, r.images_per_request) for r in runs]
    assert order(1) == [
        ("unbatched", 1, 1),
        ("batched", 1, 1),
        ("unbatched", 8, 1),
        ("batched", 8, 1),
        ("batched", 8, 16),
    ]
