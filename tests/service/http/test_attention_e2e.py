"""Attention maps end to end on real uvicorn servers (the tiny ViT and translator of the session).

What a user relies on: the maps served are the model's own (PyTorch computes the same numbers),
a beam's alignment is the returned hypothesis's, heatmaps are real images, ids expire, and requests
that do not ask for attention are answered exactly as before.
"""

from __future__ import annotations

import base64
import io
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from service.attention import render
from tests.service.attention.test_attention import reference_rollout
from tests.service.service_testing import serving

TOL = 1e-5


@pytest.fixture(scope="module")
def server(both_repository, tmp_path_factory):
    with serving(tmp_path_factory.mktemp("attention"), both_repository) as srv:
        yield srv


@pytest.fixture(scope="module")
def torch_vit(tiny_vit_checkpoint):
    from model.training import load_checkpoint
    from model.vit import ViT, ViTConfig

    ckpt = load_checkpoint(tiny_vit_checkpoint)
    vit = ViT(ViTConfig.from_dict(ckpt["config"])).eval()
    vit.load_state_dict(ckpt["state_dict"])
    return vit, ckpt["preprocessing"]


@pytest.fixture(scope="module")
def torch_translator(tiny_translator_checkpoint):
    from contract.tokenizer import Tokenizer
    from model.seq2seq import Seq2Seq, Seq2SeqConfig
    from model.training import load_checkpoint

    ckpt = load_checkpoint(tiny_translator_checkpoint)
    model = Seq2Seq(Seq2SeqConfig.from_dict(ckpt["config"])).eval()
    model.load_state_dict(ckpt["state_dict"])
    return model, Tokenizer.from_bytes(ckpt["tokenizer"]["model"])


def classify(srv, pngs: list[bytes], **options) -> httpx.Response:
    body = {"images": [base64.b64encode(p).decode() for p in pngs], **options}
    return httpx.post(srv.url + "/classify", json=body, timeout=60)


def get(srv, path: str, **params) -> httpx.Response:
    return httpx.get(srv.url + path, params=params, timeout=60)


def test_vit_attention_equals_pytorch_and_its_rollout_the_reference(server, fashion_test, fashion_pngs, torch_vit):
    from contract.manifest import Preprocessing

    vit, prep = torch_vit
    images = fashion_test[0][:4]
    r = classify(server, fashion_pngs[:4], return_attention=True, top_k=2)
    assert r.status_code == 200, r.text
    with torch.no_grad():
        _, expected = vit(torch.from_numpy(Preprocessing.model_validate(prep).apply(images)), return_attention=True)
    for i, result in enumerate(r.json()["results"]):
        full = get(server, f"/attention/{result['attention_id']}")
        assert full.status_code == 200, full.text
        body = full.json()
        maps = np.array(body["maps"]["self_attention"]["data"], np.float32)
        assert maps.shape == tuple(body["maps"]["self_attention"]["shape"]) == tuple(expected[i].shape)
        assert np.abs(maps - expected[i].numpy()).max() <= TOL
        assert np.allclose(maps.sum(-1), 1.0, atol=1e-5)  # every row is a distribution
        grid = body["grid"]
        ref = reference_rollout(maps, "mean")[0, 1:].reshape(grid)
        np.testing.assert_allclose(body["rollout"]["data"], ref, atol=1e-6)
        np.testing.assert_allclose(result["attention"]["rollout"], ref, atol=1e-6)  # inline = retrieved
        assert result["attention"]["fusion"] == "mean" and result["attention"]["grid"] == grid
        assert body["prediction"] == result["top_k"][0] and body["task"] == "image-classification"
    maxed = classify(server, fashion_pngs[:1], return_attention=True, rollout_fusion="max").json()["results"][0]
    one = np.array(get(server, f"/attention/{maxed['attention_id']}").json()["maps"]["self_attention"]["data"])
    np.testing.assert_allclose(
        maxed["attention"]["rollout"], reference_rollout(one, "max")[0, 1:].reshape(grid), atol=1e-6
    )


def test_requests_without_attention_are_answered_as_before_even_beside_attention_ones(server, fashion_pngs):
    plain = [classify(server, [p]).json() for p in fashion_pngs[:16]]
    assert all(set(res) == {"top_k"} for body in plain for res in body["results"])
    with ThreadPoolExecutor(16) as pool:  # half of them ask for attention: batches mix both kinds
        mixed = list(
            pool.map(lambda i: classify(server, [fashion_pngs[i]], return_attention=i % 2 == 1).json(), range(16))
        )
    for i, (alone, together) in enumerate(zip(plain, mixed)):
        assert together["results"][0]["top_k"] == alone["results"][0]["top_k"]
        assert ("attention_id" in together["results"][0]) == (i % 2 == 1)


def teacher_forced(model, tok, source: list[int], target: list[int]) -> dict[str, np.ndarray]:
    """PyTorch's attention for one (source, returned translation + eos) pair, no batching."""
    src = torch.tensor([source])
    mask = src != model.cfg.pad_id
    with torch.no_grad():
        memory, enc = model.encode(src, mask, return_attention=True)
        keys, values = model.cross_kv(memory)
        _, self_attn, cross = model.decode_prefix(
            torch.tensor([[model.cfg.bos_id, *target[:-1]]]), keys, values, mask, return_attention=True
        )
    return {
        "encoder_self_attention": enc[0].numpy(),
        "decoder_self_attention": self_attn[0].numpy(),
        "cross_attention": cross[0].numpy(),
    }


def translate(srv, texts: list[str], **options) -> list[dict]:
    r = httpx.post(srv.url + "/translate", json={"texts": texts, "return_attention": True, **options}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["results"]


def test_translation_attention_is_the_returned_beams_own_and_equals_pytorch(server, torch_translator):
    model, tok = torch_translator
    texts = [
        "Open the dialog.",
        "Select the cells you want to format and choose Format - Cells.",
        "Yes.",
        "I've made one or two modifications to the original design.",
    ]
    greedy = translate(server, texts, beam_size=1)
    differs = 0
    for text, result, alone in zip(texts, translate(server, texts, beam_size=4), greedy):
        summary = result["attention"]
        source = tok.encode(text, add_eos=True)
        target = [tok.piece_to_id(p) for p in summary["target_tokens"]]  # rows: generated pieces, eos if finished
        assert summary["source_tokens"] == tok.pieces(source)
        assert summary["target_tokens"] == result["target_tokens"] + (["</s>"] if result["finished"] else [])
        expected = teacher_forced(model, tok, source, target)
        body = get(server, f"/attention/{result['attention_id']}").json()
        for name, want in expected.items():
            got = np.array(body["maps"][name]["data"], np.float32)
            assert got.shape == want.shape and np.abs(got - want).max() <= TOL, name
            assert np.allclose(got.sum(-1), 1.0, atol=1e-5)
        np.testing.assert_allclose(summary["alignment"], expected["cross_attention"][-1].mean(0), atol=TOL)
        assert body["maps"]["cross_attention"]["query_tokens"] == summary["target_tokens"]
        other = [tok.piece_to_id(p) for p in alone["attention"]["target_tokens"]]
        if other != target:  # the greedy hypothesis is another beam: its attention is not what beam search returned
            theirs = teacher_forced(model, tok, source, other)["cross_attention"]
            ours = np.array(body["maps"]["cross_attention"]["data"], np.float32)
            differs += theirs.shape != ours.shape or not np.allclose(theirs, ours, atol=1e-3)
    assert differs >= 1, "no text where beam search and greedy decoding disagree: the test proves nothing"


def png_size(response: httpx.Response) -> tuple[int, int]:
    assert response.status_code == 200 and response.headers["content-type"] == "image/png", response.text
    image = Image.open(io.BytesIO(response.content))
    image.verify()
    return image.size


def test_heatmaps_are_pngs_of_the_expected_size_and_bad_slices_are_422(server, fashion_pngs):
    vit_id = classify(server, fashion_pngs[:1], return_attention=True).json()["results"][0]["attention_id"]
    assert png_size(get(server, f"/attention/{vit_id}.png")) == render.VIT_SIZE
    assert png_size(get(server, f"/attention/{vit_id}.png", kind="attention", layer=0, head=1)) == render.VIT_SIZE
    result = httpx.post(
        server.url + "/translate", json={"text": "Open the dialog.", "return_attention": True}, timeout=60
    ).json()["results"][0]
    tr_id, rows, cols = result["attention_id"], len(result["attention"]["target_tokens"]), len(result["source_tokens"])
    assert png_size(get(server, f"/attention/{tr_id}.png")) == render.grid_size(rows, cols)
    assert png_size(get(server, f"/attention/{tr_id}.png", kind="encoder", head=0)) == render.grid_size(cols, cols)
    for path, params in [
        (f"/attention/{vit_id}.png", {"kind": "attention", "layer": 99}),
        (f"/attention/{vit_id}", {"head": 99}),
        (f"/attention/{tr_id}", {"kind": "rollout"}),
        (f"/attention/{tr_id}.png", {"layer": -1}),
        (f"/attention/{vit_id}", {"layer": "x"}),
    ]:
        r = get(server, path, **params)
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_field", (path, params, r.text)
    for path in ("/attention/no-such-id", "/attention/no-such-id.png"):
        r = get(server, path)
        assert r.status_code == 404 and r.json()["error"]["code"] == "attention_not_found"


def test_npz_download_by_query_or_accept_header(server, fashion_pngs):
    aid = classify(server, fashion_pngs[:1], return_attention=True).json()["results"][0]["attention_id"]
    as_json = get(server, f"/attention/{aid}", layer=1).json()
    for r in (
        get(server, f"/attention/{aid}", layer=1, format="npz"),
        httpx.get(server.url + f"/attention/{aid}?layer=1", headers={"Accept": "application/x-npz"}),
    ):
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-npz"
        with np.load(io.BytesIO(r.content)) as npz:
            assert np.array_equal(
                npz["self_attention"], np.array(as_json["maps"]["self_attention"]["data"], np.float32)
            )


def test_ids_expire_after_the_ttl(thread_server, fashion_pngs):
    with thread_server(attention_ttl_s=1) as srv:
        srv.wait_ready()
        aid = classify(srv, fashion_pngs[:1], return_attention=True).json()["results"][0]["attention_id"]
        assert get(srv, f"/attention/{aid}").status_code == 200
        time.sleep(1.2)
        r = get(srv, f"/attention/{aid}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "attention_not_found"
