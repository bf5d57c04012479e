"""A transformers ``MarianMTModel`` as our translator graphs, and its parity with transformers itself.

The graphs are computed from the checkpoint's own modules (projections, layer norms, feed-forward,
embeddings, ``lm_head`` and ``final_logits_bias``), written in the contract's signature rather than
transformers' (its cache classes do not export as our per-layer buffers with a ``cache_mask``):

- ``encoder``: ``src_ids``, ``src_mask`` -> ``memory``, ``cross_keys``/``cross_values`` (L, B, H, S, Dh)
  and ``encoder_attentions`` (B, Le, H, S, S);
- ``decoder``: one step against the buffers of ``contract/decoding.py`` -> ``log_probs`` and the new
  position's ``new_keys_i``/``new_values_i``;
- ``decoder_prefix``: a whole target prefix -> ``log_probs``, ``self_attentions``, ``cross_attentions``.

What is Marian's own is here, not in the service: token embeddings scaled by ``sqrt(d_model)`` when
``scale_embedding``; sinusoidal positions from 0 in Marian's layout (the sines of every position in the
first half of the vector, the cosines in the second, not interleaved: the checkpoint's own table is
used); post-layer-norm blocks; logits plus ``final_logits_bias``. Token ids the checkpoint's
generation config never lets ``generate()`` produce (``bad_words_ids`` of one token, as OPUS-MT
forbids ``<pad>``, and ``suppress_tokens``) get log-probability -inf in the graphs themselves, so the
service's greedy and beam search see the distribution ``generate()`` sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from contract.decoding import DecoderSpec, Graph, Hypothesis, beam_search, decoder_inputs, decoding_outputs, greedy
from export.common import ExportError, UnsupportedCheckpoint, max_abs_diff

ENCODER_INPUTS = ["src_ids", "src_mask"]
ENCODER_OUTPUTS = ["memory", "cross_keys", "cross_values", "encoder_attentions"]
PREFIX_INPUTS = ["tgt_ids", "cross_keys", "cross_values", "src_mask"]
PREFIX_OUTPUTS = ["log_probs", "self_attentions", "cross_attentions"]
LOG_PROB_TOL, ATTENTION_TOL = 1e-4, 1e-5
# generate() settings our decoding does not reproduce, with the value that means "off"
NEUTRAL = {
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "min_length": 0,
    "min_new_tokens": 0,
    "diversity_penalty": 0.0,
    "num_beam_groups": 1,
    "renormalize_logits": False,
    "forced_bos_token_id": None,
    "begin_suppress_tokens": None,
    "sequence_bias": None,
    "exponential_decay_length_penalty": None,
    "force_words_ids": None,
    "constraints": None,
}


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, t, d = x.shape
    return x.view(b, t, heads, d // heads).transpose(1, 2)  # (B, H, T, Dh)


def keys_values(attn: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T, D) -> the layer's keys and values (B, H, T, Dh)."""
    return split_heads(attn.k_proj(x), attn.num_heads), split_heads(attn.v_proj(x), attn.num_heads)


def attend(attn: nn.Module, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor):
    """transformers' eager attention: (output (B, T, D), probabilities (B, H, T, S))."""
    q = split_heads(attn.q_proj(x), attn.num_heads)  # (B, H, T, Dh)
    probs = (torch.matmul(q, keys.transpose(2, 3)) * attn.scaling + bias).softmax(dim=-1)  # (B, H, T, S)
    out = torch.matmul(probs, values).transpose(1, 2)  # (B, T, H, Dh)
    return attn.out_proj(out.reshape(x.shape[0], x.shape[1], -1)), probs


def key_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, K) bool, True = attend -> (B, 1, 1, K) additive bias: 0 or the dtype's minimum, as transformers adds."""
    return torch.where(mask, 0.0, torch.finfo(dtype).min).to(dtype)[:, None, None, :]


def feed_forward(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return layer.final_layer_norm(x + layer.fc2(layer.activation_fn(layer.fc1(x))))


def decoder_layer(layer, x, self_keys, self_values, self_bias, cross_keys, cross_values, cross_bias):
    """One post-layer-norm decoder block: (hidden (B, T, D), self (B, H, T, T'), cross (B, H, T, S))."""
    a, self_p = attend(layer.self_attn, x, self_keys, self_values, self_bias)
    x = layer.self_attn_layer_norm(x + a)
    c, cross_p = attend(layer.encoder_attn, x, cross_keys, cross_values, cross_bias)
    x = layer.encoder_attn_layer_norm(x + c)
    return feed_forward(layer, x), self_p, cross_p


class Scores(nn.Module):
    """Hidden states -> log-probabilities, with the suppressed ids at -inf."""

    def __init__(self, model: nn.Module, suppressed: list[int]) -> None:
        super().__init__()
        self.lm_head = model.lm_head
        self.register_buffer("bias", model.final_logits_bias.detach().clone())
        mask = torch.zeros(model.lm_head.out_features, dtype=torch.bool)
        mask[suppressed] = True
        self.register_buffer("suppressed", mask)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        log_probs = (self.lm_head(h) + self.bias).log_softmax(dim=-1)
        return log_probs.masked_fill(self.suppressed, float("-inf"))


class EncoderGraph(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.encoder = model.model.encoder
        self.cross = nn.ModuleList(layer.encoder_attn for layer in model.model.decoder.layers)

    def forward(self, src_ids: torch.Tensor, src_mask: torch.Tensor):
        enc = self.encoder
        x = enc.embed_tokens(src_ids) * enc.embed_scale + enc.embed_positions.weight[: src_ids.shape[1]]  # (B, S, D)
        bias = key_bias(src_mask, x.dtype)
        attentions = []
        for layer in enc.layers:
            a, probs = attend(layer.self_attn, x, *keys_values(layer.self_attn, x), bias)
            x = feed_forward(layer, layer.self_attn_layer_norm(x + a))
            attentions.append(probs)
        kv = [keys_values(attn, x) for attn in self.cross]
        cross_keys = torch.stack([k for k, _ in kv])  # (L, B, H, S, Dh)
        cross_values = torch.stack([v for _, v in kv])
        return x, cross_keys, cross_values, torch.stack(attentions, dim=1)  # attentions (B, Le, H, S, S)


class StepGraph(nn.Module):
    """One decoding step against the per-layer cache buffers of ``contract/decoding.py``."""

    def __init__(self, model: nn.Module, suppressed: list[int]) -> None:
        super().__init__()
        self.decoder = model.model.decoder
        self.scores = Scores(model, suppressed)
        self.layers = len(self.decoder.layers)
        self.inputs = decoder_inputs(self.layers)
        self.outputs = list(decoding_outputs(self.layers)["decoder"])

    def forward(self, tokens, positions, cache_mask, src_mask, *caches):
        n, dec = self.layers, self.decoder
        past_k, past_v, cross_k, cross_v = (caches[i * n : (i + 1) * n] for i in range(4))
        x = dec.embed_tokens(tokens) * dec.embed_scale + dec.embed_positions.weight[positions]  # (B, 1, D)
        self_mask = torch.cat([cache_mask, torch.ones_like(cache_mask[:, :1])], dim=1)  # past + this position
        self_bias, cross_bias = key_bias(self_mask, x.dtype), key_bias(src_mask, x.dtype)
        new_keys, new_values = [], []
        for i, layer in enumerate(dec.layers):
            k, v = keys_values(layer.self_attn, x)  # (B, H, 1, Dh)
            keys, values = torch.cat([past_k[i], k], dim=2), torch.cat([past_v[i], v], dim=2)
            x, _, _ = decoder_layer(layer, x, keys, values, self_bias, cross_k[i], cross_v[i], cross_bias)
            new_keys.append(k)
            new_values.append(v)
        return self.scores(x[:, 0]), *new_keys, *new_values


class PrefixGraph(nn.Module):
    """A whole target prefix at once (causal): log-probs of every position and its attention maps."""

    def __init__(self, model: nn.Module, suppressed: list[int]) -> None:
        super().__init__()
        self.decoder = model.model.decoder
        self.scores = Scores(model, suppressed)

    def forward(self, tgt_ids, cross_keys, cross_values, src_mask):
        dec = self.decoder
        t = tgt_ids.shape[1]
        x = dec.embed_tokens(tgt_ids) * dec.embed_scale + dec.embed_positions.weight[:t]  # (B, T, D)
        future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        self_bias = torch.where(future, torch.finfo(x.dtype).min, 0.0).to(x.dtype)[None, None]  # (1, 1, T, T)
        cross_bias = key_bias(src_mask, x.dtype)
        self_p, cross_p = [], []
        for i, layer in enumerate(dec.layers):
            keys, values = keys_values(layer.self_attn, x)
            x, s, c = decoder_layer(layer, x, keys, values, self_bias, cross_keys[i], cross_values[i], cross_bias)
            self_p.append(s)
            cross_p.append(c)
        return self.scores(x), torch.stack(self_p, dim=1), torch.stack(cross_p, dim=1)


def export_graphs(model: nn.Module, suppressed: list[int], folder, opset: int = 18) -> None:
    """``encoder.onnx``, ``decoder.onnx`` and ``decoder_prefix.onnx`` into ``folder``."""
    cfg = model.config
    layers, heads = cfg.decoder_layers, cfg.decoder_attention_heads
    head_dim = cfg.d_model // heads
    max_positions = cfg.max_position_embeddings
    batch = torch.export.Dim("batch", min=1, max=4096)
    src = torch.export.Dim("src_len", min=1, max=max_positions)
    past = torch.export.Dim("past_len", min=0, max=max_positions)
    tgt = torch.export.Dim("tgt_len", min=1, max=max_positions)
    b, s, p = 2, 5, 3
    ids = torch.randint(0, cfg.vocab_size, (b, s))
    mask = torch.ones(b, s, dtype=torch.bool)
    common = {"dynamo": True, "opset_version": opset, "external_data": False}
    torch.onnx.export(
        EncoderGraph(model).eval(),
        (ids, mask),
        input_names=ENCODER_INPUTS,
        output_names=ENCODER_OUTPUTS,
        dynamic_shapes={"src_ids": {0: batch, 1: src}, "src_mask": {0: batch, 1: src}},
        **common,
    ).save(str(folder / "encoder.onnx"))
    step = StepGraph(model, suppressed).eval()
    cache = [torch.zeros(b, heads, p, head_dim) for _ in range(2 * layers)]
    cross = [torch.zeros(b, heads, s, head_dim) for _ in range(2 * layers)]
    step_args = (
        torch.ones(b, 1, dtype=torch.long),
        torch.full((b, 1), p, dtype=torch.long),
        torch.ones(b, p, dtype=torch.bool),
        mask,
        *cache,
        *cross,
    )
    caches = tuple({0: batch, 2: past} for _ in range(2 * layers)) + tuple(
        {0: batch, 2: src} for _ in range(2 * layers)
    )
    torch.onnx.export(
        step,
        step_args,
        input_names=step.inputs,
        output_names=step.outputs,
        dynamic_shapes={
            "tokens": {0: batch},
            "positions": {0: batch},
            "cache_mask": {0: batch, 1: past},
            "src_mask": {0: batch, 1: src},
            "caches": caches,
        },
        **common,
    ).save(str(folder / "decoder.onnx"))
    stacked = torch.zeros(layers, b, heads, s, head_dim)
    kv = {1: batch, 3: src}
    torch.onnx.export(
        PrefixGraph(model, suppressed).eval(),
        (torch.ones(b, 4, dtype=torch.long), stacked, stacked.clone(), mask),
        input_names=PREFIX_INPUTS,
        output_names=PREFIX_OUTPUTS,
        dynamic_shapes={
            "tgt_ids": {0: batch, 1: tgt},
            "cross_keys": kv,
            "cross_values": kv,
            "src_mask": {0: batch, 1: src},
        },
        **common,
    ).save(str(folder / "decoder_prefix.onnx"))


@dataclass(frozen=True)
class Generation:
    """What the checkpoint's generation config asks of ``generate()``, as far as our decoding reproduces it."""

    decoder_start: int
    eos: int
    pad: int
    suppressed: list[int]  # never generated: -inf in the graphs' log_probs
    beam: int
    length_penalty: float
    early_stopping: bool | str
    forced_eos: int | None  # generate() forces it at its length limit; our decoding stops there unfinished


def generation_settings(folder: Path, config) -> Generation:
    """Read ``generation_config.json`` (or the model config); refuse a setting our decoding would not honour."""
    from transformers import GenerationConfig

    if (Path(folder) / "generation_config.json").is_file():
        gen = GenerationConfig.from_pretrained(folder, local_files_only=True)
    else:
        gen = GenerationConfig.from_model_config(config)
    unsupported = [f"{k}={v!r}" for k, off in NEUTRAL.items() if (v := getattr(gen, k, None)) not in (None, off)]
    bad_words = gen.bad_words_ids or []
    unsupported += [f"bad_words_ids entry {w} (only single tokens)" for w in bad_words if len(w) != 1]
    eos = gen.eos_token_id if gen.eos_token_id is not None else config.eos_token_id
    if isinstance(eos, list):
        if len(eos) != 1:
            unsupported.append(f"eos_token_id={eos} (one end token only)")
        eos = eos[0]
    if unsupported:
        raise UnsupportedCheckpoint(
            f"{folder}: generation settings our decoding does not reproduce: {', '.join(unsupported)}"
        )
    forced = gen.forced_eos_token_id
    start = gen.decoder_start_token_id if gen.decoder_start_token_id is not None else config.decoder_start_token_id
    return Generation(
        decoder_start=int(start),
        eos=int(eos),
        pad=int(config.pad_token_id),
        suppressed=sorted({int(w[0]) for w in bad_words} | {int(t) for t in gen.suppress_tokens or []}),
        beam=int(gen.num_beams or 1),
        length_penalty=float(gen.length_penalty if gen.length_penalty is not None else 1.0),
        early_stopping=gen.early_stopping if gen.early_stopping is not None else False,
        forced_eos=int(forced[0] if isinstance(forced, list) else forced) if forced is not None else None,
    )


def _generated(row: list[int], eos: int) -> tuple[list[int], bool]:
    """generate()'s output row -> (tokens, finished): the start token dropped, cut at the first eos."""
    row = row[1:]
    return (row[: row.index(eos)], True) if eos in row else (row, False)


def _same(ours: Hypothesis, theirs: tuple[list[int], bool], limit: int, gen: Generation) -> str | None:
    """ "identical", "forced_eos" (the same tokens, but generate() forced eos at the length limit where
    our decoding stops unfinished), or None."""
    tokens, finished = theirs
    if (ours.tokens, ours.finished) == (tokens, finished):
        return "identical"
    forced = gen.forced_eos is not None and finished and len(tokens) == limit - 1
    if forced and not ours.finished and len(ours.tokens) == limit and ours.tokens[:-1] == tokens:
        return "forced_eos"
    return None


def _finite_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Max |a - b| where both are finite; the -inf (suppressed) entries must be the same."""
    if not np.array_equal(np.isinf(a), np.isinf(b)):
        raise ExportError("the suppressed (-inf) log-probabilities differ from transformers'")
    finite = np.isfinite(a)
    return max_abs_diff(a[finite], b[finite])


@torch.no_grad()
def parity_report(
    model: nn.Module,
    hf_tokenizer,
    tokenizer,
    graphs: dict[str, Graph],
    sentences: list[str],
    spec: DecoderSpec,
    gen: Generation,
    beam: int = 4,
) -> dict:
    """Our tokenizer and graphs against transformers on real sentences: source ids, greedy tokens and text
    against ``generate(num_beams=1)``, encoder output and every attention map and log-probability
    against the model's own forward (teacher-forced on the greedy output), beam search against
    ``generate(num_beams=beam)`` with the checkpoint's ``early_stopping`` and with ``early_stopping=True``."""
    theirs_ids = [hf_tokenizer(s).input_ids for s in sentences]
    ours_ids = tokenizer.encode_batch(sentences, add_eos=True)
    report: dict = {
        "sentences": len(sentences),
        "identical_source_ids": sum(a == b for a, b in zip(ours_ids, theirs_ids)),
        "identical_tokens": 0,
        "identical_but_forced_eos": 0,
        "identical_text": 0,
        "first_mismatch": None,
        "max_abs_memory": 0.0,
        "max_abs_encoder_attention": 0.0,
        "max_abs_log_probs": 0.0,
        "max_abs_attention": 0.0,
        "prefix_vs_steps_max_abs": 0.0,
    }
    encoder, decoder = graphs["encoder"], graphs["decoder"]
    hyps = greedy(encoder, decoder, theirs_ids, spec, record=True)
    for i, (src, h) in enumerate(zip(theirs_ids, hyps)):
        limit = spec.max_length(len(src))
        src_t = torch.tensor([src])
        row = model.generate(src_t, num_beams=1, do_sample=False, max_length=limit + 1)[0].tolist()
        verdict = _same(h, _generated(row, gen.eos), limit, gen)
        if verdict == "identical":
            report["identical_tokens"] += 1
        elif verdict == "forced_eos":
            report["identical_but_forced_eos"] += 1
        elif report["first_mismatch"] is None:
            report["first_mismatch"] = {"index": i, "ours": h.tokens, "transformers": _generated(row, gen.eos)[0]}
        text = hf_tokenizer.decode(row, skip_special_tokens=True)
        report["identical_text"] += int(tokenizer.decode(h.tokens) == text)
        _forward_parity(report, model, src, h, graphs, spec)
    report["beam"] = _beam_parity(model, encoder, decoder, theirs_ids, spec, gen, beam)
    return report


def _forward_parity(report: dict, model, src: list[int], h: Hypothesis, graphs: dict[str, Graph], spec) -> None:
    """One sentence, teacher-forced on its greedy output: our encoder and prefix graphs vs transformers' forward."""
    ids = np.array([src], dtype=np.int64)
    mask = np.ones_like(ids, dtype=bool)
    tgt = np.array([[spec.bos_id, *h.tokens]], dtype=np.int64)
    enc = graphs["encoder"]({"src_ids": ids, "src_mask": mask})
    out = graphs["decoder_prefix"](
        {"tgt_ids": tgt, "cross_keys": enc["cross_keys"], "cross_values": enc["cross_values"], "src_mask": mask}
    )
    ref = model(input_ids=torch.from_numpy(ids), decoder_input_ids=torch.from_numpy(tgt), output_attentions=True)
    ref_log_probs = ref.logits.log_softmax(-1).numpy()
    ref_log_probs[..., np.isinf(out["log_probs"][0, 0])] = -np.inf  # the ids the graphs suppress
    pairs = {
        "max_abs_memory": [(enc["memory"], ref.encoder_last_hidden_state.numpy())],
        "max_abs_encoder_attention": [(enc["encoder_attentions"], torch.stack(ref.encoder_attentions, 1).numpy())],
        "max_abs_attention": [
            (out["self_attentions"], torch.stack(ref.decoder_attentions, 1).numpy()),
            (out["cross_attentions"], torch.stack(ref.cross_attentions, 1).numpy()),
        ],
    }
    for key, items in pairs.items():
        report[key] = max(report[key], *(max_abs_diff(a, b) for a, b in items))
    report["max_abs_log_probs"] = max(report["max_abs_log_probs"], _finite_diff(out["log_probs"], ref_log_probs))
    for t, step in enumerate(h.step_log_probs[: tgt.shape[1]]):
        report["prefix_vs_steps_max_abs"] = max(
            report["prefix_vs_steps_max_abs"], _finite_diff(out["log_probs"][0, t], step)
        )


def _beam_parity(model, encoder, decoder, sources, spec: DecoderSpec, gen: Generation, beam: int) -> dict:
    """Our beam search against generate(num_beams=beam): with the checkpoint's early_stopping, and with True."""
    ours = beam_search(encoder, decoder, sources, spec, beam=beam, length_penalty=gen.length_penalty)
    report = {"beam": beam, "length_penalty": gen.length_penalty, "early_stopping": gen.early_stopping}
    for label, early in (("checkpoint", gen.early_stopping), ("early_stopping_true", True)):
        same, differences = 0, []
        for i, (src, h) in enumerate(zip(sources, ours)):
            limit = spec.max_length(len(src))
            out = model.generate(
                torch.tensor([src]),
                num_beams=beam,
                do_sample=False,
                length_penalty=gen.length_penalty,
                early_stopping=early,
                max_length=limit + 1,  # the start token and limit generated ones
                return_dict_in_generate=True,
                output_scores=True,
            )
            theirs = _generated(out.sequences[0].tolist(), gen.eos)
            if _same(h, theirs, limit, gen):
                same += 1
            elif len(differences) < 3:
                differences.append(
                    {
                        "index": i,
                        "ours": h.tokens,
                        "our_score": h.ranking(gen.length_penalty),
                        "transformers": theirs[0],
                        "transformers_score": float(out.sequences_scores[0]),
                    }
                )
        report[label] = {"identical": same, "differences": differences}
    return report


def check_parity(report: dict) -> None:
    n = report["sentences"]
    problems = []
    if report["identical_source_ids"] != n:
        problems.append(f"source ids differ from MarianTokenizer's on {n - report['identical_source_ids']} sentences")
    if report["identical_tokens"] + report["identical_but_forced_eos"] != n:
        problems.append(f"greedy tokens differ from generate() (first: {report['first_mismatch']})")
    if report["identical_text"] != n:
        problems.append(f"decoded text differs from MarianTokenizer.decode on {n - report['identical_text']} sentences")
    for key in ("max_abs_memory", "max_abs_log_probs", "prefix_vs_steps_max_abs"):
        if report[key] > LOG_PROB_TOL:
            problems.append(f"{key} {report[key]:.2e} > {LOG_PROB_TOL:.0e}")
    for key in ("max_abs_encoder_attention", "max_abs_attention"):
        if report[key] > ATTENTION_TOL:
            problems.append(f"{key} {report[key]:.2e} > {ATTENTION_TOL:.0e}")
    if problems:
        raise ExportError("parity with transformers failed: " + "; ".join(problems))
