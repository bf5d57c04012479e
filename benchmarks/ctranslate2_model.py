"""Our translator's weights as a CTranslate2 model, for the benchmark's "bar to beat" comparison.

CTranslate2 has no converter for our checkpoints, but the model is a standard pre-norm Transformer
(the architecture of CTranslate2's ``TransformerSpec``): the weights are copied one to one (q/k/v
fused as CTranslate2 stores them), our sinusoidal table is given as its position encodings, GELU
(erf) is the activation, LayerNorm epsilon is torch's 1e-5, and the vocabulary is the tokenizer's
pieces, so CTranslate2 decodes exactly our model. ``parity`` checks that on real sentences.
Needs torch (to read the checkpoint) and ``pip install ctranslate2``; the service needs neither.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def convert(checkpoint: Path, out_dir: Path) -> Path:
    import ctranslate2
    import torch
    from ctranslate2.specs import common_spec, transformer_spec

    from contract.tokenizer import Tokenizer
    from model.seq2seq import sinusoidal

    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=False)
    cfg, sd = ckpt["config"], {k: v.numpy() for k, v in ckpt["state_dict"].items()}
    if cfg["norm"] != "pre":
        raise ValueError("only pre-norm translators map onto CTranslate2's TransformerSpec")
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg["encoder_layers"], cfg["decoder_layers"]),
        cfg["heads"],
        pre_norm=True,
        activation=common_spec.Activation.GELU,
    )
    positions = sinusoidal(torch.arange(cfg["max_positions"])[None], cfg["dim"])[0].numpy()

    def linear(target, name: str, *parts: str) -> None:
        target.weight = np.concatenate([sd[f"{name}.{p}.weight"] for p in parts])
        target.bias = np.concatenate([sd[f"{name}.{p}.bias"] for p in parts])

    def norm(target, name: str) -> None:
        target.gamma, target.beta = sd[f"{name}.weight"], sd[f"{name}.bias"]

    def ffn(target, name: str, norm_name: str) -> None:
        norm(target.layer_norm, norm_name)
        linear(target.linear_0, f"{name}.ffn", "fc1")
        linear(target.linear_1, f"{name}.ffn", "fc2")

    for side, table in (("encoder", "src_embed"), ("decoder", "tgt_embed")):
        s = getattr(spec, side)
        (s.embeddings[0] if isinstance(s.embeddings, list) else s.embeddings).weight = sd[f"{table}.weight"]
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
    spec.decoder.projection.weight = sd["out.weight"]
    spec.config.layer_norm_epsilon = 1e-5
    tok = Tokenizer.from_bytes(ckpt["tokenizer"]["model"])
    pieces = tok.pieces(range(tok.vocab_size))
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    spec.config.bos_token, spec.config.eos_token, spec.config.unk_token = pieces[1], pieces[2], pieces[3]
    spec.config.decoder_start_token = pieces[1]
    spec.validate()
    spec.optimize(quantization=None)
    out_dir.mkdir(parents=True, exist_ok=True)
    spec.save(str(out_dir))
    ctranslate2.Translator(str(out_dir))  # loads: the model is complete
    return out_dir


def translator(model_dir: Path, threads: int):
    import ctranslate2

    return ctranslate2.Translator(str(model_dir), device="cpu", inter_threads=1, intra_threads=threads)


def decode(ct2, pieces: list[list[str]], tokens: int | None, beam: int = 1, max_length: int = 256) -> list[list[str]]:
    """Translate source pieces (eos included); ``tokens`` fixes the length (end-of-sentence ignored)."""
    fixed = (
        {"min_decoding_length": tokens, "max_decoding_length": tokens}
        if tokens
        else {"max_decoding_length": max_length}
    )
    out = ct2.translate_batch(pieces, beam_size=beam, length_penalty=1.0, **fixed)
    return [r.hypotheses[0] for r in out]
