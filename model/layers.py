"""Building blocks shared by every attnserve model: one multi-head attention, one MLP.

Attention is computed explicitly (softmax of scaled scores) rather than through a fused kernel
because serving the attention probabilities is the point of this project; a test checks that the
result matches ``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import torch
from torch import nn


class Attention(nn.Module):
    """Multi-head scaled dot-product attention with optional returned probabilities.

    ``mask`` is boolean, True where attending is allowed, and broadcastable to
    (B, heads, Tq, Tk). Probabilities are returned only when ``return_probs`` is set, so a
    caller that does not ask never keeps them alive.
    """

    def __init__(self, dim: int, heads: int, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.head_dim = dim // heads
        self.scale = self.head_dim**-0.5
        self.q = nn.Linear(dim, dim, bias=bias)
        self.k = nn.Linear(dim, dim, bias=bias)
        self.v = nn.Linear(dim, dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)
        self.attn_drop = nn.Dropout(dropout)
        self.proj_drop = nn.Dropout(dropout)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = x.shape
        return x.transpose(1, 2).reshape(b, t, self.heads * self.head_dim)  # (B, T, D)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention over already split heads: (B, H, Tq, Dh) x (B, H, Tk, Dh) -> output, probs."""
        scores = (q * self.scale) @ k.transpose(-2, -1)  # (B, H, Tq, Tk)
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = scores.softmax(dim=-1)  # (B, H, Tq, Tk)
        out = self.attn_drop(probs) @ v  # (B, H, Tq, Dh)
        return self.proj_drop(self.proj(self.merge_heads(out))), probs

    def attend_cached(
        self,
        q: torch.Tensor,  # (B, H, 1, Dh) the new position's query
        past_k: torch.Tensor,  # (B, H, C, Dh) a cache buffer: C >= the positions in use
        past_v: torch.Tensor,
        k: torch.Tensor,  # (B, H, 1, Dh) the new position's key and value
        v: torch.Tensor,
        past_mask: torch.Tensor,  # broadcastable to (B, H, 1, C): True at the buffer's real positions
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``attend(q, cat(past_k, k), cat(past_v, v))`` without concatenating the cache: the scores of
        the buffer and of the new position are joined (C + 1 numbers a head), not the keys and values.
        Probabilities are over (C + 1) keys, the new position last."""
        q = q * self.scale
        past = (q @ past_k.transpose(-2, -1)).masked_fill(~past_mask, torch.finfo(q.dtype).min)  # (B, H, 1, C)
        probs = torch.cat([past, q @ k.transpose(-2, -1)], dim=-1).softmax(dim=-1)  # (B, H, 1, C + 1)
        c = past_k.shape[2]
        out = self.attn_drop(probs[..., :c]) @ past_v + self.attn_drop(probs[..., c:]) @ v  # (B, H, 1, Dh)
        return self.proj_drop(self.proj(self.merge_heads(out))), probs

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        return_probs: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Self-attention over ``x`` (B, Tq, D), or cross-attention to ``context`` (B, Tk, D)."""
        kv = x if context is None else context
        q = self.split_heads(self.q(x))  # (B, H, Tq, Dh)
        k = self.split_heads(self.k(kv))  # (B, H, Tk, Dh)
        v = self.split_heads(self.v(kv))  # (B, H, Tk, Dh)
        out, probs = self.attend(q, k, v, mask)
        return out, (probs if return_probs else None)


class Mlp(nn.Module):
    """Position-wise feed-forward network: Linear -> GELU -> Linear."""

    def __init__(self, dim: int, hidden: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))
