"""Export a trained translator checkpoint to a model-repository entry ``models/translator/<version>/``.

``python -m export.translator --checkpoint checkpoints/translator-default/best.pt``

Three graphs and the tokenizer: ``encoder.onnx`` (run once per request: encoder output, every
decoder layer's cross-attention keys/values, encoder self-attention), ``decoder.onnx`` (one step
with a key/value cache, log-probs and cache only; names and layouts in ``contract/decoding.py``),
``decoder_prefix.onnx`` (a
whole target prefix without a cache: scores and attention maps of a finished translation in one
run, and the uncached baseline of the benchmark), plus ``tokenizer.model``.

Every export is checked: greedy decoding through the two onnxruntime graphs must give exactly the
tokens of PyTorch greedy decoding on ``--parity-sentences`` test sentences, with per-step
log-probabilities within 1e-4, or the export is refused. BLEU and chrF on the whole test split,
overall and per source domain (greedy and beam search, through onnxruntime; export/scoring.py), the
copy-the-source baseline and the corpus's sources with their package versions go in the manifest.
``--average N`` exports the mean of the weights of the last N epochs instead of the best epoch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from contract.decoding import (
    DecoderSpec,
    Graph,
    Hypothesis,
    beam_search,
    decoder_inputs,
    decoding_outputs,
    greedy,
    pad_sources,
    per_layer,
    session_fn,
)
from contract.placeholders import TRAINING_SENTINELS
from contract.tokenizer import Tokenizer
from export.common import (
    ExportError,
    StagedEntry,
    cpu_session,
    framework_versions,
    graph_io,
    max_abs_diff,
    next_version,
    now_iso,
)
from export.graphs import keep_outputs
from export.scoring import ScoringError, evaluate, read_domains
from export.shared_weights import share_weights
from model.cli import CliError, run_cli
from model.seq2seq import Seq2Seq, Seq2SeqConfig, greedy_decode
from model.training import average_checkpoints, load_checkpoint
from model.translation.textio import TextFileError, read_tsv

ENCODER_INPUTS = ["src_ids", "src_mask"]
ENCODER_OUTPUTS = ["memory", "cross_keys", "cross_values", "encoder_attentions"]
PREFIX_INPUTS = ["tgt_ids", "cross_keys", "cross_values", "src_mask"]
PREFIX_OUTPUTS = ["log_probs", "self_attentions", "cross_attentions"]
ATTENTION_TOL = 1e-5
LOG_PROB_TOL = 1e-4
BEAM, LENGTH_PENALTY = 4, 1.0


class EncoderGraph(nn.Module):
    def __init__(self, model: Seq2Seq) -> None:
        super().__init__()
        self.model = model

    def forward(self, src_ids: torch.Tensor, src_mask: torch.Tensor):
        memory, attentions = self.model.encode(src_ids, src_mask, return_attention=True)
        cross_keys, cross_values = self.model.cross_kv(memory)
        return memory, cross_keys, cross_values, attentions


class DecoderGraph(nn.Module):
    """One decoding step: cache buffers per layer in, the new position's keys/values out (``contract.decoding``)."""

    def __init__(self, model: Seq2Seq) -> None:
        super().__init__()
        self.model = model
        self.layers = model.cfg.decoder_layers
        self.inputs = decoder_inputs(self.layers)
        self.outputs = [*decoding_outputs(self.layers)["decoder"], "self_attentions", "cross_attentions"]

    def forward(self, tokens, positions, cache_mask, src_mask, *caches):
        n = self.layers
        past_k, past_v, cross_k, cross_v = (caches[i * n : (i + 1) * n] for i in range(4))
        log_probs, keys, values, self_p, cross_p = self.model.decode_step_layers(
            tokens, positions, past_k, past_v, cache_mask, cross_k, cross_v, src_mask
        )
        return log_probs, *keys, *values, self_p, cross_p


class PrefixDecoderGraph(nn.Module):
    """The whole target prefix in one run, without a cache: scoring a given translation, its attention
    maps in one pass, and the uncached baseline of the decoding benchmark."""

    def __init__(self, model: Seq2Seq) -> None:
        super().__init__()
        self.model = model

    def forward(self, tgt_ids, cross_keys, cross_values, src_mask):
        logits, self_attn, cross_attn = self.model.decode_prefix(tgt_ids, cross_keys, cross_values, src_mask, True)
        return logits.log_softmax(dim=-1), self_attn, cross_attn


def example_inputs(cfg: Seq2SeqConfig, batch: int = 2, src: int = 5, past: int = 3) -> tuple[tuple, tuple]:
    """Encoder inputs, and the step graph's inputs in ``decoder_inputs`` order."""
    ids = torch.randint(4, cfg.vocab_size, (batch, src))
    mask = torch.ones(batch, src, dtype=torch.bool)
    n = cfg.decoder_layers
    cache = [torch.zeros(batch, cfg.heads, past, cfg.head_dim) for _ in range(2 * n)]
    cross = [torch.zeros(batch, cfg.heads, src, cfg.head_dim) for _ in range(2 * n)]
    step = (
        torch.ones(batch, 1, dtype=torch.long),
        torch.full((batch, 1), past, dtype=torch.long),
        torch.ones(batch, past, dtype=torch.bool),
        mask,
        *cache,
        *cross,
    )
    return (ids, mask), step


def export_graphs(model: Seq2Seq, folder: Path, opset: int = 18) -> None:
    model.eval()
    batch = torch.export.Dim("batch", min=1, max=4096)
    src = torch.export.Dim("src_len", min=1, max=model.cfg.max_positions)
    past = torch.export.Dim("past_len", min=0, max=model.cfg.max_positions)
    enc_args, dec_args = example_inputs(model.cfg)
    kv = {1: batch, 3: src}
    torch.onnx.export(
        EncoderGraph(model).eval(),
        enc_args,
        dynamo=True,
        opset_version=opset,
        external_data=False,
        input_names=ENCODER_INPUTS,
        output_names=ENCODER_OUTPUTS,
        dynamic_shapes={"src_ids": {0: batch, 1: src}, "src_mask": {0: batch, 1: src}},
    ).save(str(folder / "encoder.onnx"))
    step = DecoderGraph(model).eval()
    n = model.cfg.decoder_layers
    shapes = {
        "tokens": {0: batch},
        "positions": {0: batch},
        "cache_mask": {0: batch, 1: past},
        "src_mask": {0: batch, 1: src},
    }
    shapes |= {name: {0: batch, 2: past} for kind in ("past_keys", "past_values") for name in per_layer(kind, n)}
    shapes |= {name: {0: batch, 2: src} for kind in ("cross_keys", "cross_values") for name in per_layer(kind, n)}
    torch.onnx.export(
        step,
        dec_args,
        dynamo=True,
        opset_version=opset,
        external_data=False,
        input_names=step.inputs,
        output_names=step.outputs,
        dynamic_shapes={
            "tokens": shapes["tokens"],
            "positions": shapes["positions"],
            "cache_mask": shapes["cache_mask"],
            "src_mask": shapes["src_mask"],
            "caches": tuple(shapes[k] for k in step.inputs[4:]),
        },
    ).save(str(folder / "decoder-with-attention.onnx"))
    # Decoding fetches log-probs and the cache only; per-step attention outputs would still be
    # stacked at every step, so the step graph drops them (attention comes from decoder_prefix).
    keep_outputs(folder / "decoder-with-attention.onnx", folder / "decoder.onnx", list(decoding_outputs(n)["decoder"]))
    (folder / "decoder-with-attention.onnx").unlink()
    tgt = torch.export.Dim("tgt_len", min=1, max=model.cfg.max_positions)
    cross_stacked = torch.zeros(n, 2, model.cfg.heads, 5, model.cfg.head_dim)
    torch.onnx.export(
        PrefixDecoderGraph(model).eval(),
        (torch.ones(2, 4, dtype=torch.long), cross_stacked, cross_stacked.clone(), enc_args[1]),
        dynamo=True,
        opset_version=opset,
        external_data=False,
        input_names=PREFIX_INPUTS,
        output_names=PREFIX_OUTPUTS,
        dynamic_shapes={
            "tgt_ids": {0: batch, 1: tgt},
            "cross_keys": kv,
            "cross_values": kv,
            "src_mask": {0: batch, 1: src},
        },
    ).save(str(folder / "decoder_prefix.onnx"))
    share_weights(folder, ["encoder.onnx", "decoder.onnx", "decoder_prefix.onnx"])  # each parameter stored once


def torch_fn(module: nn.Module, inputs: list[str], outputs: list[str]) -> Graph:
    """A PyTorch module as the same name -> array callable as an onnxruntime session."""

    @torch.no_grad()
    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = module(*(torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in inputs))
        return {n: r.numpy() for n, r in zip(outputs, result)}

    return run


def decoder_spec(cfg: Seq2SeqConfig) -> DecoderSpec:
    return DecoderSpec(
        cfg.decoder_layers, cfg.heads, cfg.head_dim, cfg.pad_id, cfg.bos_id, cfg.eos_id, cfg.max_positions
    )


def batched(sources: list[list[int]], size: int) -> list[list[int]]:
    """Indices grouped into batches of similar source length."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    return [order[i : i + size] for i in range(0, len(order), size)]


def parity_report(
    model: Seq2Seq,
    encoder: Graph,
    decoder: Graph,
    sources: list[list[int]],
    batch_size: int = 32,
    prefix: Graph | None = None,
) -> dict:
    """Greedy tokens of ORT vs pure-PyTorch decoding, per-step log-prob drift vs the PyTorch graphs,
    and the prefix graph's log-probs and attention on the decoded sentences vs PyTorch and vs the steps."""
    spec = decoder_spec(model.cfg)
    t_enc = torch_fn(EncoderGraph(model).eval(), ENCODER_INPUTS, ENCODER_OUTPUTS)
    step = DecoderGraph(model).eval()
    t_dec = torch_fn(step, step.inputs, step.outputs)
    t_prefix = torch_fn(PrefixDecoderGraph(model).eval(), PREFIX_INPUTS, PREFIX_OUTPUTS)
    report = {
        "sentences": len(sources),
        "identical_tokens": 0,
        "max_abs_log_probs": 0.0,
        "first_mismatch": None,
        "prefix_max_abs_log_probs": 0.0,
        "prefix_max_abs_attention": 0.0,
        "prefix_vs_steps_max_abs": 0.0,
    }
    for idx in batched(sources, batch_size):
        batch = [sources[i] for i in idx]
        onnx_hyps = greedy(encoder, decoder, batch, spec, record=True)
        torch_hyps = greedy(t_enc, t_dec, batch, spec, record=True)
        src = torch.from_numpy(pad_sources(batch, spec.pad_id)[0])
        reference = greedy_decode(model, src, max_len=max(spec.max_length(len(s)) for s in batch))
        for i, o, t, ref in zip(idx, onnx_hyps, torch_hyps, reference):
            ref = ref[: spec.max_length(len(sources[i]))]
            if o.tokens == ref == t.tokens:
                report["identical_tokens"] += 1
            elif report["first_mismatch"] is None:
                report["first_mismatch"] = {"index": i, "onnx": o.tokens, "pytorch": ref}
            for a, b in zip(o.step_log_probs, t.step_log_probs):
                report["max_abs_log_probs"] = max(report["max_abs_log_probs"], max_abs_diff(a, b))
        if prefix is not None:
            _prefix_parity(report, batch, onnx_hyps, encoder, prefix, t_prefix, spec)
    return report


def _prefix_parity(
    report: dict, batch, hyps, encoder: Graph, prefix: Graph, t_prefix: Graph, spec: DecoderSpec
) -> None:
    """The uncached prefix graph on the decoded sentences: vs PyTorch, and vs the cached steps' log-probs."""
    width = max(len(h.tokens) for h in hyps) + 1
    tgt = np.full((len(hyps), width), spec.pad_id, dtype=np.int64)
    for row, h in enumerate(hyps):
        tgt[row, : len(h.tokens) + 1] = [spec.bos_id] + h.tokens
    ids, src_mask = pad_sources(batch, spec.pad_id)
    enc = encoder({"src_ids": ids, "src_mask": src_mask})
    feeds = {"tgt_ids": tgt, "cross_keys": enc["cross_keys"], "cross_values": enc["cross_values"], "src_mask": src_mask}
    got, ref = prefix(feeds), t_prefix(feeds)
    real = tgt != spec.pad_id  # padded target positions are not compared
    report["prefix_max_abs_log_probs"] = max(
        report["prefix_max_abs_log_probs"], max_abs_diff(got["log_probs"][real], ref["log_probs"][real])
    )
    for name in ("self_attentions", "cross_attentions"):
        a, b = got[name].transpose(0, 3, 1, 2, 4)[real], ref[name].transpose(0, 3, 1, 2, 4)[real]
        report["prefix_max_abs_attention"] = max(report["prefix_max_abs_attention"], max_abs_diff(a, b))
    for row, h in enumerate(hyps):
        for t, step_lp in enumerate(h.step_log_probs[: len(h.tokens) + 1]):
            report["prefix_vs_steps_max_abs"] = max(
                report["prefix_vs_steps_max_abs"], max_abs_diff(got["log_probs"][row, t], step_lp)
            )


def check_parity(report: dict, tol: float = LOG_PROB_TOL) -> None:
    problems = []
    if report["identical_tokens"] != report["sentences"]:
        problems.append(
            f"greedy tokens differ on {report['sentences'] - report['identical_tokens']} sentences "
            f"(first: {report['first_mismatch']})"
        )
    for key in ("max_abs_log_probs", "prefix_max_abs_log_probs", "prefix_vs_steps_max_abs"):
        if report.get(key, 0.0) > tol:
            problems.append(f"{key} {report[key]:.2e} > {tol:.0e}")
    if report.get("prefix_max_abs_attention", 0.0) > ATTENTION_TOL:
        problems.append(f"prefix_max_abs_attention {report['prefix_max_abs_attention']:.2e} > {ATTENTION_TOL:.0e}")
    if problems:
        raise ExportError("ONNX/PyTorch parity check failed: " + "; ".join(problems))


def translate_all(
    encoder: Graph,
    decoder: Graph,
    sources: list[list[int]],
    spec: DecoderSpec,
    tok: Tokenizer,
    beam: int,
    progress: bool,
    batch_size: int = 64,
) -> tuple[list[str], float]:
    out: list[str] = [""] * len(sources)
    start = time.perf_counter()
    for idx in tqdm(batched(sources, batch_size), desc=f"test set, beam {beam}", disable=not progress, leave=False):
        batch = [sources[i] for i in idx]
        hyps: list[Hypothesis] = (
            greedy(encoder, decoder, batch, spec)
            if beam == 1
            else beam_search(encoder, decoder, batch, spec, beam=beam, length_penalty=LENGTH_PENALTY)
        )
        for i, h in zip(idx, hyps):
            out[i] = tok.decode(h.tokens)
    return out, time.perf_counter() - start


def corpus_provenance(data: Path) -> dict:
    """What the model was trained on, from the corpus's ``stats.json``: each source with its packages and versions."""
    path = Path(data) / "stats.json"
    if not path.is_file():
        return {"folder": str(data), "stats": None}
    stats = json.loads(path.read_text(encoding="utf-8"))
    keep = ("packages", "files", "stages", "splits")
    return {
        "folder": str(data),
        "command": stats.get("command"),
        "total": stats.get("total"),
        "splits": stats.get("splits"),
        "split": stats.get("split"),
        "sources": {
            name: {k: v for k, v in src.items() if k in keep} for name, src in stats.get("sources", {}).items()
        },
        **({"excluded": stats["excluded"]} if "excluded" in stats else {}),  # a held-out set's training corpus
    }


def trained_sentinels(tok: Tokenizer) -> list[str]:
    """The sentinels the corpus masked placeholders with that the tokenizer holds as pieces of their own (its
    user-defined symbols): what the service masks with. Empty for a tokenizer trained without them (the
    service then masks with capital letters, ``contract/translation_text.py``)."""
    return [s for s in TRAINING_SENTINELS if tok.piece_to_id(s) != tok.unk_id]


def build_manifest(
    ckpt: dict, name: str, version: str, folder: Path, parity: dict, evaluation: dict, data: dict
) -> dict:
    cfg = Seq2SeqConfig.from_dict(ckpt["config"])
    enc, dec, prefix = (graph_io(folder / f"{g}.onnx") for g in ("encoder", "decoder", "decoder_prefix"))
    return {
        "name": name,
        "version": version,
        "task": "translation",
        "created_at": now_iso(),
        "framework": framework_versions(enc["opset"]),
        "languages": {"source": "en", "target": "de"},
        "model": {"architecture": "Seq2Seq", "config": cfg.to_dict(), "parameters": Seq2Seq(cfg).num_parameters()},
        "graphs": {
            "encoder": {"file": "encoder.onnx", **enc},
            "decoder": {"file": "decoder.onnx", **dec},
            "decoder_prefix": {"file": "decoder_prefix.onnx", **prefix},
        },
        "tokenizer": {
            "file": "tokenizer.model",
            "library": "sentencepiece",
            "special_ids": ckpt["tokenizer"]["special_ids"],
            "vocab_size": ckpt["tokenizer"]["vocab_size"],
            "normalization": "contract.tokenizer.normalize_text",
        },
        "decoding": {
            "cache_layout": ["batch", "head", "position", "head_dim"],
            "cache_inputs": "past_keys_{layer}",
            "cache_outputs": "new_keys_{layer}",
            "cache": "buffer: the caller writes each step's new keys/values",
            "layers": cfg.decoder_layers,
            "heads": cfg.heads,
            "head_dim": cfg.head_dim,
            "max_positions": cfg.max_positions,
            "max_length": "min(max_positions, 1.5 * source_tokens + 10)",
            "beam": BEAM,
            "length_penalty": LENGTH_PENALTY,
            "scores": "log_probs",
            "sentinels": trained_sentinels(Tokenizer.from_bytes(ckpt["tokenizer"]["model"])),
        },
        "attention": {
            "encoder": {
                "output": "encoder_attentions",
                "layout": ["batch", "layer", "head", "query", "key"],
                "layers": cfg.encoder_layers,
            },
            "prefix": {
                "graph": "decoder_prefix",
                "self": ["batch", "layer", "head", "target", "target"],
                "cross": ["batch", "layer", "head", "target", "source"],
            },
            "heads": cfg.heads,
        },
        "evaluation": {
            **evaluation,
            "parity": {**parity, "log_probs_tolerance": LOG_PROB_TOL, "attention_tolerance": ATTENTION_TOL},
        },
        "training": ckpt["training"],
        "data": data,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m export.translator", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, default=Path("checkpoints/translator-default/best.pt"))
    p.add_argument("--data", type=Path, help="corpus folder holding test.tsv (default: the one it was trained on)")
    p.add_argument("--repository", type=Path, default=Path("models"))
    p.add_argument("--name", default="translator")
    p.add_argument("--version", help="default: one more than the highest existing version")
    p.add_argument("--force", action="store_true", help="replace an existing version")
    p.add_argument("--opset", type=int, default=18)
    p.add_argument("--parity-sentences", type=int, default=200)
    p.add_argument("--max-test", type=int, help="evaluate on only the first N test pairs (smoke tests)")
    p.add_argument(
        "--average",
        type=int,
        default=0,
        metavar="N",
        help="export the mean weights of the last N epochs (saved under <checkpoint folder>/epochs)",
    )
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.opset < 17:
        raise CliError(f"opset must be >= 17, got {args.opset}")
    ckpt = load_checkpoint(args.checkpoint)
    if "tokenizer" not in ckpt:
        raise CliError(f"{args.checkpoint} has no training metadata (an unfinished run?); finish it with --resume")
    cfg = Seq2SeqConfig.from_dict(ckpt["config"])
    model = Seq2Seq(cfg).eval()
    if args.average:
        epochs = sorted((args.checkpoint.parent / "epochs").glob("epoch-*.pt"))[-args.average :]
        if len(epochs) < args.average:
            raise CliError(
                f"--average {args.average}: only {len(epochs)} epoch weights under {args.checkpoint.parent}/epochs"
            )
        ckpt["state_dict"] = average_checkpoints(epochs)
        ckpt["training"] = {**ckpt["training"], "averaged_epochs": [int(p.stem.split("-")[1]) for p in epochs]}
    model.load_state_dict(ckpt["state_dict"])
    tok = Tokenizer.from_bytes(ckpt["tokenizer"]["model"])
    data = args.data or Path(ckpt["training"]["data"])
    try:
        pairs, _ = read_tsv(data / "test.tsv")
    except TextFileError as e:
        raise CliError(f"{e} (pass --data with the corpus folder)") from None
    try:
        domains = read_domains(data, "test", len(pairs))
    except ScoringError as e:
        raise CliError(str(e)) from None
    pairs, domains = (pairs[: args.max_test], domains[: args.max_test]) if args.max_test else (pairs, domains)
    if not pairs:
        raise CliError(f"{data / 'test.tsv'} holds no sentence pairs")
    version = args.version or next_version(args.repository, args.name)

    with StagedEntry(args.repository, args.name, version, args.force) as stage:
        print(f"exporting {args.checkpoint} -> {stage.final}", file=sys.stderr)
        export_graphs(model, stage.dir, args.opset)
        tok.save(stage.dir / "tokenizer.model")
        encoder, decoder, prefix = (
            session_fn(cpu_session(stage.dir / f"{g}.onnx")) for g in ("encoder", "decoder", "decoder_prefix")
        )
        sources = tok.encode_batch([s for s, _ in pairs[: args.parity_sentences]], add_eos=True)
        parity = parity_report(model, encoder, decoder, sources, prefix=prefix)
        check_parity(parity)
        spec = decoder_spec(cfg)

        def translate(texts: list[str], beam: int) -> tuple[list[str], float]:
            ids = tok.encode_batch(texts, add_eos=True)
            return translate_all(encoder, decoder, ids, spec, tok, beam, not args.no_progress)

        evaluation = evaluate(translate, pairs, domains, BEAM)
        manifest = build_manifest(ckpt, args.name, version, stage.dir, parity, evaluation, corpus_provenance(data))
        final = stage.commit(manifest)
    print(
        f"wrote {final}: parity {parity['identical_tokens']}/{parity['sentences']} identical, max |dlog_probs| "
        f"{parity['max_abs_log_probs']:.1e}; test BLEU greedy {evaluation['greedy']['bleu']} beam "
        f"{evaluation[f'beam{BEAM}']['bleu']}, chrF {evaluation[f'beam{BEAM}']['chrf']} "
        f"(copy baseline BLEU {evaluation['copy_source']['bleu']})",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    run_cli(main)
