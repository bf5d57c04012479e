"""Train the English->German encoder-decoder Transformer: ``python -m model.train_translator``.

Reads ``train.tsv``/``valid.tsv`` and the SentencePiece model of a corpus folder (built by
``python -m model.translation.corpus`` then ``python -m model.translation.tokenizer``), trains with
label-smoothed cross-entropy, AdamW and an inverse-square-root warmup schedule on batches made by
token budget with length bucketing, keeps the checkpoint with the best validation loss
(``best.pt``) and a resumable one (``last.pt``: weights, optimiser, RNG and position in the epoch),
and writes ``metrics.json``. ``--resume`` continues an interrupted or finished run where it stopped;
``--time-limit`` ends a run cleanly after so many minutes. ``--init-from models/translator/N`` starts
from a shipped entry's weights (read from its ONNX graphs), config and tokenizer instead of at random:
fine-tuning on a widened corpus without the checkpoint the entry came from. ``--oversample ding=3``
repeats the training pairs of one source domain (``train.domains``, written by the corpus builder)
so many times each epoch: the weight of a small domain the model serves badly.

For a GPU, where the time goes to Python and small kernels rather than arithmetic (docs/training/
translator.md): ``--arrays FILE`` reads a pre-tokenised corpus (``model.translation.arrays``),
``--batch-scale K`` trains on K times larger batches with the learning rate scaled by sqrt(K) and the
warmup shortened K times, ``--compile`` runs the training forward through ``torch.compile``,
``--bleu-every N`` decodes the validation sentences every N epochs only, and ``--benchmark STEPS``
prints tokens per second and where a step's time goes instead of training. Each epoch's batches are
padded and moved to the device before its first step, and a step never waits for the device (the
losses are read every 20 steps); on CUDA AdamW runs fused and bf16 autocast is the default.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import sacrebleu
import torch
import torch.nn.functional as F
from tqdm import tqdm

from contract.tokenizer import Tokenizer, TokenizerError
from model.cli import CliError, run_cli
from model.seq2seq import Seq2Seq, Seq2SeqConfig, greedy_decode
from model.step_clock import NO_CLOCK, Clock
from model.training import inverse_sqrt, load_checkpoint, save_checkpoint, seed_everything
from model.translation.arrays import CorpusArrays, load_arrays
from model.translation.batching import Batch, Example, device_batches, encode_pairs, make_batches, pad_batch
from model.translation.textio import TextFileError, read_tsv

PROFILES = {
    "tiny": {
        "config": Seq2SeqConfig(dim=32, encoder_layers=1, decoder_layers=1, heads=2, ffn_dim=64, dropout=0.0),
        "epochs": 1,
        "max_tokens": 1024,
        "lr": 3e-3,
        "warmup_steps": 20,
        "label_smoothing": 0.0,
        "max_train": 400,
        "max_length": 64,
        "precision": "fp32",
    },
    "default": {
        # measured on one GPU (docs/training/translator.md): a fifth encoder layer lowered the validation
        # loss at equal time (2.020 against 2.038 after 16 minutes) and costs no decoding step
        "config": Seq2SeqConfig(dim=256, encoder_layers=5, decoder_layers=2, heads=4, ffn_dim=1024, dropout=0.1),
        # 12k-token batches reach a lower validation loss per second than 4k ones (2.12 after 36 epochs
        # in 433 s against 2.23 after 17 in 421 s); translator/3 trained 77 epochs
        "epochs": 77,
        "max_tokens": 12288,
        "lr": 1.5e-3,
        "warmup_steps": 300,
        "label_smoothing": 0.1,
        "max_train": None,
        "max_length": 128,
        "precision": "auto",
    },
}
PROFILES["wide"] = {
    **PROFILES["default"],
    # the GPU job's size (docs/training/translator.md): 20.8M parameters, 2.6x translator/3's, fit in
    # fp16 what one GPU run can send back; decoding on the CPU measured about 2.2x translator/3's per token
    "config": Seq2SeqConfig(dim=384, encoder_layers=6, decoder_layers=3, heads=6, ffn_dim=1536, dropout=0.1),
    "epochs": 1000,  # the job's --minutes ends it
}
HPARAMS = ("epochs", "max_tokens", "lr", "warmup_steps", "label_smoothing", "max_train", "max_length", "precision")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m model.train_translator", description=__doc__.splitlines()[0])
    p.add_argument("--profile", choices=sorted(PROFILES), default="default")
    p.add_argument("--data", type=Path, default=Path("data/translation"), help="corpus folder (default: %(default)s)")
    p.add_argument(
        "--arrays", type=Path, help="a pre-tokenised corpus (.npz) to read instead of --data and its tokenizer"
    )
    p.add_argument("--tokenizer", type=Path, help="SentencePiece model (default: <data>/spm/spm.model)")
    p.add_argument("--out", type=Path, help="checkpoint folder (default: checkpoints/translator-<profile>)")
    p.add_argument("--resume", action="store_true", help="continue from <out>/last.pt")
    p.add_argument(
        "--init-from",
        type=Path,
        metavar="ENTRY",
        help="start from a translator entry of the model repository (its weights, config and tokenizer)",
    )
    p.add_argument(
        "--time-limit", type=float, help="stop this run cleanly after so many minutes (resume with --resume)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: %(default)s)")
    for name in ("epochs", "max_tokens", "warmup_steps", "max_train", "max_length"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int)
    for name in ("lr", "label_smoothing"):
        p.add_argument(f"--{name.replace('_', '-')}", type=float)
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], help="bf16 autocast (auto: where the CPU has it)")
    for name in ("dim", "encoder_layers", "decoder_layers", "heads", "ffn_dim"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, help="model config override")
    p.add_argument("--dropout", type=float)
    p.add_argument("--norm", choices=["pre", "post"])
    p.add_argument(
        "--oversample",
        action="append",
        default=[],
        metavar="DOMAIN=N",
        help="repeat the training pairs of a source domain N times per epoch (repeatable)",
    )
    p.add_argument("--bleu-sentences", type=int, default=300, help="validation sentences decoded each epoch")
    p.add_argument("--bleu-every", type=int, default=1, metavar="N", help="decode them every N epochs (and the last)")
    p.add_argument(
        "--batch-scale",
        type=float,
        default=1.0,
        metavar="K",
        help="K times the batch's tokens, sqrt(K) times the learning rate, warmup K times shorter",
    )
    p.add_argument("--compile", action="store_true", help="run the training forward through torch.compile")
    p.add_argument("--benchmark", type=int, metavar="STEPS", help="time so many steps, print tokens/s and the split")
    p.add_argument("--keep-epochs", type=int, default=8, help="weights of the last N epochs kept for averaging")
    p.add_argument("--max-steps", type=int, help="stop after this many optimiser steps (smoke tests)")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def resolve_device(name: str) -> torch.device:
    try:
        device = torch.device(name)
        torch.empty(1, device=device)
    except (RuntimeError, AssertionError) as e:
        raise CliError(f"device {name!r} is not usable here: {e}") from None
    return device


def resolve_hparams(args: argparse.Namespace, vocab_size: int) -> dict:
    hp = dict(PROFILES[args.profile])
    for key in HPARAMS:
        if getattr(args, key, None) is not None:
            hp[key] = getattr(args, key)
    overrides = {
        k: getattr(args, k) for k in ("dim", "encoder_layers", "decoder_layers", "heads", "ffn_dim", "dropout", "norm")
    }
    try:
        hp["config"] = replace(
            hp["config"], vocab_size=vocab_size, **{k: v for k, v in overrides.items() if v is not None}
        )
    except ValueError as e:
        raise CliError(f"bad model configuration: {e}") from None
    if args.batch_scale <= 0 or args.bleu_every < 1:
        raise CliError("need batch-scale > 0 and bleu-every >= 1")
    if args.batch_scale != 1:  # the square-root rule for Adam: the same noise per token, warmup over as many tokens
        k = args.batch_scale
        hp["max_tokens"], hp["lr"] = round(hp["max_tokens"] * k), hp["lr"] * math.sqrt(k)
        hp["warmup_steps"] = max(1, round(hp["warmup_steps"] / k))
    if hp["epochs"] < 1 or hp["max_tokens"] < hp["max_length"] or hp["lr"] <= 0 or hp["warmup_steps"] < 1:
        raise CliError("need epochs >= 1, max-tokens >= max-length, lr > 0 and warmup-steps >= 1")
    if hp["precision"] == "auto":
        if torch.device(args.device).type == "cuda":
            hp["precision"] = "bf16" if torch.cuda.is_bf16_supported() else "fp32"
        else:
            hp["precision"] = "bf16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "fp32"
    return hp


def load_split(data: Path, split: str) -> list[tuple[str, str]]:
    try:
        pairs, bad = read_tsv(data / f"{split}.tsv")
    except TextFileError as e:
        raise CliError(f"{e} (build the corpus first: python -m model.translation.corpus --out {data})") from None
    if bad.total:
        print(f"{split}.tsv: skipped {bad.summary()}", file=sys.stderr)
    if not pairs:
        raise CliError(f"{data / f'{split}.tsv'} holds no sentence pairs")
    return pairs


def parse_oversample(specs: list[str]) -> dict[str, int]:
    factors = {}
    for spec in specs:
        domain, _, times = spec.partition("=")
        if not domain or not times.isdigit() or int(times) < 1:
            raise CliError(f"--oversample {spec!r}: expected DOMAIN=N with N >= 1, e.g. ding=3")
        factors[domain] = int(times)
    return factors


def oversample(data: Path, pairs: list[tuple[str, str]], factors: dict[str, int]) -> list[tuple[str, str]]:
    """``pairs`` with those of each domain in ``factors`` repeated so many times (in corpus order)."""
    if not factors:
        return pairs
    path = data / "train.domains"
    try:
        domains = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise CliError(f"--oversample needs {path}: {e.strerror}") from None
    return repeat_domains(pairs, domains, factors, str(path))


def repeat_domains(items: list, domains: list[str], factors: dict[str, int], where: str) -> list:
    if len(domains) != len(items):
        raise CliError(f"{where} has {len(domains)} lines for {len(items)} training pairs: rebuild the corpus")
    unknown = sorted(set(factors) - set(domains))
    if unknown:
        raise CliError(f"--oversample: no training pair is from {unknown[0]!r} (domains: {sorted(set(domains))})")
    return [item for item, d in zip(items, domains, strict=True) for _ in range(factors.get(d, 1))]


def load_examples(args: argparse.Namespace, corpus: CorpusArrays | None, tok: Tokenizer, hp: dict, factors: dict):
    """(train examples, how many were too long, valid examples, the valid references) from the corpus
    folder or its pre-tokenised arrays: the same examples in the same order either way."""
    if corpus:
        train, valid = corpus.examples("train"), corpus.examples("valid")
        if factors:
            train = repeat_domains(train, corpus.domains(), factors, f"{args.arrays} (train.domains)")
        refs = corpus.valid_references()
    else:
        train_pairs, valid_pairs = load_split(args.data, "train"), load_split(args.data, "valid")
        train_pairs = oversample(args.data, train_pairs, factors)
        if hp["max_train"]:
            train_pairs, valid_pairs = train_pairs[: hp["max_train"]], valid_pairs[: max(50, hp["max_train"] // 5)]
        train, dropped = encode_pairs(tok, train_pairs, hp["max_length"])
        valid, _ = encode_pairs(tok, valid_pairs, hp["max_length"])
        return train, dropped, valid, [t for _, t in valid_pairs]
    if hp["max_train"]:
        train, valid = train[: hp["max_train"]], valid[: max(50, hp["max_train"] // 5)]
    n = hp["max_length"]
    kept = [ex for ex in train if len(ex.src) <= n and len(ex.tgt) <= n + 1]
    return kept, len(train) - len(kept), [ex for ex in valid if len(ex.src) <= n and len(ex.tgt) <= n + 1], refs


def batch_loss(forward, batch: Batch, hp: dict, smoothing: float, pad_id: int) -> torch.Tensor:
    """Summed cross-entropy of a batch; ``forward`` is the model or its compiled form."""
    with torch.autocast(batch.src.device.type, dtype=torch.bfloat16, enabled=hp["precision"] == "bf16"):
        logits = forward(batch.src, batch.tgt[:, :-1])
    return F.cross_entropy(
        logits.float().flatten(0, 1),
        batch.tgt[:, 1:].flatten(),
        ignore_index=pad_id,
        label_smoothing=smoothing,
        reduction="sum",
    )


def train_step(model: Seq2Seq, forward, opt, sched, batch: Batch, hp: dict, clock: Clock = NO_CLOCK) -> torch.Tensor:
    """One optimiser step; returns the batch's mean token loss, still on the device (reading it waits)."""
    with clock("forward"):
        loss = batch_loss(forward, batch, hp, hp["label_smoothing"], model.cfg.pad_id) / batch.target_tokens
    with clock("backward"):
        opt.zero_grad(set_to_none=True)
        loss.backward()
    with clock("optimiser"):
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    return loss.detach()


@torch.no_grad()
def validate(model: Seq2Seq, batches: list[Batch], hp: dict) -> float:
    """Mean per-token cross-entropy (no smoothing) over the validation batches, read once at the end."""
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=batches[0].src.device)
    for batch in batches:
        total += batch_loss(model, batch, hp, 0.0, model.cfg.pad_id).double()
    return total.item() / sum(b.target_tokens for b in batches)


def greedy_bleu(model: Seq2Seq, examples: list[Example], refs: list[str], tok: Tokenizer) -> tuple[float, float]:
    hyps = []
    for i in range(0, len(examples), 64):
        src = pad_batch(examples[i : i + 64], model.cfg.pad_id)[0].to(next(model.parameters()).device)
        hyps += [tok.decode(ids) for ids in greedy_decode(model, src, max_len=int(src.shape[1] * 1.5) + 10)]
    return sacrebleu.corpus_bleu(hyps, [refs]).score, sacrebleu.corpus_chrf(hyps, [refs]).score


def benchmark_validation(model: Seq2Seq, valid_batches, bleu_examples, bleu_refs, tok: Tokenizer, hp: dict) -> dict:
    """Seconds of the end-of-epoch work: the validation loss, and greedy decoding for BLEU."""
    t0 = time.perf_counter()
    validate(model, valid_batches, hp)  # .item() at its end waits for the device
    t1 = time.perf_counter()
    greedy_bleu(model, bleu_examples, bleu_refs, tok)
    return {"loss": round(t1 - t0, 3), "bleu": round(time.perf_counter() - t1, 3)}


def build_optimizer(model: Seq2Seq, hp: dict) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
        lr=hp["lr"],
        betas=(0.9, 0.98),
        eps=1e-9,
        fused=decay[0].device.type == "cuda",  # one kernel for every parameter instead of several per tensor
    )
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: inverse_sqrt(s, hp["warmup_steps"]))


def save_epoch_weights(folder: Path, epoch: int, model: Seq2Seq, keep: int) -> None:
    """``epoch-NNN.pt`` (weights only) for checkpoint averaging at export; only the last ``keep`` stay."""
    save_checkpoint(folder / f"epoch-{epoch:03d}.pt", {"state_dict": model.state_dict(), "epoch": epoch})
    for old in sorted(folder.glob("epoch-*.pt"))[:-keep] if keep > 0 else []:
        old.unlink()


def entry_start(path: Path) -> tuple[dict, dict[str, torch.Tensor], Path, dict]:
    """(config, state_dict, tokenizer file, where it came from) of a shipped translator entry; the last
    names the entry and keeps a summary of its own training, which the new manifest carries on."""
    # imported here: the GPU job's machine has torch but not pydantic, which the manifest needs
    from contract.manifest import ManifestError, load_entry
    from model.onnx_weights import read_weights

    try:
        entry = load_entry(path)
        cfg, weights, _ = read_weights(entry)
    except (
        OSError,
        ValueError,
        ManifestError,
    ) as e:  # a missing/invalid manifest, a graph whose weights cannot be named
        raise CliError(f"--init-from {path}: {e}") from None
    tokenizer = entry.manifest.tokenizer
    if tokenizer is None or tokenizer.library != "sentencepiece":
        raise CliError(f"--init-from {path}: only entries with one SentencePiece tokenizer can be trained further")
    state = {name: torch.from_numpy(array.copy()) for name, array in weights.items()}
    trained = entry.manifest.training
    keys = (
        "command",
        "data",
        "train_pairs",
        "steps",
        "epochs_done",
        "training_seconds",
        "averaged_epochs",
        "init_from",
    )
    origin = {
        "entry": f"{entry.manifest.name}/{entry.manifest.version}",
        **{k: trained[k] for k in keys if k in trained},
    }
    return cfg, state, entry.path / tokenizer.file, origin


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    seed_everything(args.seed)
    out = args.out or Path("checkpoints") / f"translator-{args.profile}"
    # with --resume too: the entry gives the tokenizer and config; the weights come from last.pt then
    start_from = entry_start(args.init_from) if args.init_from else None
    corpus = load_arrays(args.arrays) if args.arrays else None
    data = Path(corpus.meta["data"]) if corpus else args.data  # the folder whose test.tsv export reads
    try:
        if corpus and not (args.tokenizer or start_from):
            tok = Tokenizer.from_bytes(corpus.tokenizer)
        else:
            tok = Tokenizer.load(args.tokenizer or (start_from[2] if start_from else args.data / "spm" / "spm.model"))
    except TokenizerError as e:
        raise CliError(f"{e} (train it: python -m model.translation.tokenizer --data {args.data})") from None
    hp = resolve_hparams(args, tok.vocab_size)
    if start_from:
        given = [k for k in ("dim", "encoder_layers", "decoder_layers", "heads", "ffn_dim", "norm") if getattr(args, k)]
        if given:
            raise CliError(f"--init-from takes the entry's model config: drop --{given[0].replace('_', '-')}")
        entry_cfg = Seq2SeqConfig.from_dict(start_from[0])
        hp["config"] = replace(entry_cfg, dropout=args.dropout) if args.dropout is not None else entry_cfg
        if hp["config"].vocab_size != tok.vocab_size:
            raise CliError(f"the tokenizer has {tok.vocab_size} pieces, the entry's model {hp['config'].vocab_size}")
    cfg: Seq2SeqConfig = hp["config"]
    factors = parse_oversample(args.oversample)
    train, dropped, valid, valid_refs = load_examples(args, corpus, tok, hp, factors)
    if not train:
        raise CliError(f"no training pair is at most {hp['max_length']} tokens long")
    valid_batches = device_batches(make_batches(valid, hp["max_tokens"], None), cfg.pad_id, device)
    # evenly spaced: valid.tsv is ordered by source, and its head is all dictionary sentences (the hardest)
    bleu_examples = valid[:: max(1, len(valid) // max(1, args.bleu_sentences))][: args.bleu_sentences]
    bleu_refs = [valid_refs[ex.index] for ex in bleu_examples]

    model = Seq2Seq(cfg)
    if start_from and not args.resume:
        model.load_state_dict(start_from[1])  # strict: every parameter named in the graphs, none left over
    model.to(device)
    opt, sched = build_optimizer(model, hp)
    state = {"epoch": 0, "batch": 0, "step": 0, "seconds": 0.0, "best": None, "history": []}
    state["init_from"] = start_from[3] if start_from else None
    if args.resume:
        ckpt = load_checkpoint(out / "last.pt")
        model.load_state_dict(ckpt["state_dict"])  # onto the model's device, wherever it was saved
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        torch.set_rng_state(ckpt["rng"])
        state = ckpt["state"]
    tokens_per_epoch = sum(len(ex.src) + len(ex.tgt) for ex in train)
    print(
        f"Seq2Seq {model.num_parameters():,} parameters | {len(train)} train pairs ({dropped} longer than "
        f"{hp['max_length']} tokens left out), {len(valid)} valid | {tokens_per_epoch:,} tokens/epoch | "
        f"{hp['precision']} on {device} | {'resuming at epoch ' + str(state['epoch'] + 1) if args.resume else 'from ' + (state['init_from'] or {}).get('entry', 'scratch')}",
        file=sys.stderr,
    )
    forward = torch.compile(model, dynamic=True) if args.compile else model
    if args.benchmark:
        from model.train_benchmark import benchmark

        seed = torch.Generator().manual_seed(args.seed * 100_003)
        batches = make_batches(train, hp["max_tokens"], seed)
        report = benchmark(model, forward, opt, sched, batches, hp, args.benchmark, device)
        report["validation_seconds"] = benchmark_validation(model, valid_batches, bleu_examples, bleu_refs, tok, hp)
        report["epoch_seconds"] = round(len(batches) / report["steps_per_second"], 1)
        print(json.dumps({"benchmark": report, "profile": args.profile, "params": model.num_parameters()}))
        return 0

    def save_last() -> None:
        save_checkpoint(
            out / "last.pt",
            {
                "state_dict": model.state_dict(),
                "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(),
                "rng": torch.get_rng_state(),
                "state": state,
                "config": cfg.to_dict(),
            },
        )

    start, stop_reason = time.time() - state["seconds"], None  # state["seconds"]: training time over all runs
    deadline = time.time() + args.time_limit * 60 if args.time_limit else None  # this run's own limit
    while state["epoch"] < hp["epochs"] and stop_reason is None:
        epoch = state["epoch"]
        batches = make_batches(train, hp["max_tokens"], torch.Generator().manual_seed(args.seed * 100_003 + epoch))
        ready = device_batches(batches[state["batch"] :], cfg.pad_id, device)  # ready[i - state["batch"]]
        model.train()
        first = state["batch"]
        bar = tqdm(
            range(first, len(batches)),
            desc=f"epoch {epoch + 1}/{hp['epochs']}",
            disable=args.no_progress,
            leave=False,
        )
        losses, last_save = [], time.time()
        for i in bar:
            losses.append(train_step(model, forward, opt, sched, ready[i - first], hp))
            state["step"], state["batch"] = state["step"] + 1, i + 1
            if not args.no_progress and i % 20 == 0:  # .item() waits for the GPU: only now and then
                bar.set_postfix(loss=f"{torch.stack(losses[-50:]).mean():.3f}", lr=f"{sched.get_last_lr()[0]:.2e}")
            now = time.time()
            state["seconds"] = now - start
            if args.max_steps and state["step"] >= args.max_steps:
                stop_reason = f"--max-steps {args.max_steps}"
            elif deadline and now >= deadline:
                stop_reason = f"--time-limit {args.time_limit} min"
            if stop_reason:
                break
            if now - last_save > 600:  # a mid-epoch resume point every 10 minutes
                save_last()
                last_save = now
        if state["batch"] >= len(batches):
            val_loss = validate(model, valid_batches, hp)
            decode = (epoch + 1) % args.bleu_every == 0 or epoch + 1 == hp["epochs"]
            bleu, chrf = greedy_bleu(model, bleu_examples, bleu_refs, tok) if decode else (None, None)
            record = {
                "epoch": epoch + 1,
                "step": state["step"],
                "seconds": round(time.time() - start, 1),
                "train_loss": float(torch.stack(losses).mean()) if losses else None,
                "val_loss": val_loss,
                "val_bleu": bleu,
                "val_chrf": chrf,
            }
            state["history"].append(record)
            print(
                f"epoch {epoch + 1}: train loss {record['train_loss']:.4f} val loss {val_loss:.4f}"
                + (f" val greedy BLEU {bleu:.2f} chrF {chrf:.2f}" if bleu is not None else "")
                + f" ({record['seconds']:.0f} s)",
                file=sys.stderr,
            )
            save_epoch_weights(out / "epochs", epoch + 1, model, args.keep_epochs)
            if state["best"] is None or val_loss < state["best"]["val_loss"]:
                state["best"] = record
                save_checkpoint(out / "best.pt", {"state_dict": model.state_dict()})
            state["epoch"], state["batch"] = epoch + 1, 0
        state["seconds"] = time.time() - start
        save_last()
    if state["best"] is None:
        raise CliError(f"stopped ({stop_reason}) before the first epoch ended; continue with --resume")

    meta = {
        "task": "translation",
        "architecture": "Seq2Seq",
        "config": cfg.to_dict(),
        "tokenizer": {"model": tok.to_bytes(), "special_ids": tok.special.as_dict(), "vocab_size": tok.vocab_size},
        "training": {
            "data": str(data),
            **({"arrays": str(args.arrays)} if args.arrays else {}),
            "batch_scale": args.batch_scale,
            "train_pairs": len(train),
            "valid_pairs": len(valid),
            "left_out_long": dropped,
            "tokens_per_epoch": tokens_per_epoch,
            "oversample": factors,
            "seed": args.seed,
            "threads": args.threads,
            "profile": args.profile,
            "init_from": state.get("init_from"),
            "command": "python -m model.train_translator " + shlex.join(argv if argv is not None else sys.argv[1:]),
            "hyperparameters": {k: hp[k] for k in HPARAMS},
            "steps": state["step"],
            "epochs_done": state["epoch"],
            "training_seconds": round(state["seconds"], 1),
            "stopped_by": stop_reason or "epochs",
            "best_epoch": state["best"]["epoch"],
            "val_loss": state["best"]["val_loss"],
            "history": state["history"],
            "torch": torch.__version__,
        },
    }
    best = load_checkpoint(out / "best.pt")  # CPU tensors, wherever it was trained
    save_checkpoint(out / "best.pt", {"state_dict": best["state_dict"], **meta})
    meta.pop("tokenizer")
    (out / "metrics.json").write_text(json.dumps(meta, indent=2))
    print(
        f"best epoch {meta['training']['best_epoch']} (val loss {meta['training']['val_loss']:.4f}); "
        f"wrote {out / 'best.pt'}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    run_cli(main)
