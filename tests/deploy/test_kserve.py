"""``deploy/kserve/``: the ServingRuntime and InferenceService validate against KServe's CRDs (as written
down in ``kserve_crds.py``), their containers against the Kubernetes schema, and they agree with each
other and with the service (settings, port, probe routes, protocol)."""

from __future__ import annotations

import copy

import jsonschema
import pytest
import yaml

from tests.deploy.kserve_crds import INFERENCE_SERVICE, SERVING_RUNTIME
from tests.deploy.parsing import ROOT, route_paths, settings_fields
from tests.deploy.test_k8s import schema_versions

kubernetes_validate = pytest.importorskip("kubernetes_validate")

KSERVE = ROOT / "deploy" / "kserve"


@pytest.fixture(scope="module")
def runtime() -> dict:
    return yaml.safe_load((KSERVE / "servingruntime.yaml").read_text())


@pytest.fixture(scope="module")
def isvc() -> dict:
    return yaml.safe_load((KSERVE / "inferenceservice.yaml").read_text())


def test_both_validate_against_the_kserve_crds(runtime, isvc):
    jsonschema.validate(runtime, SERVING_RUNTIME)
    jsonschema.validate(isvc, INFERENCE_SERVICE)


@pytest.mark.parametrize(
    ("schema", "file", "path", "value"),
    [
        (SERVING_RUNTIME, "servingruntime.yaml", ("spec", "protocolVersion"), ["v2"]),  # the field is protocolVersions
        (SERVING_RUNTIME, "servingruntime.yaml", ("spec", "supportedModelFormats", 0, "autoselect"), True),
        (INFERENCE_SERVICE, "inferenceservice.yaml", ("spec", "predictor", "model", "storageURI"), "pvc://x"),
    ],
)
def test_the_schemas_catch_a_misspelt_field(schema, file, path, value):
    doc = copy.deepcopy(yaml.safe_load((KSERVE / file).read_text()))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema)


def test_the_runtime_container_is_a_valid_kubernetes_container(runtime):
    (container,) = runtime["spec"]["containers"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "attnserve"}, "spec": {"containers": [container]}}
    kubernetes_validate.validate(pod, schema_versions()[-1], strict=True)
    assert container["name"] == "kserve-container"  # the name KServe expects of the serving container


def test_the_inference_service_selects_this_runtime_with_the_v2_protocol(runtime, isvc):
    model = isvc["spec"]["predictor"]["model"]
    formats = {(f["name"], f.get("version")) for f in runtime["spec"]["supportedModelFormats"]}
    assert (model["modelFormat"]["name"], model["modelFormat"].get("version")) in formats
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"] == ["v2"]
    assert model["storageUri"].startswith(("pvc://", "s3://", "gs://", "https://"))


def test_the_runtime_configures_the_service_as_it_reads_its_settings(runtime):
    (container,) = runtime["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert {k.removeprefix("ATTNSERVE_").lower() for k in env} <= settings_fields()
    assert env["ATTNSERVE_MODEL_REPOSITORY"] == "/mnt/models"  # where KServe's storage initializer puts storageUri
    port = int(env["ATTNSERVE_PORT"])
    assert [p["containerPort"] for p in container["ports"]] == [port]
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["port"] == port and get["path"] in route_paths()
    assert runtime["metadata"]["annotations"]["prometheus.kserve.io/path"] in route_paths()
