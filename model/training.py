"""Helpers shared by the training CLIs: seeding, learning-rate schedules, checkpoints."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import torch

from model.cli import CliError


def seed_everything(seed: int) -> torch.Generator:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def warmup_cosine(step: int, warmup: int, total: int, floor: float = 0.01) -> float:
    """Multiplier of the base LR: linear warmup, then cosine decay down to ``floor``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def inverse_sqrt(step: int, warmup: int) -> float:
    """Multiplier of the base LR: linear warmup, then decay as 1/sqrt(step) (Vaswani et al.)."""
    step = step + 1
    return min(step / warmup, math.sqrt(warmup / step))


def save_checkpoint(path: Path, payload: dict) -> None:
    """Write atomically so an interrupted run never leaves a truncated checkpoint behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)


def load_checkpoint(path: Path) -> dict:
    if not Path(path).is_file():
        raise CliError(f"checkpoint {path} does not exist (train one first, e.g. 'make train')")
    return torch.load(path, map_location="cpu", weights_only=False)


def average_checkpoints(paths: list[Path]) -> dict[str, torch.Tensor]:
    """The element-wise mean of the ``state_dict`` of several checkpoints of one model (weight averaging).

    Floating-point tensors are averaged in float64 and cast back; others (integer buffers) are taken
    from the last checkpoint.
    """
    if not paths:
        raise ValueError("no checkpoints to average")
    states = [load_checkpoint(p)["state_dict"] for p in paths]
    if any(s.keys() != states[0].keys() for s in states):
        raise ValueError("the checkpoints do not hold the same parameters")
    out = {}
    for name, last in states[-1].items():
        if last.is_floating_point():
            out[name] = (sum(s[name].double() for s in states) / len(states)).to(last.dtype)
        else:
            out[name] = last.clone()
    return out
