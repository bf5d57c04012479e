"""The attention package without a server: rollout, records, the memory store's TTL and size cap,
views (slices, 422s), and heatmap PNGs of the documented size."""

from __future__ import annotations

import asyncio
import io
import json

import numpy as np
import pytest
from PIL import Image

from contract.manifest import ImageAttention
from service.attention import render
from service.attention.capture import translation_record, vit_record
from service.attention.record import AttentionRecord, RecordError
from service.attention.rollout import alignment, class_token_rollout, rollout
from service.attention.store import MemoryStore, StoreUnavailable
from service.attention.views import as_json, as_npz, map_names, select
from service.errors import InvalidField


def random_attention(layers=3, heads=2, n=5, seed=0) -> np.ndarray:
    """Softmax rows of random scores: valid attention probabilities."""
    z = np.random.default_rng(seed).normal(size=(layers, heads, n, n))
    e = np.exp(z)
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def reference_rollout(attention: np.ndarray, fusion: str) -> np.ndarray:
    """Abnar & Zuidema's recipe written out element by element, independently of service.attention."""
    layers, heads, n, _ = attention.shape
    result = [[float(i == j) for j in range(n)] for i in range(n)]
    for layer in range(layers):
        fused = [
            [
                (sum if fusion == "mean" else max)(float(attention[layer, h, i, j]) for h in range(heads))
                / (heads if fusion == "mean" else 1)
                for j in range(n)
            ]
            for i in range(n)
        ]
        a = [[fused[i][j] + (i == j) for j in range(n)] for i in range(n)]
        a = [[v / sum(row) for v in row] for row in a]
        result = [[sum(a[i][k] * result[k][j] for k in range(n)) for j in range(n)] for i in range(n)]
    return np.array(result)


@pytest.mark.parametrize("fusion", ["mean", "max"])
def test_rollout_matches_an_independent_reference(fusion):
    attention = random_attention(layers=4, heads=3, n=6, seed=1)
    np.testing.assert_allclose(rollout(attention, fusion), reference_rollout(attention, fusion), atol=1e-12)
    assert np.allclose(rollout(attention, fusion).sum(-1), 1.0)  # a product of row-stochastic matrices


def test_rollout_of_identity_attention_keeps_each_token_to_itself():
    eye = np.broadcast_to(np.eye(5, dtype=np.float32), (3, 2, 5, 5))
    assert np.allclose(rollout(eye), np.eye(5))


def test_class_token_rollout_is_the_class_row_over_the_patch_grid():
    attention = random_attention(layers=2, heads=2, n=1 + 6, seed=2)
    grid = class_token_rollout(attention, (2, 3))
    assert grid.shape == (2, 3) and grid.dtype == np.float32
    np.testing.assert_allclose(grid.ravel(), reference_rollout(attention, "mean")[0, 1:], rtol=1e-6)
    with pytest.raises(ValueError):
        class_token_rollout(attention, (3, 3))


def test_alignment_is_the_last_layer_mean_over_heads():
    cross = np.random.default_rng(3).random((2, 4, 5, 7)).astype(np.float32)
    np.testing.assert_allclose(alignment(cross), cross[1].mean(0))


def vit_spec(n=5) -> ImageAttention:
    return ImageAttention(output="attentions", layers=3, heads=2, tokens=n, prefix_tokens=1, grid=(2, 2), patch_size=4)


def a_vit_record(seed=0) -> AttentionRecord:
    image = np.random.default_rng(seed).integers(0, 255, (8, 8, 1), dtype=np.uint8)
    return vit_record(
        "vit", "1", vit_spec(), random_attention(seed=seed), image, {"label": "Bag", "index": 8, "score": 0.9}
    )


def a_translation_record() -> AttentionRecord:
    maps = {
        "encoder_self_attention": random_attention(4, 2, 3),
        "decoder_self_attention": random_attention(2, 2, 4),
        "cross_attention": random_attention(2, 2, 4)[..., :3],
    }
    return translation_record(
        "tr", "1", maps, ["▁a", "b", "</s>"], ["▁x", "y", "z", "</s>"], ["<s>", "▁x", "y", "z"], "xyz"
    )


def test_a_record_survives_its_bytes_exactly():
    for record in (a_vit_record(), a_translation_record()):
        back = AttentionRecord.from_bytes(record.to_bytes())
        assert (back.task, back.model, back.version, back.meta, back.created_at) == (
            record.task,
            record.model,
            record.version,
            record.meta,
            record.created_at,
        )
        for name, m in record.maps.items():
            assert np.array_equal(back.maps[name], m)
        assert (back.image is None) == (record.image is None)
    with pytest.raises(RecordError):
        AttentionRecord.from_bytes(b"not an npz")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_ids_expire_after_the_ttl():
    clock = Clock()
    store = MemoryStore(ttl_s=10, max_bytes=1 << 20, clock=clock)
    key = asyncio.run(store.put(a_vit_record()))
    assert len(key) >= 20 and key != asyncio.run(store.put(a_vit_record()))  # 128 random bits, never reused
    clock.now += 9.9
    assert asyncio.run(store.get(key)) is not None
    clock.now += 0.2
    assert asyncio.run(store.get(key)) is None
    assert len(store) == 1 and store.nbytes == a_vit_record().nbytes  # the expired one is gone, its bytes too


def test_the_size_cap_evicts_the_least_recently_used():
    size = a_vit_record().nbytes
    store = MemoryStore(ttl_s=100, max_bytes=3 * size)
    first, second, third = (asyncio.run(store.put(a_vit_record(i))) for i in range(3))
    assert asyncio.run(store.get(first)) is not None  # first is now the most recently used
    fourth = asyncio.run(store.put(a_vit_record(3)))
    assert asyncio.run(store.get(second)) is None  # the least recently used went
    assert all(asyncio.run(store.get(k)) is not None for k in (first, third, fourth))
    assert store.nbytes == 3 * size <= store.max_bytes
    with pytest.raises(StoreUnavailable):  # a record larger than the whole cap is refused, not half-kept
        asyncio.run(MemoryStore(ttl_s=100, max_bytes=size - 1).put(a_vit_record()))


def test_views_slice_layers_and_heads_and_refuse_what_the_record_lacks():
    record = a_translation_record()
    data, layers, heads = select(record, "cross_attention", 1, 0)
    assert data.shape == (1, 1, 4, 3) and layers == [1] and heads == [0]
    assert np.array_equal(data[0, 0], record.maps["cross_attention"][1, 0])
    assert map_names(record, "cross") == ["cross_attention"] and len(map_names(record, None)) == 3
    for bad in ({"layer": 2}, {"layer": -1}, {"head": 2}):
        with pytest.raises(InvalidField):
            select(record, "cross_attention", bad.get("layer"), bad.get("head"))
    with pytest.raises(InvalidField):
        map_names(record, "rollout")
    body = json.loads(as_json(record, "id", 60, "encoder", 3, None, "mean"))
    enc = body["maps"]["encoder_self_attention"]
    assert enc["shape"] == [1, 2, 3, 3] and enc["query_tokens"] == enc["key_tokens"] == ["▁a", "b", "</s>"]
    assert body["expires_at"] == pytest.approx(body["created_at"] + 60)


def test_npz_holds_the_same_numbers_as_json():
    record = a_vit_record()
    body = json.loads(as_json(record, "id", 60, None, None, None, "max"))
    with np.load(io.BytesIO(as_npz(record, "id", 60, None, None, None, "max"))) as npz:
        assert np.array_equal(npz["self_attention"], np.array(body["maps"]["self_attention"]["data"], np.float32))
        assert np.allclose(npz["rollout"], body["rollout"]["data"])
        assert json.loads(npz["meta.json"].tobytes())["grid"] == [2, 2]


def png_size(data: bytes) -> tuple[int, int]:
    image = Image.open(io.BytesIO(data))
    image.verify()
    assert image.format == "PNG"
    return image.size


def test_heatmaps_are_valid_pngs_of_the_documented_size():
    image = np.zeros((28, 28, 1), np.uint8)
    assert png_size(render.vit_overlay(image, np.random.rand(7, 7), "t")) == render.VIT_SIZE
    small, large = render.grid_size(4, 3), render.grid_size(30, 40)
    assert small == (400, 400) and large == (round((2.4 + 0.32 * 40) * 100), round((1.6 + 0.32 * 30) * 100))
    labels = [f"▁tok{i}" for i in range(40)]
    png = render.token_grid(np.random.rand(30, 40), labels[:30], labels, "t", "generated", "source")
    assert png_size(png) == large


def test_attention_ids_never_start_with_a_dash(monkeypatch):
    """A leading "-" makes the id an option to a shell command (`attnserve-client attention <id>`)."""
    import secrets

    from service.attention import store

    drawn = iter(["-leading", "-again", "Fine_id-9"])
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n: next(drawn))
    assert store.new_id() == "Fine_id-9"
    monkeypatch.undo()
    assert not any(store.new_id().startswith("-") for _ in range(2000))
