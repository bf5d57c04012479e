"""Train the Vision Transformer: ``python -m model.train_vit --profile default``.

Seeded and reproducible (same seed, data and thread count -> same weights); AdamW with warmup and
cosine decay; random-shift (+ optional flip) augmentation; optional label smoothing; the checkpoint
of the best validation epoch is kept and its test accuracy is measured once, at the end.
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from model.cli import CliError, run_cli
from model.data import load_image_dataset
from model.data.images import DATASETS, split_validation
from model.training import save_checkpoint, seed_everything, warmup_cosine
from model.vit import ViT, ViTConfig

# Each profile is a model config plus training hyper-parameters; flags override either.
PROFILES = {
    "tiny": {
        "config": ViTConfig(patch_size=7, dim=32, depth=2, heads=2, mlp_ratio=2.0),
        "epochs": 1,
        "batch_size": 64,
        "lr": 2e-3,
        "weight_decay": 0.05,
        "warmup_epochs": 0.1,
        "label_smoothing": 0.0,
        "max_train": 2000,
        "flip": False,
        "shift": 0,
        "precision": "fp32",
        "ema": 0.0,
    },
    "default": {
        "config": ViTConfig(patch_size=4, dim=96, depth=6, heads=4, mlp_ratio=2.0),
        "epochs": 60,
        "batch_size": 128,
        "lr": 2e-3,
        "weight_decay": 0.05,
        "warmup_epochs": 2.0,
        "label_smoothing": 0.1,
        "max_train": None,
        "flip": True,
        "shift": 2,
        "precision": "auto",
        "ema": 0.999,
    },
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m model.train_vit", description=__doc__.splitlines()[0])
    p.add_argument("--profile", choices=sorted(PROFILES), default="default")
    p.add_argument("--dataset", default="fashion-mnist", help=f"one of {', '.join(DATASETS)}")
    p.add_argument("--data-dir", type=Path, help="dataset location (IDX folder, image folder, ...)")
    p.add_argument("--image-size", type=int, default=28, help="image-folder only: images are resized to this")
    p.add_argument("--channels", type=int, choices=[1, 3], default=1, help="image-folder only: 1 (grey) or 3 (RGB)")
    p.add_argument("--out", type=Path, help="checkpoint folder (default: checkpoints/vit-<profile>)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (fixed for reproducibility)")
    p.add_argument("--val-fraction", type=float, default=0.1, help="held out of the training split")
    for name in ("epochs", "batch_size", "max_train", "shift"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int)
    for name in ("lr", "weight_decay", "warmup_epochs", "label_smoothing", "ema"):
        p.add_argument(f"--{name.replace('_', '-')}", type=float)
    p.add_argument("--flip", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument(
        "--precision",
        choices=["auto", "bf16", "fp32"],
        help="matmul precision of training steps (bf16 autocast; auto: bf16 where the CPU has it natively); "
        "weights, evaluation and export stay fp32",
    )
    p.add_argument("--max-steps", type=int, help="stop after this many optimiser steps (smoke tests)")
    for name in ("patch_size", "dim", "depth", "heads"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, help="model config override")
    p.add_argument("--mlp-ratio", type=float)
    p.add_argument("--dropout", type=float)
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def resolve_hparams(args: argparse.Namespace, image_size: int, channels: int, classes: int) -> dict:
    hp = dict(PROFILES[args.profile])
    for key in list(hp):
        if key != "config" and getattr(args, key, None) is not None:
            hp[key] = getattr(args, key)
    overrides = {k: getattr(args, k) for k in ("patch_size", "dim", "depth", "heads", "mlp_ratio", "dropout")}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    hp["config"] = replace(hp["config"], image_size=image_size, channels=channels, num_classes=classes, **overrides)
    if hp["epochs"] < 1 or hp["batch_size"] < 1 or hp["lr"] <= 0:
        raise CliError("epochs and batch-size must be >= 1 and lr > 0")
    if hp["precision"] == "auto":
        hp["precision"] = "bf16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "fp32"
    return hp


def augment(x: torch.Tensor, shift: int, flip: bool, gen: torch.Generator) -> torch.Tensor:
    """Random translation by up to ``shift`` pixels (zero padded) and random horizontal flip."""
    b, _c, h, w = x.shape
    if shift:
        padded = F.pad(x, (shift, shift, shift, shift))  # (B, C, H+2s, W+2s)
        dy = torch.randint(0, 2 * shift + 1, (b, 1), generator=gen)
        dx = torch.randint(0, 2 * shift + 1, (b, 1), generator=gen)
        rows = (dy + torch.arange(h))[:, :, None]  # (B, H, 1)
        cols = (dx + torch.arange(w))[:, None, :]  # (B, 1, W)
        x = padded[torch.arange(b)[:, None, None], :, rows, cols].permute(0, 3, 1, 2)  # (B, C, H, W)
    if flip:
        mask = torch.rand(b, generator=gen) < 0.5
        x = torch.where(mask[:, None, None, None], x.flip(-1), x)
    return x


def to_tensor(images: np.ndarray, mean: np.ndarray, std: np.ndarray) -> torch.Tensor:
    """uint8 (N, H, W, C) -> normalised float (N, C, H, W), exactly as the manifest describes."""
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0
    return (x - torch.from_numpy(mean)[:, None, None]) / torch.from_numpy(std)[:, None, None]


@torch.no_grad()
def evaluate(model: ViT, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000) -> tuple[float, float]:
    model.eval()
    correct, loss = 0, 0.0
    for i in range(0, len(x), batch_size):
        logits = model(x[i : i + batch_size])
        loss += F.cross_entropy(logits, y[i : i + batch_size], reduction="sum").item()
        correct += (logits.argmax(-1) == y[i : i + batch_size]).sum().item()
    return correct / len(x), loss / len(x)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    gen = seed_everything(args.seed)
    folder_options = (
        {"image_size": args.image_size, "channels": args.channels} if args.dataset == "image-folder" else {}
    )
    data = load_image_dataset(args.dataset, args.data_dir, **folder_options)
    hp = resolve_hparams(args, data.image_size, data.channels, len(data.label_names))
    cfg: ViTConfig = hp["config"]
    out = args.out or Path("checkpoints") / f"vit-{args.profile}"

    train_idx, val_idx = split_validation(len(data.train_labels), args.val_fraction, args.seed)
    if hp["max_train"]:
        train_idx = train_idx[: hp["max_train"]]
        val_idx = val_idx[: max(200, hp["max_train"] // 5)]
    pixels = data.train_images[train_idx].astype(np.float64) / 255.0
    mean = pixels.mean(axis=(0, 1, 2)).astype(np.float32)  # statistics of the training part only
    std = pixels.std(axis=(0, 1, 2)).astype(np.float32)
    x_train = to_tensor(data.train_images[train_idx], mean, std)
    y_train = torch.from_numpy(data.train_labels[train_idx])
    x_val = to_tensor(data.train_images[val_idx], mean, std)
    y_val = torch.from_numpy(data.train_labels[val_idx])

    model = ViT(cfg)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n and "token" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n and "token" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": hp["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=hp["lr"],
    )
    steps_per_epoch = (len(x_train) + hp["batch_size"] - 1) // hp["batch_size"]
    total_steps = steps_per_epoch * hp["epochs"]
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)
    warmup = max(1, int(hp["warmup_epochs"] * steps_per_epoch))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, warmup, total_steps))
    print(
        f"ViT {model.num_parameters():,} parameters | {args.dataset}: {len(x_train)} train, "
        f"{len(x_val)} val, {len(data.test_labels)} test | {hp['epochs']} epochs x {steps_per_epoch} steps | "
        f"{hp['precision']}",
        file=sys.stderr,
    )

    if not 0.0 <= hp["ema"] < 1.0:
        raise CliError("ema must be in [0, 1): 0 disables it, 0.999 averages over about 1000 steps")
    ema = copy.deepcopy(model) if hp["ema"] else None  # evaluated and saved instead of the raw weights
    history, best, step, start = [], None, 0, time.time()
    for epoch in range(hp["epochs"]):
        model.train()
        order = torch.randperm(len(x_train), generator=gen)
        bar = tqdm(
            range(steps_per_epoch), desc=f"epoch {epoch + 1}/{hp['epochs']}", disable=args.no_progress, leave=False
        )
        losses = []
        for i in bar:
            idx = order[i * hp["batch_size"] : (i + 1) * hp["batch_size"]]
            x = augment(x_train[idx], hp["shift"], hp["flip"], gen)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=hp["precision"] == "bf16"):
                logits = model(x)
            loss = F.cross_entropy(logits.float(), y_train[idx], label_smoothing=hp["label_smoothing"])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            if ema is not None:
                with torch.no_grad():
                    for averaged, current in zip(ema.parameters(), model.parameters()):
                        averaged.lerp_(current, 1.0 - hp["ema"])
            losses.append(loss.item())
            step += 1
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}", lr=f"{sched.get_last_lr()[0]:.2e}")
            if step >= total_steps:
                break
        val_acc, val_loss = evaluate(ema or model, x_val, y_val)
        record = {
            "epoch": epoch + 1,
            "train_loss": float(np.mean(losses)),
            "val_loss": val_loss,
            "val_accuracy": val_acc,
        }
        history.append(record)
        print(
            f"epoch {epoch + 1}: train loss {record['train_loss']:.4f} val loss {val_loss:.4f} val acc {val_acc:.4f}",
            file=sys.stderr,
        )
        if best is None or val_acc > best["val_accuracy"]:
            best = dict(record)
            save_checkpoint(out / "best.pt", {"state_dict": (ema or model).state_dict()})
        if step >= total_steps:
            break
    train_seconds = time.time() - start

    model.load_state_dict(torch.load(out / "best.pt", weights_only=True)["state_dict"])
    x_test = to_tensor(data.test_images, mean, std)
    test_acc, test_loss = evaluate(model, x_test, torch.from_numpy(data.test_labels))
    print(
        f"best epoch {best['epoch']} (val acc {best['val_accuracy']:.4f}): test accuracy {test_acc:.4f}",
        file=sys.stderr,
    )
    meta = {
        "task": "image-classification",
        "architecture": "ViT",
        "config": cfg.to_dict(),
        "label_names": data.label_names,
        "preprocessing": {
            "image_size": cfg.image_size,
            "channels": cfg.channels,
            "color_mode": "L" if cfg.channels == 1 else "RGB",
            "resize": "bilinear",
            "scale": 1 / 255,
            "mean": mean.tolist(),
            "std": std.tolist(),
        },
        "training": {
            "dataset": data.source,
            "train_examples": len(x_train),
            "val_examples": len(x_val),
            "seed": args.seed,
            "threads": args.threads,
            "profile": args.profile,
            "command": "python -m model.train_vit " + shlex.join(argv if argv is not None else sys.argv[1:]),
            "hyperparameters": {k: v for k, v in hp.items() if k != "config"},
            "steps": step,
            "training_seconds": round(train_seconds, 1),
            "best_epoch": best["epoch"],
            "val_accuracy": best["val_accuracy"],
            "history": history,
            "torch": torch.__version__,
        },
        "evaluation": {"test_accuracy": test_acc, "test_loss": test_loss, "test_examples": len(data.test_labels)},
    }
    save_checkpoint(out / "best.pt", {"state_dict": model.state_dict(), **meta})
    (out / "metrics.json").write_text(json.dumps(meta, indent=2))
    print(f"wrote {out / 'best.pt'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    run_cli(main)
