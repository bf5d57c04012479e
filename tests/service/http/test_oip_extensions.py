"""Triton's model configuration and statistics extensions on a real server (``python -m service`` on the
shipped models, on 127.0.0.1), read through the real ``tritonclient[http]``: what Triton's tools
(perf_analyzer, model_analyzer) see. The server is this module's alone, so every count is this
module's requests."""

from __future__ import annotations

import base64
import time

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT
from tests.service.service_testing import metric_value, serving

SETTINGS = {"max_batch_size": 16, "max_queue_delay_ms": 3, "model_instances": 2, "max_running_sequences": 24}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("oip-extensions"), ROOT / "models", **SETTINGS) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    c = triton.InferenceServerClient(server.url.removeprefix("http://"))
    yield c
    c.close()


def providers(server) -> dict[str, str]:
    return {m["name"]: m["provider"] for m in httpx.get(server.url + "/models").json()["models"]}


@pytest.mark.parametrize("pinned", [False, True], ids=["unpinned", "pinned"])
@pytest.mark.parametrize("model", ["vit", "translator"])
def test_the_configuration_describes_the_tensors_the_metadata_advertises(client, model, pinned):
    version = client.get_model_metadata(model)["versions"][-1] if pinned else ""
    config = client.get_model_config(model, version)
    metadata = client.get_model_metadata(model, version)
    assert config["name"] == model and config["max_batch_size"] > 0
    for key, listed in (("input", metadata["inputs"]), ("output", metadata["outputs"])):
        assert [t["name"] for t in config[key]] == [t["name"] for t in listed]
        for tensor, described in zip(config[key], listed, strict=True):
            assert tensor["data_type"] == (
                "TYPE_STRING" if described["datatype"] == "BYTES" else "TYPE_" + described["datatype"]
            )
            assert described["shape"][0] == -1  # the batch, which max_batch_size stands for
            if len(described["shape"]) == 1:  # one element per row: Triton's [1] reshaped to []
                assert (tensor["dims"], tensor["reshape"]) == ([1], {"shape": []})
            else:
                assert tensor["dims"] == described["shape"][1:] and "reshape" not in tensor
    assert [t["optional"] for t in config["input"]] == [len(config["input"]) > 1] * len(config["input"])


def test_batching_and_instances_come_from_the_settings_and_the_provider_in_use(server, client):
    vit, translator = client.get_model_config("vit"), client.get_model_config("translator")
    for config in (vit, translator):
        assert (config["platform"], config["backend"]) == ("onnxruntime_onnx", "onnxruntime")
        assert config["version_policy"] == {"latest": {"num_versions": 1}}
    assert vit["max_batch_size"] == 16 and vit["dynamic_batching"] == {"max_queue_delay_microseconds": 3000}
    assert translator["max_batch_size"] == 24 and translator["dynamic_batching"] == {"max_queue_delay_microseconds": 0}
    kinds = {"CUDAExecutionProvider": "KIND_GPU", "CPUExecutionProvider": "KIND_CPU"}
    in_use = providers(server)
    for config, count in ((vit, 2), (translator, 1)):
        (group,) = config["instance_group"]
        assert (group["kind"], group["count"]) == (kinds[in_use[config["name"]]], count)
    pixels = next(t for t in vit["input"] if t["name"] == "pixels")
    assert (pixels["data_type"], pixels["dims"]) == ("TYPE_FP32", [1, 28, 28])
    assert "model_configuration" in client.get_server_metadata()["extensions"]


@pytest.mark.parametrize("path", ["/v2/models/nope/config", "/v2/models/vit/versions/9/config"])
def test_an_unknown_model_or_version_has_no_configuration(server, client, path):
    r = httpx.get(server.url + path)
    assert r.status_code == 404 and list(r.json()) == ["error"] and "is not loaded" in r.json()["error"]
    with pytest.raises(InferenceServerException, match="is not loaded") as e:
        client.get_model_config("vit", "9")
    assert e.value.status() == "404"


SAMPLE = (ROOT / "models" / "vit" / "1" / "sample-9-ankle-boot.png").read_bytes()


def vit_stats(client, version: str = "") -> dict:
    (stats,) = client.get_inference_statistics("vit", version)["model_stats"]
    return stats


def infer_images(client, count: int) -> None:
    images = triton.InferInput("images", [count], "BYTES")
    images.set_data_from_numpy(np.array([SAMPLE] * count, dtype=object))
    client.infer("vit", [images])


def test_statistics_count_every_image_request_and_batch_and_add_up_their_times(server, client):
    before, started_ms = vit_stats(client), time.time() * 1000
    infer_images(client, 2)
    infer_images(client, 1)
    native = httpx.post(server.url + "/classify", json={"images": [base64.b64encode(SAMPLE).decode()] * 3})
    assert native.status_code == 200  # the native routes share the queue, and the statistics
    after = vit_stats(client, "1")
    assert (after["name"], after["version"]) == ("vit", "1")
    assert after["inference_count"] - before["inference_count"] == 6  # images
    assert after["execution_count"] - before["execution_count"] == 3  # one at a time: each request its own batch
    stats, was = after["inference_stats"], before["inference_stats"]
    for kind in ("success", "queue", "compute_infer"):
        assert stats[kind]["count"] - was[kind]["count"] == 3, kind
        assert stats[kind]["ns"] > was[kind]["ns"] >= 0, kind
    assert stats["fail"] == was["fail"]
    assert stats["success"]["ns"] - was["success"]["ns"] >= stats["compute_infer"]["ns"] - was["compute_infer"]["ns"]
    assert stats["compute_input"] == stats["compute_output"] == {"count": 0, "ns": 0}  # not timed apart
    batches = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    earlier = {b["batch_size"]: b["compute_infer"]["count"] for b in before["batch_stats"]}
    assert {size: batches[size] - earlier.get(size, 0) for size in (1, 2, 3)} == {1: 1, 2: 1, 3: 1}
    assert sum(b["compute_infer"]["ns"] for b in after["batch_stats"]) == stats["compute_infer"]["ns"]
    assert started_ms <= after["last_inference"] <= time.time() * 1000


def test_a_translation_counts_each_text_and_every_decoder_step(client):
    (before,) = client.get_inference_statistics("translator")["model_stats"]
    texts = triton.InferInput("text", [2], "BYTES")
    texts.set_data_from_numpy(np.array(["Open the file.", "Save the current document."], dtype=object))
    client.infer("translator", [texts])
    (after,) = client.get_inference_statistics("translator")["model_stats"]
    assert after["inference_count"] - before["inference_count"] == 2
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 2
    assert after["execution_count"] - before["execution_count"] >= 3  # a decoder step per token, and the end
    assert after["inference_stats"]["compute_infer"]["ns"] > before["inference_stats"]["compute_infer"]["ns"]


def test_the_statistics_are_the_metrics(server, client):
    infer_images(client, 1)
    everything = client.get_inference_statistics()["model_stats"]
    assert sorted((s["name"], s["version"]) for s in everything) == sorted(
        (m["name"], m["version"]) for m in httpx.get(server.url + "/models").json()["models"]
    )
    stats = vit_stats(client)
    text = httpx.get(server.url + "/metrics").text
    vit = {"model": "vit", "version": "1"}
    assert stats["inference_count"] == metric_value(text, "attnserve_images_total", **vit)
    assert stats["execution_count"] == metric_value(text, "attnserve_execution_seconds_count", **vit)
    success = metric_value(text, "attnserve_model_request_duration_seconds_count", outcome="success", **vit)
    assert stats["inference_stats"]["success"]["count"] == success
    assert stats["inference_stats"]["queue"]["count"] == metric_value(text, "attnserve_queue_wait_seconds_count", **vit)
    assert "statistics" in client.get_server_metadata()["extensions"]


@pytest.mark.parametrize("path", ["/v2/models/nope/stats", "/v2/models/vit/versions/9/stats"])
def test_an_unknown_model_or_version_has_no_statistics(server, client, path):
    r = httpx.get(server.url + path)
    assert r.status_code == 404 and list(r.json()) == ["error"] and "is not loaded" in r.json()["error"]
    with pytest.raises(InferenceServerException, match="is not loaded") as e:
        client.get_inference_statistics("nope")
    assert e.value.status() == "404"
