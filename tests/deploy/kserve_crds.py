"""The parts of KServe's CRDs that ``deploy/kserve/`` uses, written down from KServe 0.14's
``config/crd/full/serving.kserve.io_{servingruntimes,inferenceservices}.yaml`` as JSON Schema.

Each object lists every property the CRD declares at that level (so a valid field passes) and
refuses any other (the API server would silently drop a misspelt one); the types and required
fields are the CRD's. Containers are checked with the Kubernetes core schema (a Pod), not here.
"""

from __future__ import annotations

KSERVE_VERSION = "0.14"

# The protocol versions KServe knows (``InferenceServiceProtocol`` in ``pkg/constants``); the CRDs
# type ``protocolVersions`` and ``protocolVersion`` as plain strings, so the tests check against these.
PROTOCOLS = ("v1", "v2", "grpc-v1", "grpc-v2")

_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}

SERVING_RUNTIME = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "serving.kserve.io/v1alpha1"},
        "kind": {"enum": ["ServingRuntime", "ClusterServingRuntime"]},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["containers"],
            "additionalProperties": False,
            "properties": {
                "affinity": {"type": "object"},
                "annotations": _STRINGS,
                "builtInAdapter": {"type": "object"},
                "containers": {"type": "array", "items": {"type": "object", "required": ["name"]}},
                "disabled": {"type": "boolean"},
                "grpcDataEndpoint": {"type": "string"},
                "grpcEndpoint": {"type": "string"},
                "hostIPC": {"type": "boolean"},
                "httpDataEndpoint": {"type": "string"},
                "imagePullSecrets": {"type": "array"},
                "labels": _STRINGS,
                "multiModel": {"type": "boolean"},
                "nodeSelector": _STRINGS,
                "protocolVersions": {"type": "array", "items": {"type": "string"}},
                "replicas": {"type": "integer"},
                "storageHelper": {"type": "object", "properties": {"disabled": {"type": "boolean"}}},
                "supportedModelFormats": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "autoSelect": {"type": "boolean"},
                            "name": {"type": "string"},
                            "priority": {"type": "integer", "minimum": 1},
                            "version": {"type": "string"},
                        },
                    },
                },
                "tolerations": {"type": "array"},
                "volumes": {"type": "array"},
                "workerSpec": {"type": "object"},
            },
        },
    },
}

_MODEL_SPEC_PROPERTIES = {  # ModelSpec: modelFormat, runtime, and the predictor extension (a Container's fields)
    "modelFormat": {
        "type": "object",
        "required": ["name"],
        "additionalProperties": False,
        "properties": {"name": {"type": "string"}, "version": {"type": "string"}},
    },
    "runtime": {"type": "string"},
    "protocolVersion": {"type": "string"},
    "runtimeVersion": {"type": "string"},
    "storageUri": {"type": "string"},
    "storage": {"type": "object"},
    **{
        name: {}
        for name in [
            "args",
            "command",
            "env",
            "envFrom",
            "image",
            "imagePullPolicy",
            "lifecycle",
            "livenessProbe",
            "name",
            "ports",
            "readinessProbe",
            "resizePolicy",
            "resources",
            "restartPolicy",
            "securityContext",
            "startupProbe",
            "stdin",
            "stdinOnce",
            "terminationMessagePath",
            "terminationMessagePolicy",
            "tty",
            "volumeDevices",
            "volumeMounts",
            "workingDir",
        ]
    },
}

INFERENCE_SERVICE = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "serving.kserve.io/v1beta1"},
        "kind": {"const": "InferenceService"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["predictor"],
            "additionalProperties": False,
            "properties": {
                "predictor": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "model": {
                            "type": "object",
                            "required": ["modelFormat"],
                            "additionalProperties": False,
                            "properties": _MODEL_SPEC_PROPERTIES,
                        },
                        **{
                            name: {}
                            for name in [
                                "affinity",
                                "annotations",
                                "batcher",
                                "canaryTrafficPercent",
                                "containerConcurrency",
                                "containers",
                                "deploymentStrategy",
                                "imagePullSecrets",
                                "labels",
                                "logger",
                                "maxReplicas",
                                "minReplicas",
                                "nodeSelector",
                                "scaleMetric",
                                "scaleTarget",
                                "serviceAccountName",
                                "timeout",
                                "tolerations",
                                "volumes",
                                "workerSpec",
                            ]
                        },
                        "minReplicas": {"type": "integer", "minimum": 0},
                    },
                },
                "transformer": {"type": "object"},
                "explainer": {"type": "object"},
            },
        },
    },
}
