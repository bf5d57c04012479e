"""Triton's model configuration extension on a real server (``python -m service`` on the shipped models),
read through the real ``tritonclient[http]``: what Triton's tools (perf_analyzer, model_analyzer) see."""

from __future__ import annotations

import httpx
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT
from tests.service.service_testing import serving

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
