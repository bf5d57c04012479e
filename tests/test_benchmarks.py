"""The translation benchmark runs end to end on the tiny translator (a smoke test: no figure is asserted)."""

from __future__ import annotations

from tests.conftest import run_module


def test_bench_translate_runs_and_prints_its_table(tiny_translator_repository, tiny_translator_checkpoint):
    proc = run_module("benchmarks.bench_translate", "--repository", str(tiny_translator_repository), "--rounds", "1",
                      "--checkpoint", str(tiny_translator_checkpoint), timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for row in ("cached vs uncached decoding", "bare loop, batch 16, beam 4, 64 tokens", "PyTorch eager",
                "continuous vs static batching", "time to first streamed token"):
        assert row in proc.stdout
