import numpy as np
import pytest
import torch
import torch.nn.functional as F

from model.train_vit import augment, to_tensor
from model.vit import ViT, ViTConfig

VARIANTS = [
    ViTConfig(patch_size=7, dim=32, depth=1, heads=1),
    ViTConfig(patch_size=4, dim=48, depth=3, heads=3, mlp_ratio=4.0),
    ViTConfig(image_size=32, channels=3, patch_size=8, dim=64, depth=2, heads=8, num_classes=100),
    ViTConfig(image_size=16, channels=1, patch_size=16, dim=16, depth=2, heads=2, num_classes=2),
]


@pytest.mark.parametrize("cfg", VARIANTS, ids=lambda c: f"p{c.patch_size}d{c.dim}L{c.depth}H{c.heads}C{c.channels}")
def test_shapes(cfg):
    model = ViT(cfg).eval()
    images = torch.randn(3, cfg.channels, cfg.image_size, cfg.image_size)
    logits, attention = model(images, return_attention=True)
    n = (cfg.image_size // cfg.patch_size) ** 2 + 1
    assert logits.shape == (3, cfg.num_classes)
    assert attention.shape == (3, cfg.depth, cfg.heads, n, n)
    torch.testing.assert_close(attention.sum(-1), torch.ones(3, cfg.depth, cfg.heads, n))
    # the split forwards compose to the whole, and attention never changes the logits
    tokens, _ = model.forward_features(images)
    assert tokens.shape == (3, n, cfg.dim)
    torch.testing.assert_close(model.forward_head(tokens), logits)
    torch.testing.assert_close(model(images), logits)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"image_size": 28, "patch_size": 5}, "multiple"),
        ({"dim": 30, "heads": 4}, "divisible"),
        ({"depth": 0}, "depth"),
        ({"dropout": 1.5}, "dropout"),
        ({"mlp_ratio": 0}, "mlp_ratio"),
    ],
)
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ViTConfig(**kwargs)


def test_config_round_trips_through_dict():
    cfg = VARIANTS[1]
    assert ViTConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown"):
        ViTConfig.from_dict({**cfg.to_dict(), "bogus": 1})


def test_tiny_model_learns_fashion_mnist(fashion_mnist):
    """A few optimiser steps on real images must lower the loss on those images."""
    torch.manual_seed(0)
    mean, std = np.array([0.286], np.float32), np.array([0.353], np.float32)
    x = to_tensor(fashion_mnist.train_images[:256], mean, std)
    y = torch.from_numpy(fashion_mnist.train_labels[:256])
    model = ViT(ViTConfig(patch_size=7, dim=32, depth=2, heads=2))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    with torch.no_grad():
        before = F.cross_entropy(model(x), y).item()
    for _ in range(30):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        after = F.cross_entropy(model(x), y).item()
    assert after < 0.7 * before, (before, after)


def test_augment_keeps_shape_and_zero_shift_is_identity():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(8, 1, 28, 28)
    assert torch.equal(augment(x, shift=0, flip=False, gen=gen), x)
    shifted = augment(x, shift=2, flip=True, gen=gen)
    assert shifted.shape == x.shape


def test_augment_shift_moves_pixels():
    gen = torch.Generator().manual_seed(1)
    x = torch.zeros(64, 1, 8, 8)
    x[:, :, 4, 4] = 1.0
    out = augment(x, shift=1, flip=False, gen=gen)
    positions = {tuple(torch.nonzero(o[0])[0].tolist()) for o in out}
    assert positions <= {(r, c) for r in (3, 4, 5) for c in (3, 4, 5)}
    assert len(positions) > 1  # the shifts differ between images
