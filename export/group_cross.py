"""A translator decoder whose cross-attention takes one key/value row per request, shared by its beams.

``python -m export.group_cross --entry models/translator/3`` rewrites the entry's step graph (in
place; ``--name``/``--version`` write a copy instead) so that ``cross_keys_i``/``cross_values_i``
and ``src_mask`` may have R rows for a batch of B = R x g rows: row r of them serves the g adjacent
rows ``r*g .. r*g+g-1`` (a request's beams). The queries of those rows are attended together, as a
(g, Dh) block per request and head, instead of one (1, Dh) product per row: at beam 4, four times
fewer key/value rows for the step to read and four times fewer matrix products. With R = B (g = 1)
the graph computes what it did before, so every caller that passes one row per row still works; the
manifest says ``decoding.cross_rows: "request"`` so that ``contract/decoding.py`` passes one per
request when every request of a batch searches with the same beam.

Only the graph's structure changes: its weights stay where they are (``weights.bin`` is untouched).
The rewrite is refused unless, on ``--sentences``, greedy decoding (one row per row) and beam-4
search (one row per request) through the new graph give the entry's tokens exactly with per-step
log-probabilities within ``LOG_PROB_TOL`` of the entry's graph.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from contract.decoding import DecodeRequest, DecoderSpec, run_to_end, session_fn
from contract.manifest import SCHEMA_VERSION, TRANSLATION, describe_files, load_entry, read_manifest, write_manifest
from contract.tokenizer import Tokenizer
from export.common import ExportError, StagedEntry, cpu_session, graph_io, max_abs_diff, now_iso
from export.fuse import SENTENCES, _cross_attention, _Graph
from model.cli import CliError, run_cli

LOG_PROB_TOL = 1e-4  # as the export's parity with PyTorch
CROSS_ROWS = "request"


def group_cross_attention(model: onnx.ModelProto, heads: int, head_dim: int) -> int:
    """Rewrite each layer's cross-attention of a step graph, in place (the nodes it no longer needs stay until
    extracted away); returns how many layers it rewrote."""
    graph = _Graph(model)
    layers = sum(1 for i in graph.g.input if i.name.startswith("past_keys_"))
    replaced: dict[int, list[onnx.NodeProto]] = {}
    removed: set[int] = set()
    for layer in range(layers):
        found = _cross_attention(graph, layer)
        if found is None:
            continue
        nodes, query, _, out = found
        scaled = next(n for n in nodes if n.op_type == "Mul")  # q * scale, kept as exported
        softmax = next(n for n in nodes if n.op_type == "Softmax")
        p = f"group{layer}_"
        replaced[id(graph.producer[out])] = [
            helper.make_node("Reshape", [query, "group_query_shape"], [p + "q"]),  # (R, g, H, Dh)
            helper.make_node("Transpose", [p + "q"], [p + "qt"], perm=[0, 2, 1, 3]),  # (R, H, g, Dh)
            helper.make_node("Mul", [p + "qt", scaled.input[1]], [p + "qs"]),
            helper.make_node("Transpose", [f"cross_keys_{layer}"], [p + "kt"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", [p + "qs", p + "kt"], [p + "scores"]),  # (R, H, g, S)
            helper.make_node("Where", ["group_mask", p + "scores", "group_lowest"], [p + "masked"]),
            helper.make_node("Softmax", [p + "masked"], [p + "probs"], axis=-1),
            helper.make_node("MatMul", [p + "probs", f"cross_values_{layer}"], [p + "context"]),  # (R, H, g, Dh)
            helper.make_node("Transpose", [p + "context"], [p + "ct"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [p + "ct", "group_out_shape"], [out]),  # (B, 1, H * Dh)
        ]
        if any(a.name == "axis" and a.i not in (-1, 3) for a in softmax.attribute):
            raise ExportError(f"layer {layer}: the cross-attention softmax is not over the keys")
        removed |= {id(n) for n in nodes}
    if not replaced:
        return 0
    prelude = [
        helper.make_node("Shape", ["src_mask"], ["group_rows"], start=0, end=1),  # R
        helper.make_node("Concat", ["group_rows", "group_rest"], ["group_query_shape"], axis=0),
        helper.make_node("Unsqueeze", ["src_mask", "group_axes"], ["group_mask"]),  # (R, 1, 1, S)
    ]
    kept: list[onnx.NodeProto] = []
    for n in graph.g.node:
        if id(n) in replaced:
            kept += replaced[id(n)]
        elif id(n) not in removed:
            kept.append(n)
    del graph.g.node[:]
    graph.g.node.extend(prelude + kept)
    graph.g.initializer.extend(
        numpy_helper.from_array(np.asarray(v, dtype), name)
        for name, v, dtype in [
            ("group_rest", [-1, heads, head_dim], np.int64),
            ("group_out_shape", [-1, 1, heads * head_dim], np.int64),
            ("group_axes", [1, 2], np.int64),
            ("group_lowest", np.finfo(np.float32).min, np.float32),
        ]
    )
    for value in graph.g.input:  # their rows: one per request, or one per row
        if value.name == "src_mask" or value.name.startswith(("cross_keys_", "cross_values_")):
            value.type.tensor_type.shape.dim[0].dim_param = "cross_rows"
    return len(replaced)


def parity(entry: Path, grouped_decoder: Path, sentences: list[str]) -> dict:
    """Greedy (a row per row) and beam 4 (a row per request) through the grouped graph against the entry's."""
    m = load_entry(entry).manifest
    tok, spec = Tokenizer.load(entry / m.tokenizer.file), DecoderSpec.from_manifest(m)
    grouped_spec = DecoderSpec(**{**spec.__dict__, "cross_rows": CROSS_ROWS})
    encoder = session_fn(cpu_session(entry / m.graph("encoder").file))
    before = session_fn(cpu_session(entry / m.graph("decoder").file))
    after = session_fn(cpu_session(grouped_decoder))
    sources = tok.encode_batch(sentences, add_eos=True)
    report = {"sentences": len(sources), "tolerance": LOG_PROB_TOL}
    for label, beam in (("greedy", 1), ("beam4", 4)):
        runs = []
        for decoder, s in ((before, spec), (after, grouped_spec)):
            reqs = [DecodeRequest(list(x), s.max_length(len(x)), beam=beam, record=True) for x in sources]
            runs.append([r.results()[0] for r in run_to_end(encoder, decoder, reqs, s)])
        ref, got = runs
        report[label] = {
            "identical": sum(a.tokens == b.tokens for a, b in zip(ref, got)),
            "max_abs_log_probs": max(
                max_abs_diff(x, y) for a, b in zip(ref, got) for x, y in zip(a.step_log_probs, b.step_log_probs)
            ),
        }
    return report


def write_grouped(entry: Path, target: Path | None, sentences: list[str]) -> tuple[Path, dict]:
    """The entry with a grouped decoder: in place when ``target`` is None, else as ``target`` (name/version)."""
    manifest = read_manifest(entry)
    if manifest.get("decoding", {}).get("cross_rows") == CROSS_ROWS:
        raise ExportError(f"{entry}: its decoder already takes a cross-attention row per request")
    cfg, decoder = manifest["model"]["config"], manifest["graphs"]["decoder"]["file"]
    model = onnx.load(str(entry / decoder), load_external_data=False)  # weights stay in weights.bin
    if not group_cross_attention(model, cfg["heads"], cfg["dim"] // cfg["heads"]):
        raise ExportError(f"{entry / decoder}: no cross-attention of the exported form found to rewrite")
    model = onnx.utils.Extractor(model).extract_model(  # drops what the rewrite left unused (the old masks)
        [i.name for i in model.graph.input], [o.name for o in model.graph.output]
    )
    with tempfile.TemporaryDirectory(prefix=".group-", dir=entry.parent) as tmp:
        staged = Path(tmp) / decoder
        onnx.save(model, str(staged))
        for f in manifest["files"]:  # beside it (onnxruntime reads external data from the graph's own folder)
            if f != decoder:
                _link_or_copy(entry / f, Path(tmp) / f)
        report = parity(entry, staged, sentences)
        if any(report[k]["identical"] != report["sentences"] for k in ("greedy", "beam4")) or any(
            report[k]["max_abs_log_probs"] > LOG_PROB_TOL for k in ("greedy", "beam4")
        ):
            raise ExportError(f"the grouped decoder drifts from {entry}: {report}")
        new = {k: v for k, v in manifest.items() if k not in ("schema_version", "files")}
        new["decoding"] = {**manifest["decoding"], "cross_rows": CROSS_ROWS}
        io = graph_io(staged)  # the inputs' first axis now named cross_rows; the rest of the entry as it was
        new["graphs"]["decoder"] = {**manifest["graphs"]["decoder"], "inputs": io["inputs"], "outputs": io["outputs"]}
        new["evaluation"] = {**manifest["evaluation"], "cross_rows_rewrite": {**report, "at": now_iso()}}
        if target is None:
            return _replace_in_place(entry, staged, decoder, new, list(manifest["files"])), report
        name, version = target.parent.name, target.name
        new.update(name=name, version=version, created_at=now_iso())
        with StagedEntry(target.parent.parent, name, version, force=False) as stage:
            for f in manifest["files"]:
                shutil.copy(staged if f == decoder else entry / f, stage.dir / f)
            return stage.commit(new), report


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy(source, target)


def _replace_in_place(entry: Path, staged: Path, decoder: str, manifest: dict, files: list[str]) -> Path:
    """Swap the new graph in and rewrite the manifest with the files' new digests; weights.bin is untouched."""
    swap = entry / f".{decoder}.new"
    shutil.copy(staged, swap)
    swap.replace(entry / decoder)
    write_manifest(entry, {"schema_version": SCHEMA_VERSION, **manifest, "files": describe_files(entry, files)})
    return entry


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m export.group_cross", description=__doc__.splitlines()[0])
    p.add_argument("--entry", type=Path, required=True, help="a translator entry, e.g. models/translator/3")
    p.add_argument("--name", help="write a copy as <repository>/<name>/<version> instead of rewriting in place")
    p.add_argument("--version", help="the copy's version (default: the entry's)")
    p.add_argument("--sentences", type=Path, default=SENTENCES, help="parity sentences, one a line")
    args = p.parse_args(argv)
    m = load_entry(args.entry).manifest
    if m.task != TRANSLATION:
        raise CliError(f"{args.entry} is a {m.task!r} entry: only a translator's decoder has cross-attention")
    target = args.entry.parent.parent / args.name / (args.version or m.version) if args.name else None
    sentences = [s for s in args.sentences.read_text(encoding="utf-8").splitlines() if s.strip()]
    final, report = write_grouped(args.entry, target, sentences)
    print(
        f"wrote {final}: cross-attention a row per request; greedy identical {report['greedy']['identical']}/"
        f"{report['sentences']} (max |dlog_probs| {report['greedy']['max_abs_log_probs']:.1e}), beam 4 identical "
        f"{report['beam4']['identical']}/{report['sentences']} ({report['beam4']['max_abs_log_probs']:.1e})",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    run_cli(main)
