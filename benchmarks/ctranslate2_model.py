"""Our translator as a CTranslate2 model, built from the shipped model repository alone.

CTranslate2 is what a user would pick to serve a Transformer translator fast, so the benchmarks
measure our decoding against it (``benchmarks/bench_ctranslate2.py``). The model is a standard
pre-norm Transformer (the architecture of CTranslate2's ``TransformerSpec``): the weights are copied
one to one (q/k/v fused as CTranslate2 stores them), our sinusoidal table is given as its position
encodings, GELU (erf) is the activation, the LayerNorm epsilon is the graphs' own, and the
vocabulary is the tokenizer's pieces, so CTranslate2 decodes exactly our model;
:func:`greedy_agreement` checks that on real sentences.

The weights come from the entry's ``encoder.onnx`` and ``decoder.onnx`` (``model/onnx_weights.py``),
not from a training checkpoint, so anyone with the repository can rerun the comparison. Needs
numpy, onnx and ``ctranslate2`` (the dev install has them); no torch. The service imports none of this.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from contract.decoding import DecodeRequest, DecoderSpec, Graph, run_to_end
from contract.manifest import load_entry
from contract.tokenizer import Tokenizer
from model.onnx_weights import WeightNotIdentified, read_weights


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
