"""A translator entry's parameters under their PyTorch names, read from its ONNX graphs alone.

Used to convert a shipped entry for another runtime (``benchmarks/ctranslate2_model.py``) and to
start training from a shipped entry (``python -m model.train_translator --init-from``), so that
neither needs the training checkpoint the entry was exported from. Biases, norms and embeddings
keep their PyTorch names in the graphs, but the exporter constant-folds each linear layer's weight
into a transposed initializer with a generated name (``val_24``); its name is recovered from the
graph: the ``MatMul`` that multiplies by it feeds one ``Add`` of a ``<layer>.bias`` initializer, so it
is ``<layer>.weight``. A weight no rule identifies is an error (:class:`WeightNotIdentified`), never
a guess. Needs numpy and onnx, not torch (the CTranslate2 benchmark runs without it). The service
imports none of this.
"""

from __future__ import annotations

import numpy as np

from contract.manifest import Entry

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
