"""Vision Transformer (Dosovitskiy et al. 2020) written from its definition.

patch embedding (strided convolution == linear projection of flattened P x P patches)
+ learnable class token + learnable position embeddings
+ L pre-norm blocks  z' = MHA(LN(z)) + z ;  z = MLP(LN(z')) + z'
+ final LayerNorm + linear head on the class token.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from model.layers import Attention, Mlp


@dataclass(frozen=True)
class ViTConfig:
    image_size: int = 28
    channels: int = 1
    patch_size: int = 4
    dim: int = 128
    depth: int = 6
    heads: int = 4
    mlp_ratio: float = 2.0
    dropout: float = 0.0
    attention_dropout: float = 0.0
    num_classes: int = 10

    def __post_init__(self) -> None:
        for name in ("image_size", "channels", "patch_size", "dim", "depth", "heads", "num_classes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        if self.dim % self.heads:
            raise ValueError(f"dim {self.dim} is not divisible by heads {self.heads}")
        if self.mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio must be > 0, got {self.mlp_ratio}")
        for name in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")

    @property
    def grid_size(self) -> int:
        return self.image_size // self.patch_size

    @property
    def num_tokens(self) -> int:
        return self.grid_size**2 + 1  # patches + class token

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ViTConfig:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - fields
        if unknown:
            raise ValueError(f"unknown ViTConfig fields: {sorted(unknown)}")
        return cls(**d)


class PatchEmbed(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.proj = nn.Conv2d(cfg.channels, cfg.dim, cfg.patch_size, stride=cfg.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)  # (B, D, H/P, W/P)
        return x.flatten(2).transpose(1, 2)  # (B, N, D), patches in row-major order


class Block(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.dim)
        self.attn = Attention(cfg.dim, cfg.heads, cfg.attention_dropout)
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.mlp = Mlp(cfg.dim, int(cfg.dim * cfg.mlp_ratio), cfg.dropout)

    def forward(self, x: torch.Tensor, return_attention: bool = False):
        a, probs = self.attn(self.norm1(x), return_probs=return_attention)
        x = x + a
        x = x + self.mlp(self.norm2(x))
        return x, probs


class ViT(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.num_tokens, cfg.dim))
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.num_classes)
        self.apply(self._init_weights)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    def forward_features(self, images: torch.Tensor, return_attention: bool = False):
        """Tokens after the final norm (B, N, D), and per-layer attention (B, L, H, N, N) if asked."""
        x = self.patch_embed(images)  # (B, N-1, D)
        cls = self.cls_token.expand(x.shape[0], -1, -1)  # (B, 1, D)
        x = self.drop(torch.cat([cls, x], dim=1) + self.pos_embed)  # (B, N, D)
        maps = []
        for block in self.blocks:
            x, probs = block(x, return_attention)
            maps.append(probs)
        attention = torch.stack(maps, dim=1) if return_attention else None  # (B, L, H, N, N)
        return self.norm(x), attention

    def forward_head(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(tokens[:, 0])  # (B, classes)

    def forward(self, images: torch.Tensor, return_attention: bool = False):
        tokens, attention = self.forward_features(images, return_attention)
        logits = self.forward_head(tokens)
        return (logits, attention) if return_attention else logits

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
