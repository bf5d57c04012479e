"""Encoder-decoder Transformer (Vaswani et al., 2017) written from its definition.

Token embeddings scaled by sqrt(d) plus sinusoidal position encodings; encoder blocks of
self-attention and a position-wise FFN; decoder blocks of causally masked self-attention,
cross-attention over the encoder output and an FFN; residual connections with LayerNorm, pre-norm
by default (``x + f(LN(x))``, with a final LayerNorm) or post-norm (``LN(x + f(x))``); an output
projection optionally tied to the target embedding. Every attention is the shared
:class:`model.layers.Attention`, so the probabilities served are the ones the model computed.

``encode()`` and ``decode()`` are separate. ``decode()`` runs a whole target prefix (training,
uncached decoding); ``decode_step()`` runs one token per sequence against a key/value cache
stacked over layers, (layers, B, heads, T, head_dim). ``decode_step_layers()``, what
``export/translator.py`` turns into ``decoder.onnx``, takes one cache buffer per layer instead and
returns only the new position's keys and values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

import torch
from torch import nn

from contract.tokenizer import BOS_ID, EOS_ID, PAD_ID
from model.layers import Attention, Mlp


@dataclass(frozen=True)
class Seq2SeqConfig:
    vocab_size: int = 8000
    dim: int = 256
    encoder_layers: int = 4
    decoder_layers: int = 2
    heads: int = 4
    ffn_dim: int = 1024
    dropout: float = 0.1
    norm: str = "pre"  # "pre" or "post"
    tie_embeddings: bool = True  # output projection shares the target embedding matrix
    share_embeddings: bool = True  # one embedding for source and target (joint vocabulary)
    max_positions: int = 512  # the longest sequence the exported graphs are meant to see
    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID

    def __post_init__(self) -> None:
        if self.dim % self.heads or self.dim % 2:
            raise ValueError(f"dim {self.dim} must be even and divisible by heads {self.heads}")
        if self.norm not in ("pre", "post"):
            raise ValueError(f"norm must be 'pre' or 'post', not {self.norm!r}")
        if min(self.vocab_size, self.encoder_layers, self.decoder_layers, self.ffn_dim, self.max_positions) < 1:
            raise ValueError("vocab_size, layers, ffn_dim and max_positions must be >= 1")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError("dropout must be in [0, 1)")

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Seq2SeqConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# ---- masks: pure functions of ids and lengths, True where attending is allowed -------------------


def padding_mask(ids: torch.Tensor, pad_id: int = PAD_ID) -> torch.Tensor:
    """(B, T) ids -> (B, T) bool, True at real tokens."""
    return ids != pad_id


def key_mask(mask: torch.Tensor) -> torch.Tensor:
    """(B, Tk) key mask -> (B, 1, 1, Tk), broadcast over heads and queries."""
    return mask[:, None, None, :]


def causal_mask(length: int, device: torch.device | None = None) -> torch.Tensor:
    """(1, 1, T, T): query t may attend keys 0..t."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]


def decoder_mask(tgt_mask: torch.Tensor) -> torch.Tensor:
    """Causal mask combined with target key padding: (B, T) -> (B, 1, T, T)."""
    return causal_mask(tgt_mask.shape[1], tgt_mask.device) & key_mask(tgt_mask)


def sinusoidal(positions: torch.Tensor, dim: int) -> torch.Tensor:
    """(B, T) integer positions -> (B, T, dim): sin(pos / 10000^(2i/d)) then cos(...) halves."""
    half = dim // 2
    inv_freq = torch.exp(torch.arange(half, dtype=torch.float32, device=positions.device) * (-math.log(10000.0) / half))
    angles = positions.to(torch.float32)[..., None] * inv_freq  # (B, T, half)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


# ---- blocks ----------------------------------------------------------------------------------------


class _Residual(nn.Module):
    """One sublayer with its LayerNorm: pre-norm ``x + f(LN(x))`` or post-norm ``LN(x + f(x))``."""

    def __init__(self, dim: int, dropout: float, pre: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.drop = nn.Dropout(dropout)
        self.pre = pre

    def forward(self, x: torch.Tensor, fn):  # fn: tensor -> (tensor, extra)
        if self.pre:
            out, extra = fn(self.norm(x))
            return x + self.drop(out), extra
        out, extra = fn(x)
        return self.norm(x + self.drop(out)), extra


class EncoderLayer(nn.Module):
    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__()
        pre = cfg.norm == "pre"
        self.attn = Attention(cfg.dim, cfg.heads, cfg.dropout)
        self.ffn = Mlp(cfg.dim, cfg.ffn_dim, cfg.dropout)
        self.sub1 = _Residual(cfg.dim, cfg.dropout, pre)
        self.sub2 = _Residual(cfg.dim, cfg.dropout, pre)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, probs = self.sub1(x, lambda h: self.attn(h, mask=mask, return_probs=True))
        x, _ = self.sub2(x, lambda h: (self.ffn(h), None))
        return x, probs


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = Attention(cfg.dim, cfg.heads, cfg.dropout)
        self.cross_attn = Attention(cfg.dim, cfg.heads, cfg.dropout)
        self.ffn = Mlp(cfg.dim, cfg.ffn_dim, cfg.dropout)
        self.sub1 = _Residual(cfg.dim, cfg.dropout, pre)
        self.sub2 = _Residual(cfg.dim, cfg.dropout, pre)
        self.sub3 = _Residual(cfg.dim, cfg.dropout, pre)

    def cross_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys and values of the encoder output: computed once per request."""
        a = self.cross_attn
        return a.split_heads(a.k(memory)), a.split_heads(a.v(memory))

    def forward(
        self,
        x: torch.Tensor,  # (B, T, D): the new target positions
        self_mask: torch.Tensor,  # broadcastable to (B, H, T, T); with a cache: (B, 1, 1, C), its real positions
        cross_k: torch.Tensor,  # (B, H, S, Dh)
        cross_v: torch.Tensor,
        src_mask: torch.Tensor,  # (B, 1, 1, S)
        past_k: torch.Tensor | None = None,  # (B, H, C, Dh) a cache buffer, C >= the positions in use
        past_v: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns x, the keys and values of ``x``'s positions, self- and cross-attention probabilities.

        With a cache, ``x`` is one new position attending to the buffer and to itself; the keys and
        values returned are the new position's only (the caller writes them into its buffer), and the
        self-attention probabilities are over the C buffer positions then the new one."""

        def self_block(h: torch.Tensor):
            a = self.self_attn
            q, k, v = a.split_heads(a.q(h)), a.split_heads(a.k(h)), a.split_heads(a.v(h))
            if past_k is None:
                out, probs = a.attend(q, k, v, self_mask)
            else:
                out, probs = a.attend_cached(q, past_k, past_v, k, v, self_mask)
            return out, (k, v, probs)

        def cross_block(h: torch.Tensor):
            a = self.cross_attn
            return a.attend(a.split_heads(a.q(h)), cross_k, cross_v, src_mask)

        x, (k, v, self_probs) = self.sub1(x, self_block)
        x, cross_probs = self.sub2(x, cross_block)
        x, _ = self.sub3(x, lambda h: (self.ffn(h), None))
        return x, k, v, self_probs, cross_probs


# ---- the model ------------------------------------------------------------------------------------


class Seq2Seq(nn.Module):
    def __init__(self, cfg: Seq2SeqConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.src_embed = nn.Embedding(cfg.vocab_size, cfg.dim, padding_idx=cfg.pad_id)
        self.tgt_embed = (
            self.src_embed if cfg.share_embeddings else nn.Embedding(cfg.vocab_size, cfg.dim, padding_idx=cfg.pad_id)
        )
        self.drop = nn.Dropout(cfg.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        final = nn.LayerNorm if cfg.norm == "pre" else lambda _dim: nn.Identity()
        self.encoder_norm, self.decoder_norm = final(cfg.dim), final(cfg.dim)
        self.out = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.reset_parameters()
        if cfg.tie_embeddings:
            self.out.weight = self.tgt_embed.weight

    def reset_parameters(self) -> None:
        for name, p in self.named_parameters():
            if p.ndim == 2 and "embed" not in name:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        for emb in {self.src_embed, self.tgt_embed}:  # std d^-1/2: sqrt(d) scaling gives unit-variance inputs
            nn.init.normal_(emb.weight, std=self.cfg.dim**-0.5)
            with torch.no_grad():
                emb.weight[self.cfg.pad_id].zero_()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def embed(self, table: nn.Embedding, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.drop(table(ids) * math.sqrt(self.cfg.dim) + sinusoidal(positions, self.cfg.dim))

    @staticmethod
    def positions_of(ids: torch.Tensor) -> torch.Tensor:
        return torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[0], -1)

    def encode(
        self, src: torch.Tensor, src_mask: torch.Tensor, return_attention: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, S) ids and (B, S) bool mask -> memory (B, S, D) and, if asked, probs (B, L, H, S, S)."""
        x = self.embed(self.src_embed, src, self.positions_of(src))
        mask, probs = key_mask(src_mask), []
        for layer in self.encoder:
            x, p = layer(x, mask)
            probs.append(p)
        return self.encoder_norm(x), (torch.stack(probs, dim=1) if return_attention else None)

    def cross_kv(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every decoder layer's cross-attention keys and values, stacked: (L, B, H, S, Dh) each."""
        kv = [layer.cross_kv(memory) for layer in self.decoder]
        return torch.stack([k for k, _ in kv]), torch.stack([v for _, v in kv])

    def decode(
        self, tgt_in: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor, return_attention: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Whole target prefix at once: (B, T) ids -> logits (B, T, V) [and cross-attention (B, L, H, T, S)]."""
        cross_keys, cross_values = self.cross_kv(memory)
        logits, _, cross = self.decode_prefix(tgt_in, cross_keys, cross_values, src_mask, return_attention)
        return logits, cross

    def decode_prefix(
        self,
        tgt_in: torch.Tensor,
        cross_keys: torch.Tensor,
        cross_values: torch.Tensor,
        src_mask: torch.Tensor,
        return_attention: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``decode`` from precomputed cross keys/values: logits (B, T, V) and, if asked, the
        self-attention (B, L, H, T, T) and cross-attention (B, L, H, T, S) probabilities."""
        x = self.embed(self.tgt_embed, tgt_in, self.positions_of(tgt_in))
        self_mask, cross_mask = decoder_mask(padding_mask(tgt_in, self.cfg.pad_id)), key_mask(src_mask)
        self_probs, cross_probs = [], []
        for i, layer in enumerate(self.decoder):
            x, _, _, sp, cp = layer(x, self_mask, cross_keys[i], cross_values[i], cross_mask)
            self_probs.append(sp)
            cross_probs.append(cp)
        logits = self.out(self.decoder_norm(x))
        if not return_attention:
            return logits, None, None
        return logits, torch.stack(self_probs, dim=1), torch.stack(cross_probs, dim=1)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        src_mask = padding_mask(src, self.cfg.pad_id)
        memory, _ = self.encode(src, src_mask)
        return self.decode(tgt_in, memory, src_mask)[0]

    def decode_step(
        self,
        tokens: torch.Tensor,  # (B, 1) the last token of each sequence
        positions: torch.Tensor,  # (B, 1) its position
        past_keys: torch.Tensor,  # (L, B, H, T, Dh), T may be 0
        past_values: torch.Tensor,
        cache_mask: torch.Tensor,  # (B, T) bool: which cached positions are real
        cross_keys: torch.Tensor,  # (L, B, H, S, Dh)
        cross_values: torch.Tensor,
        src_mask: torch.Tensor,  # (B, S) bool
    ) -> tuple[torch.Tensor, ...]:
        """One decoding step: log-probs (B, V), present keys/values (L, B, H, T+1, Dh),
        self-attention (B, L, H, T+1) and cross-attention (B, L, H, S) probabilities of this step."""
        log_probs, keys, values, self_probs, cross_probs = self.decode_step_layers(
            tokens, positions, past_keys, past_values, cache_mask, cross_keys, cross_values, src_mask
        )
        present_k = torch.stack([torch.cat([past_keys[i], k], dim=2) for i, k in enumerate(keys)])
        present_v = torch.stack([torch.cat([past_values[i], v], dim=2) for i, v in enumerate(values)])
        return log_probs, present_k, present_v, self_probs, cross_probs

    def decode_step_layers(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        past_keys: Sequence[torch.Tensor],  # L cache buffers (B, H, C, Dh): a stacked (L, ...) tensor works too
        past_values: Sequence[torch.Tensor],
        cache_mask: torch.Tensor,  # (B, C): the buffers' real positions
        cross_keys: Sequence[torch.Tensor],  # L of (B, H, S, Dh)
        cross_values: Sequence[torch.Tensor],
        src_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """What the exported step graph computes: one cache buffer per layer in, and out only the new
        position's key and value per layer (B, H, 1, Dh), which the caller writes into its buffers.

        So onnxruntime copies no cache at all in a step: stacked (L, ...) caches cost a split and a
        stack, and returning past + new a concatenation, each a copy of the whole cache per step.
        Self-attention probabilities are over the C buffer positions then the new one."""
        x = self.embed(self.tgt_embed, tokens, positions)
        past_mask, cross_mask = key_mask(cache_mask), key_mask(src_mask)
        keys, values, self_probs, cross_probs = [], [], [], []
        for i, layer in enumerate(self.decoder):
            x, k, v, sp, cp = layer(
                x, past_mask, cross_keys[i], cross_values[i], cross_mask, past_keys[i], past_values[i]
            )
            keys.append(k)
            values.append(v)
            self_probs.append(sp[:, :, 0])
            cross_probs.append(cp[:, :, 0])
        log_probs = self.out(self.decoder_norm(x[:, 0])).log_softmax(dim=-1)
        return log_probs, keys, values, torch.stack(self_probs, dim=1), torch.stack(cross_probs, dim=1)

    def empty_cache(
        self, batch: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Past keys, values (L, B, H, 0, Dh) and cache mask (B, 0) for the first step."""
        c = self.cfg
        kv = torch.zeros(c.decoder_layers, batch, c.heads, 0, c.head_dim, device=device)
        return kv, kv.clone(), torch.zeros(batch, 0, dtype=torch.bool, device=device)


@torch.no_grad()
def greedy_decode(model: Seq2Seq, src: torch.Tensor, max_len: int, use_cache: bool = True) -> list[list[int]]:
    """Greedy decoding of a padded (B, S) batch; each result ends before its eos (not included).

    ``use_cache=False`` re-runs the whole prefix through ``decode()`` at every step: the slow
    reference against which the cached path is tested.
    """
    model.eval()
    cfg, b = model.cfg, src.shape[0]
    src_mask = padding_mask(src, cfg.pad_id)
    memory, _ = model.encode(src, src_mask)
    cross_k, cross_v = model.cross_kv(memory)
    past_k, past_v, cache_mask = model.empty_cache(b, src.device)
    tokens = torch.full((b, 1), cfg.bos_id, dtype=torch.long, device=src.device)
    prefix, done = tokens, torch.zeros(b, dtype=torch.bool, device=src.device)
    for t in range(max_len):
        if use_cache:
            positions = torch.full((b, 1), t, dtype=torch.long, device=src.device)
            scores, past_k, past_v, _, _ = model.decode_step(
                tokens, positions, past_k, past_v, cache_mask, cross_k, cross_v, src_mask
            )
            cache_mask = torch.ones(b, t + 1, dtype=torch.bool, device=src.device)
        else:
            scores = model.decode(prefix, memory, src_mask)[0][:, -1]
        nxt = scores.argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, cfg.pad_id), nxt)
        done |= nxt == cfg.eos_id
        tokens = nxt[:, None]
        prefix = torch.cat([prefix, tokens], dim=1)
        if done.all():
            break
    out = []
    for row in prefix[:, 1:].tolist():
        ids = [i for i in row if i != cfg.pad_id]
        out.append(ids[: ids.index(cfg.eos_id)] if cfg.eos_id in ids else ids)
    return out
