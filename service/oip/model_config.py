"""What the Open Inference Protocol says about a model: its tensors, and Triton's model configuration.

``tensors`` is the one description of a model's inputs and outputs: the metadata route answers it
as it is, and ``model_config`` turns it into Triton's form (``model_config.proto`` as JSON, what
``tritonclient``'s ``get_model_config`` returns), with what the service's settings decide about
batching and instances. So the two routes cannot disagree about a tensor.

Triton's conventions: with ``max_batch_size`` > 0 the first dimension (the batch) is left out of
``dims``; a tensor that is one element per row, ``[N]`` in the protocol, is ``dims: [1]`` with
``reshape: {shape: []}``; -1 is a dimension of any size; ``BYTES`` is ``TYPE_STRING``.
"""

from __future__ import annotations

from service.registry import ServedModel
from service.runtime import CUDA
from service.settings import Settings
from service.translator import TASK as TRANSLATION
from service.versions import VersionPolicy

PLATFORM = "onnxruntime_onnx"
BACKEND = "onnxruntime"
CONFIG_TYPES = {"BYTES": "TYPE_STRING", "BOOL": "TYPE_BOOL", **{t: f"TYPE_{t}" for t in ("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64")}}  # fmt: skip


def tensors(model: ServedModel) -> tuple[list[dict], list[dict]]:
    """(inputs, outputs) of a ready model as the protocol's metadata lists them: name, datatype, shape
    (the batch first, -1: any size). A request takes exactly one of the inputs."""
    if model.task == TRANSLATION:
        inputs = [_tensor("text", "BYTES", [-1])]
        outputs = [_tensor("translation", "BYTES", [-1]), _tensor("attention_id", "BYTES", [-1])]
        return inputs, outputs
    classifier = model.classifier
    assert classifier is not None  # a ready classifier has one
    inputs = [_tensor("images", "BYTES", [-1]), _tensor("pixels", "FP32", [-1, *classifier.input_shape])]
    outputs = [_tensor("probabilities", "FP64", [-1, len(classifier.labels)])]
    if classifier.attention is not None:
        outputs.append(_tensor("attention_id", "BYTES", [-1]))
    return inputs, outputs


def _tensor(name: str, datatype: str, shape: list[int]) -> dict:
    return {"name": name, "datatype": datatype, "shape": shape}


def model_config(model: ServedModel, policy: VersionPolicy, settings: Settings) -> dict:
    """Triton's model configuration of a ready model version, in its JSON form."""
    inputs, outputs = tensors(model)
    if model.batcher is not None:  # the classifier: dynamic batching
        max_batch_size, instances = model.batcher.max_batch_size, settings.model_instances
        delay_us = round(settings.max_queue_delay_ms * 1000)
        parameters = {}
    else:  # the translator: sentences join and leave the running batch between decoder steps
        max_batch_size, instances, delay_us = settings.max_running_sequences, 1, 0
        parameters = {"batching": {"string_value": "iteration-level"}}
    instance_group: dict = {"name": model.name, "kind": "KIND_CPU", "count": instances}
    if model.provider == CUDA:
        instance_group.update(kind="KIND_GPU", gpus=[settings.cuda_device_id])
    return {
        "name": model.name,
        "platform": PLATFORM,
        "backend": BACKEND,
        "version_policy": _version_policy(policy),
        "max_batch_size": max_batch_size,
        "input": [{**_config_tensor(t), "optional": len(inputs) > 1} for t in inputs],
        "output": [_config_tensor(t) for t in outputs],
        "dynamic_batching": {"max_queue_delay_microseconds": delay_us},
        "instance_group": [instance_group],
        "parameters": parameters,
    }


def _config_tensor(tensor: dict) -> dict:
    dims = tensor["shape"][1:]  # the batch dimension is max_batch_size's
    out = {"name": tensor["name"], "data_type": CONFIG_TYPES[tensor["datatype"]], "dims": dims or [1]}
    if not dims:
        out["reshape"] = {"shape": []}
    return out


def _version_policy(policy: VersionPolicy) -> dict:
    if policy.latest is not None:
        return {"latest": {"num_versions": policy.latest}}
    if policy.specific is None:
        return {"all": {}}
    return {"specific": {"versions": [int(v) for v in policy.specific]}}
