"""prometheus-adapter's configuration file (``config.yaml``) as JSON Schema, written down from the
adapter's Go types (kubernetes-sigs/prometheus-adapter ``pkg/config/config.go``, v0.12).

The adapter reads the file with ``yaml.UnmarshalStrict``: a field it does not know fails its start,
so every object here lists the fields of its Go type and refuses any other. ``render`` fills a
``metricsQuery`` template as the adapter does for a request about some pods, so that Prometheus itself
can evaluate it (tests/deploy/test_replicas.py runs it through promtool).
"""

from __future__ import annotations

_GROUP_RESOURCE = {
    "type": "object",
    "required": ["resource"],
    "additionalProperties": False,
    "properties": {"group": {"type": "string"}, "resource": {"type": "string"}},
}

_RESOURCE_MAPPING = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "template": {"type": "string"},
        "overrides": {"type": "object", "additionalProperties": _GROUP_RESOURCE},
        "namespaced": {"type": "boolean"},
    },
}

_DISCOVERY_RULE = {
    "type": "object",
    "required": ["seriesQuery"],
    "additionalProperties": False,
    "properties": {
        "seriesQuery": {"type": "string", "minLength": 1},
        "seriesFilters": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "maxProperties": 1,  # "Only one field may be set at a time"
                "properties": {"is": {"type": "string"}, "isNot": {"type": "string"}},
            },
        },
        "resources": _RESOURCE_MAPPING,
        "name": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"matches": {"type": "string"}, "as": {"type": "string"}},
        },
        "metricsQuery": {"type": "string"},
        "labelValueReplacements": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"find": {"type": "string"}, "replace": {"type": "string"}},
            },
        },
    },
}

_RESOURCE_RULE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "containerQuery": {"type": "string"},
        "nodeQuery": {"type": "string"},
        "resources": _RESOURCE_MAPPING,
        "containerLabel": {"type": "string"},
    },
}

CONFIG = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "rules": {"type": "array", "items": _DISCOVERY_RULE},
        "externalRules": {"type": "array", "items": _DISCOVERY_RULE},
        "resourceRules": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"cpu": _RESOURCE_RULE, "memory": _RESOURCE_RULE, "window": {"type": "string"}},
        },
    },
}


def render(metrics_query: str, namespace: str, pods: list[str]) -> str:
    """The query the adapter sends Prometheus for ``pods`` of ``namespace``: ``<<.LabelMatchers>>`` the
    resources' label matchers, ``<<.GroupBy>>`` the label of the resource asked about (here ``pod``)."""
    matchers = f'namespace="{namespace}",pod=~"{"|".join(pods)}"'
    return metrics_query.replace("<<.LabelMatchers>>", matchers).replace("<<.GroupBy>>", "pod")
