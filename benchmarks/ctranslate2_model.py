"""Our translator as a CTranslate2 model, built from the shipped model repository alone.

CTranslate2 is what a user would pick to serve a Transformer translator fast, so the benchmarks
measure our decoding against it (``benchmarks/bench_ctranslate2.py``). The model is a standard
pre-norm Transformer (the architecture of CTranslate2's ``TransformerSpec``): the weights are copied
one to one (q/k/v fused as CTranslate2 stores them), our sinusoidal table is given as its position
encodings, GELU (erf) is the activation, the LayerNorm epsilon is the graphs' own, and the
vocabulary is the tokenizer's pieces, so CTranslate2 decodes exactly our model;
:func:`greedy_agreement` checks that on real sentences.

The weights come from the entry's ``encoder.onnx`` and ``decoder.onnx`` (:func:`read_weights`),
not from a training checkpoint, so anyone with the repository can rerun the comparison. Biases,
norms and embeddings keep their PyTorch names there, but the exporter constant-folds each linear
layer's weight into a transposed initializer with a generated name (``val_24``); its name is
recovered from the graph: the ``MatMul`` that multiplies by it feeds one ``Add`` of a ``<layer>.bias``
initializer, so it is ``<layer>.weight``. A weight no rule identifies is an error
(:class:`WeightNotIdentified`), never a guess. Needs numpy, onnx and ``ctranslate2`` (the dev
install has them); no torch. The service imports none of this.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from contract.decoding import DecodeRequest, DecoderSpec, Graph, run_to_end
from contract.manifest import Entry, load_entry
from contract.tokenizer import Tokenizer

PREFIX = "model."  # the exporter's prefix on every parameter name (the exported module wraps the model)


class WeightNotIdentified(ValueError):
    """A weight matrix in the graphs that no rule maps to its PyTorch parameter, or a parameter the
    CTranslate2 model needs that the graphs do not hold."""


# ---- the weights, from the ONNX graphs ---------------------------------------------------------


def graph_weights(model, graph: str = "graph") -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], set[float]]:
    """One ONNX graph's parameters: (PyTorch name -> array, PyTorch layout; embedding tables by the
    graph input that indexes them; the LayerNorm epsilons).

    - An initializer whose name starts with ``model.`` keeps its name (biases, norms, and a matrix the
      exporter left unfolded, e.g. the tied output projection multiplied through ``Gemm``).
    - Any other 2-D initializer multiplied by ``MatMul`` or ``Gemm`` (as B) is a folded weight: it
      is named ``<layer>.weight`` after the ``<layer>.bias`` that the product's only consumer, an
      ``Add`` (or the ``Gemm``'s own C input), adds to it, with a bias as long as its output width.
    - A 2-D initializer read by a ``Gather`` indexed by a graph input is an embedding table.
    Layouts: ``MatMul`` computes x @ B, so the PyTorch weight is B transposed; ``Gemm`` with
    ``transB=1`` holds it as is.
    """
    from onnx import numpy_helper

    g = model.graph
    inits = {i.name: i for i in g.initializer}
    inputs = {i.name for i in g.input}
    consumers: dict[str, list] = {}
    for node in g.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    array = lambda name: numpy_helper.to_array(inits[name])
    named = {n[len(PREFIX) :]: array(n) for n in inits if n.startswith(PREFIX)}
    weights = {n: a for n, a in named.items() if a.ndim == 1}
    embeddings: dict[str, np.ndarray] = {}
    epsilons: set[float] = set()

    def bias_of(node) -> str | None:
        """The ``model.<layer>.bias`` initializer added to the node's product, if exactly one is."""
        candidates = [node.input[2]] if node.op_type == "Gemm" and len(node.input) > 2 else []
        users = consumers.get(node.output[0], [])
        if not candidates and len(users) == 1 and users[0].op_type == "Add":
            candidates = [x for x in users[0].input if x != node.output[0]]
        found = [c for c in candidates if c.startswith(PREFIX) and c.endswith(".bias") and c in inits]
        return found[0] if len(found) == 1 else None

    for node in g.node:
        if node.op_type == "LayerNormalization":
            epsilons.add(next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5))
        if node.op_type == "Gather" and node.input[0] in inits and node.input[1] in inputs:
            embeddings[node.input[1]] = array(node.input[0])
            continue
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2 or node.input[1] not in inits:
            continue
        b = array(node.input[1])
        if b.ndim != 2:
            continue
        attrs = {a.name: a.i for a in node.attribute if a.name in ("transA", "transB")}
        if attrs.get("transA", 0):
            raise WeightNotIdentified(f"{graph}: Gemm node {node.name!r} transposes its input; not a linear layer")
        weight = b if node.op_type == "Gemm" and attrs.get("transB", 0) else b.T  # (out, in), PyTorch's layout
        if node.input[1].startswith(PREFIX):
            name = node.input[1][len(PREFIX) :]
        elif (bias := bias_of(node)) is not None and array(bias).shape == weight.shape[:1]:
            name = bias[len(PREFIX) : -len(".bias")] + ".weight"
        else:
            raise WeightNotIdentified(
                f"{graph}: cannot identify weight {node.input[1]!r} {tuple(b.shape)} multiplied by "
                f"{node.op_type} node {node.name!r}: its product is not added to a single "
                f"'{PREFIX}<layer>.bias' initializer of length {weight.shape[0]}, and its name is not a parameter's"
            )
        if name in weights and not np.array_equal(weights[name], weight):
            raise WeightNotIdentified(f"{graph}: two different matrices identify as {name!r}")
        weights[name] = weight
    return weights, embeddings, epsilons


def read_weights(entry: Entry) -> tuple[dict, dict[str, np.ndarray], float]:
    """The translator's config (manifest) and parameters under their PyTorch names, and its LayerNorm
    epsilon, read from the entry's encoder and decoder graphs. ``src_embed.weight`` and
    ``tgt_embed.weight`` are the tables the graphs gather source and target tokens from (with tied
    embeddings, both are ``out.weight``)."""
    import onnx

    m = entry.manifest
    cfg = m.model.get("config")
    if not cfg or m.task != "translation":
        raise ValueError(f"{entry.path}: not a translation entry with a model config in its manifest")
    weights: dict[str, np.ndarray] = {}
    epsilons: set[float] = set()
    for graph, tokens in (("encoder", "src_ids"), ("decoder", "tokens")):
        path = entry.path / m.graph(graph).file
        found, embeddings, eps = graph_weights(onnx.load(str(path)), str(path))
        for name, value in found.items():
            if name in weights and not np.array_equal(weights[name], value):
                raise WeightNotIdentified(f"the encoder and the decoder hold different {name!r}")
            weights[name] = value
        if tokens not in embeddings:
            raise WeightNotIdentified(f"{path}: no embedding table gathered by its input {tokens!r}")
        weights[f"{'src' if graph == 'encoder' else 'tgt'}_embed.weight"] = embeddings[tokens]
        epsilons |= eps
    if len(epsilons) != 1:
        raise ValueError(f"expected one LayerNorm epsilon in the graphs, found {sorted(epsilons)}")
    return cfg, weights, epsilons.pop()


def sinusoidal(positions: int, dim: int) -> np.ndarray:
    """(positions, dim) float32: sin(pos / 10000^(2i/d)) then cos(...) halves, as ``model.seq2seq.sinusoidal``."""
    half = dim // 2
    inv_freq = np.exp(np.arange(half, dtype=np.float32) * np.float32(-np.log(10000.0) / half))
    angles = np.arange(positions, dtype=np.float32)[:, None] * inv_freq  # (T, half)
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1).astype(np.float32)


# ---- the CTranslate2 model ---------------------------------------------------------------------


def convert(entry_dir: Path, out_dir: Path) -> Path:
    """Write the CTranslate2 model (float32) of a translator entry of the model repository into ``out_dir``.

    Quantisation is chosen when loading it (:func:`translator`'s ``compute_type``)."""
    import ctranslate2
    from ctranslate2.specs import common_spec, transformer_spec

    entry = load_entry(Path(entry_dir))
    cfg, sd, epsilon = read_weights(entry)
    if cfg["norm"] != "pre":
        raise ValueError("only pre-norm translators map onto CTranslate2's TransformerSpec")

    taken: set[str] = set()

    def take(name: str) -> np.ndarray:
        taken.add(name)
        if name not in sd:
            module = name.rsplit(".", 2)[0] + "."
            raise WeightNotIdentified(
                f"{entry.path}: no parameter {name!r} identified in the graphs (found under {module!r}: "
                f"{sorted(n for n in sd if n.startswith(module))})"
            )
        return sd[name]

    spec = transformer_spec.TransformerSpec.from_config(
        (cfg["encoder_layers"], cfg["decoder_layers"]),
        cfg["heads"],
        pre_norm=True,
        activation=common_spec.Activation.GELU,
    )
    positions = sinusoidal(cfg["max_positions"], cfg["dim"])

    def linear(target, name: str, *parts: str) -> None:
        target.weight = np.concatenate([take(f"{name}.{p}.weight") for p in parts])
        target.bias = np.concatenate([take(f"{name}.{p}.bias") for p in parts])

    def norm(target, name: str) -> None:
        target.gamma, target.beta = take(f"{name}.weight"), take(f"{name}.bias")

    def ffn(target, name: str, norm_name: str) -> None:
        norm(target.layer_norm, norm_name)
        linear(target.linear_0, f"{name}.ffn", "fc1")
        linear(target.linear_1, f"{name}.ffn", "fc2")

    for side, table in (("encoder", "src_embed"), ("decoder", "tgt_embed")):
        s = getattr(spec, side)
        (s.embeddings[0] if isinstance(s.embeddings, list) else s.embeddings).weight = take(f"{table}.weight")
        s.scale_embeddings = True
        s.position_encodings.encodings = positions
        norm(s.layer_norm, f"{side}_norm")
    for i, layer in enumerate(spec.encoder.layer):
        name = f"encoder.{i}"
        norm(layer.self_attention.layer_norm, f"{name}.sub1.norm")
        linear(layer.self_attention.linear[0], f"{name}.attn", "q", "k", "v")
        linear(layer.self_attention.linear[1], f"{name}.attn", "proj")
        ffn(layer.ffn, name, f"{name}.sub2.norm")
    for i, layer in enumerate(spec.decoder.layer):
        name = f"decoder.{i}"
        norm(layer.self_attention.layer_norm, f"{name}.sub1.norm")
        linear(layer.self_attention.linear[0], f"{name}.self_attn", "q", "k", "v")
        linear(layer.self_attention.linear[1], f"{name}.self_attn", "proj")
        norm(layer.attention.layer_norm, f"{name}.sub2.norm")
        linear(layer.attention.linear[0], f"{name}.cross_attn", "q")
        linear(layer.attention.linear[1], f"{name}.cross_attn", "k", "v")
        linear(layer.attention.linear[2], f"{name}.cross_attn", "proj")
        ffn(layer.ffn, name, f"{name}.sub3.norm")
    spec.decoder.projection.weight = take("out.weight")
    if unused := sorted(set(sd) - taken):
        raise WeightNotIdentified(f"{entry.path}: parameters the CTranslate2 model has no place for: {unused}")
    spec.config.layer_norm_epsilon = epsilon
    tok = Tokenizer.load(entry.path / entry.manifest.tokenizer.file)
    pieces = tok.pieces(range(tok.vocab_size))
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    spec.config.bos_token, spec.config.eos_token = pieces[tok.bos_id], pieces[tok.eos_id]
    spec.config.unk_token = pieces[tok.unk_id]
    spec.config.decoder_start_token = pieces[tok.bos_id]
    spec.validate()
    spec.optimize(quantization=None)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec.save(str(out_dir))
    ctranslate2.Translator(str(out_dir))  # loads: the model is complete
    return out_dir


def translator(model_dir: Path, threads: int, compute_type: str = "float32"):
    """A CPU translator running one batch at a time on ``threads`` intra-op threads; ``compute_type``
    ``int8`` quantises the weights when loading."""
    import ctranslate2

    return ctranslate2.Translator(
        str(model_dir), device="cpu", compute_type=compute_type, inter_threads=1, intra_threads=threads
    )


def decode(ct2, pieces: list[list[str]], tokens: int | None, beam: int = 1, max_length: int = 256) -> list[list[str]]:
    """Translate source pieces (eos included); ``tokens`` fixes the length (end-of-sentence ignored)."""
    fixed = (
        {"min_decoding_length": tokens, "max_decoding_length": tokens}
        if tokens
        else {"max_decoding_length": max_length}
    )
    out = ct2.translate_batch(pieces, beam_size=beam, length_penalty=1.0, **fixed)
    return [r.hypotheses[0] for r in out]


def greedy_agreement(
    ct2, encoder: Graph, decoder: Graph, spec: DecoderSpec, tok: Tokenizer, texts: Sequence[str]
) -> list[bool]:
    """For each text: is CTranslate2's greedy translation token for token ours (``contract.decoding``,
    all texts in one batch; CTranslate2 one at a time), at our default length limit?"""
    sources = [tok.encode(t, add_eos=True) for t in texts]
    ours = run_to_end(encoder, decoder, [DecodeRequest(s, spec.max_length(len(s))) for s in sources], spec)
    return [
        tok.pieces(r.results()[0].tokens) == decode(ct2, [tok.pieces(s)], None, max_length=spec.max_length(len(s)))[0]
        for r, s in zip(ours, sources)
    ]
