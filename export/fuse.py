"""A fused variant of a translator entry: its decoder step graph in onnxruntime's fused (contrib) ops.

``python -m export.fuse --entry models/translator/3 [--repository models] [--self-attention]``

writes ``<name>-fused/<version>``: the entry's files with ``decoder.onnx`` rewritten, same inputs and
outputs (names, layouts, the per-layer buffers of ``contract/decoding.py``), so the decoding code and
the service take it unchanged. The rewrite:

- onnxruntime's transformer optimizer (``onnxruntime.transformers``, model type ``bart``): residual
  Add + LayerNormalization -> ``SkipLayerNormalization``, the erf GELU with its bias -> ``BiasGelu``;
- each layer's cross-attention (query projection to output before the ``proj`` MatMul) ->
  ``com.microsoft.MultiHeadAttention`` on the encoder's (B, H, S, Dh) keys/values, the source mask
  as an additive bias computed once per step (a decoder whose cross-attention takes a row per request,
  ``export/group_cross.py``, keeps that form: the kernel wants a key/value row per query row);
- with ``--self-attention``, the self-attention over the cache buffer too (``past_key``/``past_value``
  in, the new position's key/value still output as ``new_keys_i``/``new_values_i``); onnxruntime's
  kernel then concatenates the whole buffer with the new position at every step (its ``present``).

The prefix graph (attention maps) and the encoder are left as they are. The variant is refused unless
greedy decoding of ``--sentences`` gives the unfused entry's tokens exactly, with per-step
log-probabilities within ``LOG_PROB_TOL``; the manifest records that parity and the number of nodes
onnxruntime runs per step (after its own ``ORT_ENABLE_ALL`` optimisation) before and after.
Whether it is faster is measured by ``benchmarks/bench_decoder_step.py`` and ``bench_ctranslate2``.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from contract.decoding import DecoderSpec, greedy, session_fn
from contract.manifest import TRANSLATION, load_entry, read_manifest
from contract.tokenizer import Tokenizer
from export.common import ExportError, StagedEntry, cpu_session, graph_io, max_abs_diff, now_iso
from export.shared_weights import record_weights, share_weights
from model.cli import CliError, run_cli

LOG_PROB_TOL = 1e-4  # as the export's parity with PyTorch
SENTENCES = Path(__file__).resolve().parent.parent / "benchmarks" / "translate_sentences.txt"
METHOD = "decoder step in onnxruntime contrib ops (SkipLayerNormalization, BiasGelu, MultiHeadAttention)"
log = logging.getLogger(__name__)


class _Graph:
    """Who produces and who consumes each tensor of a graph, for matching subgraphs."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model, self.g = model, model.graph
        self.producer = {o: n for n in self.g.node for o in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for n in self.g.node:
            for i in n.input:
                self.consumers.setdefault(i, []).append(n)
        self.consts = {  # the graph's own constants (parameters kept in an external file are not read)
            i.name: numpy_helper.to_array(i) for i in self.g.initializer if i.data_location != onnx.TensorProto.EXTERNAL
        }

    def up(self, name: str, op: str) -> onnx.NodeProto | None:
        n = self.producer.get(name)
        return n if n is not None and n.op_type == op else None

    def down(self, name: str, op: str) -> onnx.NodeProto | None:
        found = [n for n in self.consumers.get(name, []) if n.op_type == op]
        return found[0] if len(found) == 1 else None

    def scalar(self, name: str) -> float | None:
        value = self.consts.get(name)
        return float(value) if value is not None and value.size == 1 else None


def _chain(graph: _Graph, name: str, ops: list[str]) -> list[onnx.NodeProto] | None:
    """The nodes producing ``name`` through ``ops`` (nearest first), each feeding the next by input 0."""
    nodes = []
    for op in ops:
        n = graph.up(name, op)
        if n is None:
            return None
        nodes.append(n)
        name = n.input[0]
    return nodes


def _attention_tail(graph: _Graph, context: str) -> list[onnx.NodeProto] | None:
    """(B, H, 1, Dh) -> Transpose -> Reshape (B, 1, D): the nodes merging the heads of ``context``."""
    t = graph.down(context, "Transpose")
    r = graph.down(t.output[0], "Reshape") if t is not None else None
    return [t, r] if r is not None else None


def _cross_attention(graph: _Graph, layer: int) -> tuple[list[onnx.NodeProto], str, float, str] | None:
    """Layer ``layer``'s cross-attention as exported: softmax(q * scale @ K^T masked) @ V, heads merged.
    Returns its nodes, the (B, 1, D) query, the scale, and the merged (B, 1, D) output."""
    pv = graph.down(f"cross_values_{layer}", "MatMul")
    up = _chain(graph, pv.input[0], ["Softmax", "Where"]) if pv is not None else None
    scores = graph.up(up[1].input[2], "MatMul") if up is not None else None  # Where(masked, lowest, scores)
    if scores is None:
        return None
    softmax, where = up
    mask = _chain(graph, where.input[0], ["Not", "Unsqueeze"])
    query = _chain(graph, scores.input[0], ["Mul", "Transpose", "Reshape"])
    keys = graph.up(scores.input[1], "Transpose")
    tail = _attention_tail(graph, pv.output[0])
    if None in (mask, query, keys, tail) or mask[1].input[0] != "src_mask" or keys.input[0] != f"cross_keys_{layer}":
        return None
    scale = graph.scalar(query[0].input[1])
    if scale is None:
        return None
    return [pv, softmax, where, scores, keys, *query, *tail], query[2].input[0], scale, tail[1].output[0]


def _self_attention(graph: _Graph, layer: int) -> tuple[list[onnx.NodeProto], list[str], float, str] | None:
    """Layer ``layer``'s self-attention over the cache buffer as exported (``Attention.attend_cached``):
    the buffer's and the new position's scores joined, softmax, both halves times their values, summed.
    Returns its nodes, the (B, 1, D) query, key and value, the scale, and the merged output."""
    past = graph.down(f"past_values_{layer}", "MatMul")
    up = _chain(graph, past.input[0], ["Slice", "Softmax", "Concat"]) if past is not None else None
    total = graph.down(past.output[0], "Add") if past is not None else None
    if up is None or total is None:
        return None
    joined = up[2]
    new = graph.up(next(i for i in total.input if i != past.output[0]), "MatMul")
    where = graph.up(joined.input[0], "Where")
    scores = graph.up(where.input[2], "MatMul") if where is not None else None
    new_scores = graph.up(joined.input[1], "MatMul")
    if None in (new, scores, new_scores) or graph.up(new.input[0], "Slice") is None:
        return None
    query = _chain(graph, scores.input[0], ["Mul", "Transpose", "Reshape"])
    keys = [graph.up(scores.input[1], "Transpose"), graph.up(new_scores.input[1], "Transpose")]
    kv = [_chain(graph, f"new_{kind}_{layer}", ["Transpose", "Reshape"]) for kind in ("keys", "values")]
    tail = _attention_tail(graph, total.output[0])
    mask = _chain(graph, where.input[0], ["Not", "Unsqueeze"])
    if None in (query, tail, mask, *keys, *kv) or mask[1].input[0] != "cache_mask":
        return None
    scale = graph.scalar(query[0].input[1])
    if scale is None:
        return None
    nodes = [past, total, new, graph.up(new.input[0], "Slice"), *up, where, scores, new_scores, *keys, *query, *tail]
    return nodes, [query[2].input[0], kv[0][1].input[0], kv[1][1].input[0]], scale, tail[1].output[0]


def _key_bias(mask: str, name: str) -> list[onnx.NodeProto]:
    """(B, T) bool -> (B, 1, 1, T) float: 0 where attending is allowed, the lowest float elsewhere."""
    return [
        helper.make_node("Unsqueeze", [mask, "fuse_axes_1_2"], [f"{name}_mask"]),
        helper.make_node("Where", [f"{name}_mask", "fuse_zero", "fuse_lowest"], [name]),
    ]


def fuse_attention(model: onnx.ModelProto, heads: int, self_attention: bool) -> dict[str, int]:
    """Rewrite each layer's cross-attention (and with ``self_attention`` its self-attention) of a decoder
    step graph into ``MultiHeadAttention``, in place; returns how many of each it fused."""
    graph = _Graph(model)
    layers = sum(1 for i in graph.g.input if i.name.startswith("past_keys_"))
    found: dict[str, list] = {"cross_attention": [], "self_attention": []}
    for layer in range(layers):
        if (cross := _cross_attention(graph, layer)) is not None:
            nodes, query, scale, out = cross
            inputs = [query, f"cross_keys_{layer}", f"cross_values_{layer}", "", "", "fuse_cross_bias"]
            found["cross_attention"].append((nodes, inputs, [out], scale))
        if self_attention and (own := _self_attention(graph, layer)) is not None:
            nodes, qkv, scale, out = own
            inputs = [*qkv, "", "", "fuse_self_bias", f"past_keys_{layer}", f"past_values_{layer}"]
            found["self_attention"].append(
                (nodes, inputs, [out, f"fuse_present_k{layer}", f"fuse_present_v{layer}"], scale)
            )
    prelude = _key_bias("src_mask", "fuse_cross_bias") if found["cross_attention"] else []
    if found["self_attention"]:  # the buffer's columns, then the new position (always attended)
        prelude += [
            helper.make_node("Slice", ["cache_mask", "fuse_0", "fuse_1", "fuse_1"], ["fuse_first_column"]),
            helper.make_node("Or", ["fuse_first_column", "fuse_true"], ["fuse_new_column"]),
            helper.make_node("Concat", ["cache_mask", "fuse_new_column"], ["fuse_self_mask"], axis=1),
            *_key_bias("fuse_self_mask", "fuse_self_bias"),
        ]
    replaced: dict[int, onnx.NodeProto] = {}  # the last node of each subgraph (by id) -> its fused node
    removed = set()
    for kind, matches in found.items():
        for nodes, inputs, outputs, scale in matches:
            name = f"fused_{kind}_{outputs[0]}"
            fused = helper.make_node(
                "MultiHeadAttention", inputs, outputs, name, domain="com.microsoft", num_heads=heads, scale=scale
            )
            replaced[id(graph.producer[outputs[0]])] = fused
            removed |= {id(n) for n in nodes}
    kept = [replaced.get(id(n), n) for n in graph.g.node if id(n) not in removed or id(n) in replaced]
    del graph.g.node[:]
    graph.g.node.extend(prelude + kept)
    lowest = np.finfo(np.float32).min
    graph.g.initializer.extend(
        numpy_helper.from_array(np.asarray(v, dtype), name)
        for name, v, dtype in [
            ("fuse_axes_1_2", [1, 2], np.int64),
            ("fuse_zero", 0.0, np.float32),
            ("fuse_lowest", lowest, np.float32),
            ("fuse_0", [0], np.int64),
            ("fuse_1", [1], np.int64),
            ("fuse_true", True, np.bool_),
        ]
    )
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return {kind: len(matches) for kind, matches in found.items()} | {"layers": layers}


def fuse_decoder(source: Path, target: Path, heads: int, dim: int, self_attention: bool = False) -> dict[str, int]:
    """Write the fused step graph of ``source`` to ``target`` (weights inline); returns what was fused."""
    from onnxruntime.transformers.optimizer import optimize_model

    optimized = optimize_model(
        str(source), model_type="bart", num_heads=heads, hidden_size=dim, opt_level=0, use_gpu=False
    ).model
    counts = fuse_attention(optimized, heads, self_attention)
    if not counts["cross_attention"] and not grouped(optimized):
        raise ExportError(f"{source}: no cross-attention of the exported form found to fuse")
    dead = onnx.utils.Extractor(optimized).extract_model(
        [i.name for i in optimized.graph.input], [o.name for o in optimized.graph.output]
    )  # drops what the rewrite left unused (the Not/Unsqueeze of the masks)
    onnx.save(dead, str(target))
    ops = [n.op_type for n in dead.graph.node]
    return counts | {op: ops.count(op) for op in ("SkipLayerNormalization", "BiasGelu", "MultiHeadAttention")}


def grouped(model: onnx.ModelProto) -> bool:
    """Whether the step graph takes a cross-attention row per request (``export/group_cross.py``): its
    cross-attention stays as it is (``MultiHeadAttention`` wants one key/value row per query row)."""
    mask = next((i for i in model.graph.input if i.name == "src_mask"), None)
    return mask is not None and mask.type.tensor_type.shape.dim[0].dim_param == "cross_rows"


def ort_nodes(path: Path) -> int:
    """Nodes onnxruntime runs per call of the graph on the CPU, after its own ORT_ENABLE_ALL optimisation."""
    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.optimized_model_filepath = str(Path(tmp) / "optimized.onnx")
        opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", "weights.bin")
        opts.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        opts.log_severity_level = 3  # its warning that an optimised model is specific to this machine
        ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        return len(onnx.load(opts.optimized_model_filepath, load_external_data=False).graph.node)


def parity(entry: Path, fused_decoder: Path, sentences: list[str]) -> dict:
    """Greedy decoding of ``sentences`` through the entry's decoder and the fused one (same encoder)."""
    m = load_entry(entry).manifest
    tok, spec = Tokenizer.load(entry / m.tokenizer.file), DecoderSpec.from_manifest(m)
    encoder = session_fn(cpu_session(entry / m.graph("encoder").file))
    sources = tok.encode_batch(sentences, add_eos=True)
    ref = greedy(encoder, session_fn(cpu_session(entry / m.graph("decoder").file)), sources, spec, record=True)
    got = greedy(encoder, session_fn(cpu_session(fused_decoder)), sources, spec, record=True)
    drift = max(max_abs_diff(a, b) for r, g in zip(ref, got) for a, b in zip(r.step_log_probs, g.step_log_probs))
    same = sum(r.tokens == g.tokens for r, g in zip(ref, got))
    return {"sentences": len(sources), "identical_greedy": same, "max_abs_log_probs": drift, "tolerance": LOG_PROB_TOL}


def write_fused(
    entry: Path, repository: Path, name: str, version: str, force: bool, sentences: list[str], self_attention: bool
) -> tuple[Path, dict]:
    """The fused variant of ``entry`` as ``<repository>/<name>/<version>``, refused without parity."""
    manifest = read_manifest(entry)
    cfg, decoder = manifest["model"]["config"], manifest["graphs"]["decoder"]["file"]
    with StagedEntry(repository, name, version, force) as stage:
        graphs = list(dict.fromkeys(g["file"] for g in manifest["graphs"].values()))
        fused = fuse_decoder(entry / decoder, stage.dir / decoder, cfg["heads"], cfg["dim"], self_attention)
        for file in manifest["files"]:  # the other graphs (pointing into weights.bin), the tokenizer
            if file != decoder:
                shutil.copy(entry / file, stage.dir / file)
        share_weights(stage.dir, graphs)  # weights.bin rewritten: each parameter of the three graphs once
        report = parity(entry, stage.dir / decoder, sentences)
        if report["identical_greedy"] != report["sentences"] or report["max_abs_log_probs"] > LOG_PROB_TOL:
            raise ExportError(f"the fused decoder drifts from {entry}: {report}")
        nodes = {"before": ort_nodes(entry / decoder), "after": ort_nodes(stage.dir / decoder)}
        new = {k: v for k, v in manifest.items() if k not in ("schema_version", "files")}
        new["graphs"]["decoder"] = {"file": decoder, **graph_io(stage.dir / decoder)}
        new["evaluation"] = {**manifest["evaluation"], "vs_unfused": report}
        fusion = {"precision": "fp32", "method": METHOD, "from": f"{manifest['name']}/{manifest['version']}"}
        new.update(name=name, version=version, created_at=now_iso(), variant=fusion)
        new["fusion"] = {"fused": fused, "decoder_nodes_after_ort_optimisation": nodes}
        record_weights(new, stage.dir)
        return stage.commit(new), new["fusion"] | {"parity": report}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m export.fuse", description=__doc__.splitlines()[0])
    p.add_argument("--entry", type=Path, required=True, help="a translator entry, e.g. models/translator/3")
    p.add_argument("--repository", type=Path, help="default: the entry's repository")
    p.add_argument("--name", help="default: <name>-fused")
    p.add_argument("--version", help="default: the entry's version")
    p.add_argument("--force", action="store_true", help="replace an existing variant")
    p.add_argument("--self-attention", action="store_true", help="fuse the self-attention over the cache too")
    p.add_argument("--sentences", type=Path, default=SENTENCES, help="parity sentences, one a line")
    args = p.parse_args(argv)
    m = load_entry(args.entry).manifest
    if m.task != TRANSLATION:
        raise CliError(f"{args.entry} is a {m.task!r} entry: only a translator's decoder is fused")
    sentences = [s for s in args.sentences.read_text(encoding="utf-8").splitlines() if s.strip()]
    final, report = write_fused(
        args.entry,
        args.repository or args.entry.parent.parent,
        args.name or f"{m.name}-fused",
        args.version or m.version,
        args.force,
        sentences,
        args.self_attention,
    )
    nodes, par = report["decoder_nodes_after_ort_optimisation"], report["parity"]
    print(
        f"wrote {final}: fused {report['fused']}; decoder nodes after onnxruntime's optimisation "
        f"{nodes['before']} -> {nodes['after']}; greedy identical {par['identical_greedy']}/{par['sentences']}, "
        f"max |dlog_probs| {par['max_abs_log_probs']:.1e}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    run_cli(main)
