"""Summaries of attention maps, in numpy: the ViT's attention rollout and the translator's alignment.

Attention rollout (Abnar & Zuidema, 2020, "Quantifying Attention Flow in Transformers"): a
residual connection carries a token's own representation past each attention layer, so each layer
is modelled as ``A + I`` with rows renormalised to sum to 1, the heads fused first (their mean, or
their element-wise max). Multiplying the layers' matrices from the first to the last gives how much
each output token draws on each input token through every path; the class token's row, over the
patch tokens, is the rollout map shown on the patch grid.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Fusion = Literal["mean", "max"]
FUSIONS: tuple[Fusion, ...] = ("mean", "max")


def fuse_heads(attention: np.ndarray, fusion: Fusion) -> np.ndarray:
    """(..., heads, Q, K) -> (..., Q, K) by the mean or the max over heads."""
    if fusion == "mean":
        return attention.mean(axis=-3)
    if fusion == "max":
        return attention.max(axis=-3)
    raise ValueError(f"fusion must be one of {FUSIONS}, not {fusion!r}")


def rollout(attention: np.ndarray, fusion: Fusion = "mean") -> np.ndarray:
    """(layers, heads, N, N) attention of one input -> (N, N) rollout, in float64.

    Row ``i`` says how much token ``i`` at the output of the last layer draws on each input token.
    """
    if attention.ndim != 4 or attention.shape[-1] != attention.shape[-2]:
        raise ValueError(f"expected (layers, heads, N, N) attention, got shape {attention.shape}")
    fused = fuse_heads(attention.astype(np.float64), fusion)
    eye = np.eye(fused.shape[-1])
    result = eye
    for layer in fused:  # first layer first: result = A_L @ ... @ A_1
        a = layer + eye
        a /= a.sum(axis=-1, keepdims=True)
        result = a @ result
    return result


def class_token_rollout(
    attention: np.ndarray, grid: tuple[int, int], prefix_tokens: int = 1, fusion: Fusion = "mean"
) -> np.ndarray:
    """The class token's rollout over the patch tokens, as a (grid_h, grid_w) float32 map.

    Values are the class token's share of each patch (they sum to less than 1: the rest is its
    share of the prefix tokens, itself included).
    """
    h, w = grid
    if attention.shape[-1] != prefix_tokens + h * w:
        raise ValueError(f"{attention.shape[-1]} tokens do not make {prefix_tokens} prefix + {h}x{w} patches")
    return rollout(attention, fusion)[0, prefix_tokens:].reshape(h, w).astype(np.float32)


def alignment(cross_attention: np.ndarray, layer: int = -1) -> np.ndarray:
    """(layers, heads, target, source) cross-attention -> (target, source): one layer's mean over heads."""
    return cross_attention[layer].mean(axis=0)
