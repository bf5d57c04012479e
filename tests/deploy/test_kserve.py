"""``deploy/kserve/``: the ServingRuntimes and InferenceServices validate against KServe's CRDs (as written
down in ``kserve_crds.py``), their containers against the Kubernetes schema, and they agree with each
other and with the service (settings, port, probe routes, protocol). Two pairs: ``v2`` (REST, the
runtime's one port HTTP) and ``grpc-v2`` (its one port gRPC, named ``h2c``), since under Knative a
serving container has one port."""

from __future__ import annotations

import copy
import re

import jsonschema
import pytest
import yaml

from tests.deploy.kserve_crds import INFERENCE_SERVICE, PROTOCOLS, SERVING_RUNTIME
from tests.deploy.parsing import ROOT, drain_seconds, route_paths, settings_fields, settings_from
from tests.deploy.test_k8s import schema_versions

kubernetes_validate = pytest.importorskip("kubernetes_validate")

KSERVE = ROOT / "deploy" / "kserve"
PAIRS = {  # protocol: (runtime file, InferenceService file)
    "v2": ("servingruntime.yaml", "inferenceservice.yaml"),
    "grpc-v2": ("servingruntime-grpc.yaml", "inferenceservice-grpc.yaml"),
}


@pytest.fixture(scope="module", params=list(PAIRS))
def protocol(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def runtime(protocol) -> dict:
    return yaml.safe_load((KSERVE / PAIRS[protocol][0]).read_text())


@pytest.fixture(scope="module")
def isvc(protocol) -> dict:
    return yaml.safe_load((KSERVE / PAIRS[protocol][1]).read_text())


def env_of(runtime: dict) -> dict[str, str]:
    (container,) = runtime["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"]}


def probe_target(probe: dict) -> tuple[int, str]:
    """(port, path) a probe asks: an ``httpGet``, or an ``exec`` fetching a loopback URL."""
    if "httpGet" in probe:
        return probe["httpGet"]["port"], probe["httpGet"]["path"]
    (url,) = re.findall(r"http://127\.0\.0\.1:(\d+)(/[\w/]+)", " ".join(probe["exec"]["command"]))
    return int(url[0]), url[1]


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


def test_the_inference_service_selects_its_runtime_with_its_protocol(protocol, runtime, isvc):
    model = isvc["spec"]["predictor"]["model"]
    formats = {(f["name"], f.get("version")) for f in runtime["spec"]["supportedModelFormats"]}
    assert (model["modelFormat"]["name"], model["modelFormat"].get("version")) in formats
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["protocolVersion"] == protocol and runtime["spec"]["protocolVersions"] == [protocol]
    assert protocol in PROTOCOLS
    assert model["storageUri"].startswith(("pvc://", "s3://", "gs://", "https://"))


def test_the_two_pairs_have_names_of_their_own():
    docs = [yaml.safe_load((KSERVE / f).read_text()) for pair in PAIRS.values() for f in pair]
    assert len({(d["kind"], d["metadata"]["name"]) for d in docs}) == len(docs)


def test_the_runtime_configures_the_service_as_it_reads_its_settings(runtime):
    env = env_of(runtime)
    assert {k.removeprefix("ATTNSERVE_").lower() for k in env} <= settings_fields()
    assert env["ATTNSERVE_MODEL_REPOSITORY"] == "/mnt/models"  # where KServe's storage initializer puts storageUri


def test_the_drain_ends_within_the_pods_default_grace_period(runtime, isvc, monkeypatch):
    """Neither file sets the pod's terminationGracePeriodSeconds, so Kubernetes' 30 s applies: the drain delay
    and the drain that follows must end before the kubelet kills the container."""
    assert "terminationGracePeriodSeconds" not in yaml.safe_dump(isvc) + yaml.safe_dump(runtime)
    assert drain_seconds(settings_from(env_of(runtime), monkeypatch)) < 30


def test_the_one_port_is_the_protocols_and_the_probes_ask_real_routes(protocol, runtime):
    """Knative takes one port per container, HTTP/2 cleartext only on a port named ``h2c``: the v2
    runtime declares HTTP (and turns gRPC off), the grpc-v2 runtime declares gRPC as ``h2c``; the
    probes ask the HTTP server's health routes (on the declared port, or from inside the container)."""
    (container,) = runtime["spec"]["containers"]
    env = env_of(runtime)
    http, grpc = int(env["ATTNSERVE_PORT"]), int(env["ATTNSERVE_GRPC_PORT"])
    (port,) = container["ports"]
    if protocol == "v2":
        assert port["containerPort"] == http and grpc == 0 and port.get("name") != "h2c"
    else:
        assert port == {"name": "h2c", "containerPort": grpc, "protocol": "TCP"} and grpc != http
    for probe in ("readinessProbe", "livenessProbe"):
        probe_port, path = probe_target(container[probe])
        assert probe_port == http and path in route_paths()
        if "httpGet" in container[probe]:
            assert probe_port == port["containerPort"]  # Knative probes over HTTP only the declared port
    annotations = runtime["metadata"]["annotations"]  # Prometheus scrapes the pod's address, not Knative's route
    assert int(annotations["prometheus.kserve.io/port"]) == http
    assert annotations["prometheus.kserve.io/path"] in route_paths()
