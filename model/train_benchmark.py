"""``python -m model.train_translator --benchmark STEPS``: training throughput and where a step's time goes.

After a few warm-up steps (allocator, autotuning, compilation), two passes of STEPS steps each over
the first epoch's batches of the real corpus:

- **throughput**: the loop as training runs it (the batches padded and moved to the device first,
  no wait inside a step, the losses read once at the end); tokens per second by the wall clock.
- **split**: the same kind of steps with the device drained between phases, so each phase's time
  is its own: ``data`` (padding a batch and copying it to the device), ``forward`` (with the loss),
  ``backward``, ``optimiser`` (clipping, AdamW, schedule) and ``host sync`` (reading the loss back,
  as a loop that prints every step would). On a GPU draining costs the overlap the first pass has,
  so the split's steps are slower than the throughput pass's: the gap is what asynchrony buys.

The caller adds the end-of-epoch work (validation loss and greedy BLEU) in seconds.
"""

from __future__ import annotations

import sys
import time

import torch

from model.seq2seq import Seq2Seq
from model.step_clock import Clock
from model.train_translator import train_step
from model.translation.batching import Example, device_batches

PHASES = ("data", "forward", "backward", "optimiser", "host sync")


def _tokens(batches: list[list[Example]]) -> tuple[int, int]:
    """(real source + target tokens, padded positions) of some batches."""
    real = sum(len(ex.src) + len(ex.tgt) for b in batches for ex in b)
    padded = sum(len(b) * (max(len(ex.src) for ex in b) + max(len(ex.tgt) for ex in b)) for b in batches)
    return real, padded


def benchmark(
    model: Seq2Seq,
    forward,
    opt: torch.optim.Optimizer,
    sched,
    batches: list[list[Example]],
    hp: dict,
    steps: int,
    device: torch.device,
    warmup: int = 3,
) -> dict:
    needed = warmup + 2 * steps
    batches = (batches * (needed // len(batches) + 1))[:needed]  # a tiny corpus goes round again
    pad, clock = model.cfg.pad_id, Clock(device)
    model.train()
    for batch in device_batches(batches[:warmup], pad, device):
        train_step(model, forward, opt, sched, batch, hp)
    clock.sync()

    timed = batches[warmup : warmup + steps]
    start = time.perf_counter()
    losses = [train_step(model, forward, opt, sched, b, hp) for b in device_batches(timed, pad, device)]
    torch.stack(losses).sum().item()
    seconds = time.perf_counter() - start
    real, padded = _tokens(timed)

    split = batches[warmup + steps :]
    for batch in split:
        with clock("data"):
            ready = device_batches([batch], pad, device)[0]
        loss = train_step(model, forward, opt, sched, ready, hp, clock)
        with clock("host sync"):
            loss.item()
    split_seconds = sum(clock.seconds.values())
    split_real, _ = _tokens(split)
    report = {
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "steps": steps,
        "max_tokens": hp["max_tokens"],
        "precision": hp["precision"],
        "compiled": forward is not model,
        "threads": torch.get_num_threads(),
        "steps_per_second": round(steps / seconds, 3),
        "tokens_per_second": round(real / seconds),  # real source + target tokens
        "padded_tokens_per_second": round(padded / seconds),
        "budget_tokens_per_second": round(steps * hp["max_tokens"] / seconds),  # steps/s x --max-tokens
        "split_tokens_per_second": round(split_real / split_seconds),
        "split": {p: round(clock.seconds[p] / split_seconds, 3) for p in PHASES},
        "split_ms_per_step": {p: round(1000 * clock.seconds[p] / steps, 2) for p in PHASES},
    }
    print(
        f"{steps} steps of {hp['max_tokens']} tokens on {report['device']} ({hp['precision']}"
        f"{', compiled' if report['compiled'] else ''}): {report['tokens_per_second']:,} tokens/s "
        f"({report['steps_per_second']} steps/s); split: "
        + ", ".join(f"{p} {100 * f:.1f}%" for p, f in report["split"].items()),
        file=sys.stderr,
    )
    return report
