"""The translation benchmark runs end to end on the tiny translator (a smoke test: no figure is asserted)."""

from __future__ import annotations

import re

from tests.conftest import run_module


def test_bench_translate_runs_and_prints_its_table(tiny_translator_repository, tiny_translator_checkpoint):
    proc = run_module("benchmarks.bench_translate", "--repository", str(tiny_translator_repository), "--rounds", "1",
                      "--checkpoint", str(tiny_translator_checkpoint), timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for row in ("cached vs uncached decoding", "bare loop, batch 16, beam 4, 64 tokens", "PyTorch eager",
                "continuous vs static batching", "time to first streamed token", "batch 32 vs one at a time",
                "arriving 10 ms apart",
                "bare loop vs CTranslate2, batch 16, beam 4, 64 tokens"):
        assert row in proc.stdout
    assert re.search(r"greedy translations identical\s+32/32 sentences", proc.stdout)  # CTranslate2 decodes our model


def test_bench_attention_runs_and_prints_its_table(tiny_vit_repository, tiny_translator_repository, tmp_path):
    import shutil

    repo = tmp_path / "models"
    shutil.copytree(tiny_vit_repository / "vit", repo / "vit")
    shutil.copytree(tiny_translator_repository / "translator", repo / "translator")
    proc = run_module("benchmarks.bench_attention", "--repository", str(repo), "--rounds", "1", "--seconds", "1",
                      "--clients", "4", timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for row in ("classify no-attention", "classify shipped, return_attention", "translate shipped",
                "target: classify without attention >= 0.97", "target: translate without attention >= 0.97"):
        assert row in proc.stdout
