"""The registry on its own: real onnxruntime sessions on the shipped models, and repositories derived from them.

Derived repositories live in ``tmp_path``: each entry links to the shipped files and carries its own
``manifest.json`` (``manifest.json`` is not among the files it lists), so that an entry can be renamed,
re-versioned or given another task cheaply; a file to corrupt is a real copy. Settings shrink the
warm-up (batch sizes 2 and 1, one decoder row), so that loading both models takes well under a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from service.classifier import Classifier
from service.errors import ModelNotFound, ModelNotReady, ShuttingDown
from service.metrics import Metrics
from service.precision import choose
from service.registry import SERVED_TASKS, Registry, Status
from service.runtime import decoding_lanes
from service.settings import Settings
from service.translator import Limits
from tests.conftest import SHIPPED_TRANSLATOR

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "models"
VIT, TRANSLATOR = SHIPPED / "vit" / "1", SHIPPED_TRANSLATOR
VERSIONS = {"vit": VIT.name, "translator": TRANSLATOR.name}
CPU = "CPUExecutionProvider"
CLASSIFY, TRANSLATE = "image-classification", "translation"

# Small limits: warm-up runs batch sizes 2 and 1 and one decoder row; 503s carry a recognisable Retry-After.
SMALL = {
    "execution_provider": "cpu",
    "intra_op_threads": 1,
    "max_batch_size": 2,
    "max_images_per_request": 2,
    "max_queue_images": 4,
    "model_instances": 1,
    "max_running_sequences": 1,
    "max_beam_size": 1,
    "retry_after_s": 7,
}


def settings(repository: Path, **overrides) -> Settings:
    return Settings(model_repository=repository, **{**SMALL, **overrides})


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=120))


@contextlib.asynccontextmanager
async def loaded(repository: Path, **overrides):
    registry = Registry(settings(repository, **overrides), Metrics())
    await registry.load()
    try:
        yield registry
    finally:
        await registry.close()


def derive(
    src: Path,
    dst: Path,
    edit: Callable[[dict], None] | None = None,
    files: dict[str, bytes] | None = None,
) -> Path:
    """``dst``: the entry ``src`` with links to its files, its manifest passed through ``edit``, and
    ``files`` written as real files in place of the links (the manifest's sha256s are left as they were)."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "manifest.json":
            (dst / f.name).symlink_to(f)
    for name, content in (files or {}).items():
        (dst / name).unlink()
        (dst / name).write_bytes(content)
    manifest = json.loads((src / "manifest.json").read_text())
    if edit is not None:
        edit(manifest)
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return dst


def manifest_of(entry: Path) -> dict:
    return json.loads((entry / "manifest.json").read_text())


def metric_samples(metrics: Metrics) -> dict[tuple[str, frozenset], float]:
    text = metrics.render()[0].decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def key(name: str, **labels: str) -> tuple[str, frozenset]:
    return name, frozenset(labels.items())


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metric_samples(metrics).get(key(name, **labels))


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def registry_log():
    """The records of ``attnserve.registry``, whatever other tests did to the ``attnserve`` loggers."""
    logger = logging.getLogger("attnserve.registry")
    handler = ListHandler()
    saved = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)


@pytest.fixture
def linked_translator(tmp_path) -> Path:
    """A repository root holding the shipped translator (linked); tests add a ViT entry of their own."""
    root = tmp_path / "models"
    derive(TRANSLATOR, root / "translator" / TRANSLATOR.name)
    return root


def sample_pixels(*names: str) -> tuple[np.ndarray, list[int]]:
    """The shipped ViT's own real test samples (``sample-<class>-<label>.png``), as uint8 (N, 28, 28)."""
    by_file = {s["file"]: s["index"] for s in manifest_of(VIT)["samples"]}
    images = [np.asarray(Image.open(VIT / name)) for name in names]
    return np.stack(images), [by_file[name] for name in names]


# ---- a good repository ---------------------------------------------------------------------------------------
def test_the_shipped_repository_loads_every_model_ready_with_its_provider_and_gauges(registry_log):
    async def body():
        async with loaded(SHIPPED) as registry:
            return (
                registry,
                {k: (m.name, m.version, m.task, m.status, m.reason, m.provider) for k, m in registry.models.items()},
                registry.readiness(),
                [m.key for m in registry.servable()],
                metric_samples(registry.metrics),
                [
                    (m.load_seconds, m.classifier, m.batcher, m.translator, m.scheduler)
                    for m in registry.models.values()
                ],
            )

    registry, models, readiness, servable, samples, parts = run(body())
    assert models == {
        "translator": ("translator", "3", TRANSLATE, Status.READY, None, CPU),
        "vit": ("vit", "1", CLASSIFY, Status.READY, None, CPU),
    }
    assert registry.loaded and registry.repository_error is None
    assert readiness == (True, [])
    assert servable == ["translator/3", "vit/1"]
    (t_seconds, t_cls, t_batcher, t_tr, t_sched), (v_seconds, v_cls, v_batcher, v_tr, v_sched) = parts
    assert t_cls is None and t_batcher is None and t_tr is not None and t_sched is not None
    assert v_cls is not None and v_batcher is not None and v_tr is None and v_sched is None
    assert 0 < t_seconds < 60 and 0 < v_seconds < 60
    for name in ("translator", "vit"):
        assert samples[key("attnserve_model_provider_info", model=name, version=VERSIONS[name], provider=CPU)] == 1
        assert samples[key("attnserve_model_ready", model=name, version=VERSIONS[name])] == 1
    assert sample(registry.metrics, "attnserve_model_ready", model="vit", version="1") == 0  # after close()
    ready_lines = [
        r.getMessage() for r in registry_log if r.levelno == logging.INFO and r.getMessage().startswith("ready: ")
    ]
    assert ready_lines == [f"ready: translator/3 on {CPU}, vit/1 on {CPU}"]


def test_a_classifier_is_warmed_up_by_two_runs_and_one_of_its_attention_graph_whatever_its_largest_batch(
    monkeypatch,
):
    runs = []
    real_run, real_attention = Classifier.run, Classifier.run_with_attention
    monkeypatch.setattr(Classifier, "run", lambda self, x: runs.append(("logits", len(x))) or real_run(self, x))
    monkeypatch.setattr(
        Classifier,
        "run_with_attention",
        lambda self, x: runs.append(("attention", len(x))) or real_attention(self, x),
    )

    async def body():
        async with loaded(SHIPPED, max_batch_size=256, max_queue_images=256) as registry:
            return registry.models["vit"].status

    assert run(body()) == Status.READY
    assert runs == [("logits", 256), ("logits", 1), ("attention", 1)]


def test_the_served_classifier_answers_the_shipped_samples_through_its_batcher():
    pixels, classes = sample_pixels("sample-3-dress.png", "sample-7-sneaker.png")

    async def body():
        async with loaded(SHIPPED) as registry:
            vit = registry.get("vit")
            rows = vit.classifier.preprocessing.stack(list(pixels))
            probabilities, order, _ = await asyncio.wait_for(vit.batcher.submit(rows), 30)
            return probabilities, order, metric_samples(registry.metrics)

    probabilities, order, samples = run(body())
    assert order[:, 0].tolist() == classes == [3, 7]
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-9)
    # the batcher reports to this registry's metrics, under the model's name
    assert samples[key("attnserve_images_total", model="vit", version="1")] == 2
    assert samples[key("attnserve_batch_size_count", model="vit", version="1")] == 1
    assert samples[key("attnserve_batch_size_sum", model="vit", version="1")] == 2


def test_the_served_translator_decodes_through_its_scheduler_as_its_manifest_recorded():
    examples = manifest_of(TRANSLATOR)["evaluation"]["examples"]
    example = next(e for e in examples if e["domain"] == "ding")  # an everyday sentence, as a visitor tries

    async def body():
        async with loaded(SHIPPED) as registry:
            served = registry.get(None, TRANSLATE)
            translator = served.translator
            (job,) = translator.jobs(
                [example["source"]],
                limits=Limits(2000, 256, 256, 1),
                beam_size=1,
                length_penalty=1.0,
                num_return_sequences=1,
                max_new_tokens=None,
            )
            (ticket,) = served.scheduler.submit(job.requests)
            await asyncio.wait_for(ticket.future, 60)
            return served.name, translator.result(job, nbest=False), metric_samples(registry.metrics)

    name, result, samples = run(body())
    assert name == "translator"
    assert result["translation"] == example["greedy"] and result["finished"] is True
    # one decoder step per generated token, plus the step that produced </s>
    steps = len(result["target_tokens"]) + 1
    assert samples[key("attnserve_generated_tokens_total", model="translator", version=TRANSLATOR.name)] == steps
    assert samples[key("attnserve_decode_step_rows_sum", model="translator", version=TRANSLATOR.name)] == steps
    assert samples[key("attnserve_time_to_first_token_seconds_count", model="translator", version=TRANSLATOR.name)] == 1


def test_describe_gives_what_a_client_needs_for_each_model():
    async def body():
        async with loaded(SHIPPED) as registry:
            return {name: m.describe() for name, m in registry.models.items()}

    described = run(body())
    vit_manifest, int8_manifest = manifest_of(VIT), manifest_of(TRANSLATOR / "int8")
    assert described["vit"] == {
        "name": "vit",
        "version": "1",
        "task": CLASSIFY,
        "status": "ready",
        "reason": None,
        "provider": CPU,
        "created_at": vit_manifest["created_at"],
        "labels": vit_manifest["labels"],
        "evaluation": vit_manifest["evaluation"],
        "precision": "fp32",
        "variant_of": None,
        "precision_reason": "no int8 variant",
        "input": {"image_size": 28, "channels": 1, "color_mode": "L"},
        "attention": {"layers": 6, "heads": 4, "grid": [7, 7]},
        "max_batch_size": 2,
    }
    assert described["translator"] == {
        "name": "translator",
        "version": TRANSLATOR.name,
        "task": TRANSLATE,
        "status": "ready",
        "reason": None,
        "provider": CPU,
        "created_at": int8_manifest["created_at"],
        "labels": None,
        "evaluation": int8_manifest["evaluation"],
        "precision": "int8",  # the shipped version's int8 variant passes both of auto's tests
        "variant_of": f"translator/{TRANSLATOR.name}",
        "precision_reason": choose(TRANSLATOR, "auto", on_cpu=True)[2],
        "languages": {"source": "en", "target": "de"},
        "decoding": {"default_beam_size": 1, "default_length_penalty": 1.0},  # the manifest's 4, capped by SMALL
        "attention": {"encoder_layers": 5, "decoder_layers": 2, "heads": 4},
        "scheduler": {
            "running_sequences": 0,
            "running_rows": 0,
            "waiting_sequences": 0,
            "waiting_rows": 0,
            "max_running_rows": 1,
            "max_waiting_rows": 512,
            "lanes": decoding_lanes(Settings(**SMALL), CPU),  # one per core, as intra_op_threads is 1
        },
    }


def test_get_resolves_names_task_defaults_and_refuses_what_it_cannot_serve():
    async def body():
        out = {}
        async with loaded(SHIPPED) as registry:
            out["default classifier"] = registry.get(None).key
            out["default translator"] = registry.get(None, TRANSLATE).key
            out["by name"] = registry.get("vit", CLASSIFY).key
            for label, args in {
                "unknown": ("nope",),
                "wrong task": ("translator",),
                "wrong task, other way": ("vit", TRANSLATE),
            }.items():
                with pytest.raises(ModelNotFound) as e:
                    registry.get(*args)
                out[label] = (e.value.status, e.value.code, e.value.message)
        async with loaded(SHIPPED, default_model="vit") as registry:
            out["setting"] = registry.get(None).key
            out["setting is for classifiers only"] = registry.default_model_name(TRANSLATE)
        async with loaded(SHIPPED, default_model="vit2") as registry:
            with pytest.raises(ModelNotFound) as e:
                registry.get(None)
            out["setting names a missing model"] = e.value.message
        return out

    out = run(body())
    assert out["default classifier"] == "vit/1" and out["default translator"] == "translator/3"
    assert out["by name"] == "vit/1"
    assert out["unknown"] == (404, "model_not_found", "no model named 'nope' (loaded models: translator, vit)")
    assert out["wrong task"] == (
        404,
        "model_not_found",
        "model 'translator' is a 'translation' model, not a 'image-classification' model",
    )
    assert out["wrong task, other way"][2] == "model 'vit' is a 'image-classification' model, not a 'translation' model"
    assert out["setting"] == "vit/1"
    assert out["setting is for classifiers only"] == "translator"
    assert out["setting names a missing model"] == "no model named 'vit2' (loaded models: translator, vit)"


def test_with_two_classifiers_the_default_is_the_first_by_name_unless_the_setting_names_one(tmp_path):
    root = tmp_path / "models"
    derive(VIT, root / "zvit" / "1", lambda m: m.update(name="zvit"))
    derive(VIT, root / "vit" / "1")

    async def body():
        async with loaded(root) as registry:
            by_name = registry.get(None).name
        async with loaded(root, default_model="zvit") as registry:
            by_setting = registry.get(None).name
        return by_name, by_setting

    assert run(body()) == ("vit", "zvit")


# ---- failures ----------------------------------------------------------------------------------------------
def test_a_corrupted_file_fails_its_model_with_the_sha256_reason_and_the_other_model_stays_ready(
    linked_translator, registry_log
):
    data = bytearray((VIT / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    derive(VIT, linked_translator / "vit" / "1", files={"model.onnx": bytes(data)})

    async def body():
        async with loaded(linked_translator) as registry:
            vit = registry.models["vit"]
            with pytest.raises(ModelNotReady) as refused:
                registry.get("vit")
            return (
                (vit.status, vit.reason, vit.task, vit.manifest, vit.classifier, vit.batcher, vit.provider),
                registry.models["translator"].status,
                registry.readiness(),
                refused.value,
                registry.get(None, TRANSLATE).key,
                vit.describe(),
                metric_samples(registry.metrics),
            )

    vit, translator_status, readiness, refused, translator_key, described, samples = run(body())
    status, reason, task, manifest, classifier, batcher, provider = vit
    assert status is Status.FAILED and task == CLASSIFY
    path = linked_translator / "vit" / "1" / "model.onnx"
    assert reason.startswith(f"{path}: sha256 mismatch (manifest ")
    assert reason.endswith("the file is corrupted or was replaced without re-exporting")
    assert (manifest, classifier, batcher, provider) == (None, None, None, None)
    assert translator_status is Status.READY and translator_key == "translator/3"
    assert readiness == (False, [f"vit/1: failed ({reason})"])
    assert (refused.status, refused.code) == (503, "model_not_ready")
    assert refused.message == f"model vit/1 is failed: {reason}"
    assert refused.headers == {"Retry-After": "7"}
    assert described["status"] == "failed" and described["reason"] == reason
    assert described["created_at"] is None and "input" not in described and "max_batch_size" not in described
    assert key("attnserve_model_ready", model="translator", version=TRANSLATOR.name) in samples
    assert not any(name == "attnserve_model_provider_info" and ("model", "vit") in labels for name, labels in samples)
    (error,) = [r for r in registry_log if r.levelno == logging.ERROR and "failed to load" in r.getMessage()]
    assert error.getMessage() == f"model vit/1 failed to load and will not be served: {reason}"
    assert (error.model, error.version) == ("vit", "1")
    summary = [r.getMessage() for r in registry_log if r.getMessage().startswith("not ready: ")]
    assert summary == [f"not ready: vit/1: failed ({reason})"]


def test_a_graph_onnxruntime_cannot_parse_fails_with_onnxruntime_s_error(linked_translator):
    garbage = b"this is not an onnx graph\n" * 8

    def record_garbage(manifest: dict) -> None:  # the sha256 matches: only onnxruntime can refuse it
        manifest["files"]["model.onnx"] = {"sha256": hashlib.sha256(garbage).hexdigest(), "bytes": len(garbage)}

    derive(VIT, linked_translator / "vit" / "1", record_garbage, files={"model.onnx": garbage})

    async def body():
        async with loaded(linked_translator) as registry:
            return registry.models["vit"], registry.readiness()

    vit, (ready, reasons) = run(body())
    assert vit.status is Status.FAILED and vit.classifier is None and vit.batcher is None
    assert vit.reason.startswith("InvalidProtobuf: ")  # the exception's type, then onnxruntime's message
    assert str(linked_translator / "vit" / "1" / "model.onnx") in vit.reason
    assert vit.manifest is not None  # the manifest was verified before the session failed
    assert not ready and reasons == [f"vit/1: failed ({vit.reason})"]


def _rename_image_input(manifest: dict) -> None:
    """The manifest agrees with itself (io names an input its graph section lists) but not with model.onnx."""
    manifest["io"]["images"] = "pixels"
    manifest["graphs"]["model"]["inputs"][0]["name"] = "pixels"


def test_a_manifest_the_graph_contradicts_fails_once_the_session_shows_it(linked_translator):
    derive(VIT, linked_translator / "vit" / "1", _rename_image_input)

    async def body():
        async with loaded(linked_translator) as registry:
            return registry.models["vit"], registry.readiness()

    vit, readiness = run(body())
    assert vit.status is Status.FAILED and vit.classifier is None and vit.batcher is None
    assert vit.reason == (
        f"{linked_translator / 'vit' / '1'}: manifest names input 'pixels' / output 'logits' but the graph has "
        "inputs ['pixel_values'] and outputs ['logits']"
    )
    assert readiness == (False, [f"vit/1: failed ({vit.reason})"])


def test_a_model_that_failed_after_its_session_was_created_reports_no_provider(linked_translator):
    derive(VIT, linked_translator / "vit" / "1", _rename_image_input)

    async def body():
        async with loaded(linked_translator) as registry:
            return registry.models["vit"]

    vit = run(body())
    assert vit.status is Status.FAILED
    assert vit.provider is None and vit.describe()["provider"] is None


def test_a_manifest_that_names_another_entry_fails_the_entry(linked_translator):
    derive(VIT, linked_translator / "vit" / "2")  # still says version "1"

    async def body():
        async with loaded(linked_translator) as registry:
            return registry.models["vit"]

    vit = run(body())
    assert (vit.version, vit.status) == ("2", Status.FAILED)
    assert vit.reason == (f"{linked_translator / 'vit' / '2'}: manifest says vit/1 but the entry lives in vit/2")


def test_an_unreadable_manifest_fails_before_the_task_is_known(linked_translator):
    entry = derive(VIT, linked_translator / "vit" / "1")
    (entry / "manifest.json").write_text('{"schema_version": 1, "name": "vit",')

    async def body():
        async with loaded(linked_translator) as registry:
            vit = registry.models["vit"]
            with pytest.raises(ModelNotReady) as refused:  # no task to check it against: refused as not ready
                registry.get("vit")
            return vit, registry.readiness(), [m.key for m in registry.servable()], refused.value.message

    vit, readiness, servable, refused = run(body())
    assert vit.status is Status.FAILED and vit.task is None
    assert vit.reason.startswith(f"{entry / 'manifest.json'}: not valid JSON (")
    assert readiness == (False, [f"vit/1: failed ({vit.reason})"])
    assert servable == ["translator/3"]
    assert refused == f"model vit/1 is failed: {vit.reason}"


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="this onnxruntime offers CUDA")
@pytest.mark.parametrize(
    ("demand", "reason_start"),
    [
        ({"execution_provider": "cuda"}, "execution_provider='cuda' but this onnxruntime build offers only ["),
        ({"execution_provider": "auto", "require_gpu": True}, "require_gpu is set but "),
    ],
)
def test_a_gpu_demand_on_a_cpu_only_onnxruntime_fails_every_model(demand, reason_start):
    async def body():
        async with loaded(SHIPPED, **demand) as registry:
            return {k: (m.status, m.reason) for k, m in registry.models.items()}, registry.readiness()

    models, (ready, reasons) = run(body())
    assert {k: status for k, (status, _) in models.items()} == {"translator": Status.FAILED, "vit": Status.FAILED}
    assert all(reason.startswith(reason_start) for _, reason in models.values()), models
    if demand.get("require_gpu"):
        assert f"runs on {CPU}" in models["vit"][1] and "model.onnx" in models["vit"][1]
        assert "encoder.onnx" in models["translator"][1]
    assert not ready and len(reasons) == 2


# ---- unsupported tasks, versions, empty repositories ----------------------------------------------------------
def _speech(manifest: dict) -> None:
    manifest["name"], manifest["task"] = "asr", "speech-recognition"


def test_an_unsupported_task_is_listed_with_its_reason_and_does_not_block_readiness(tmp_path):
    root = tmp_path / "models"
    derive(VIT, root / "vit" / "1")
    derive(VIT, root / "asr" / "1", _speech)

    async def body():
        async with loaded(root) as registry:
            asr = registry.models["asr"]
            with pytest.raises(ModelNotFound) as refused:
                registry.get("asr")
            return asr, registry.readiness(), [m.key for m in registry.servable()], refused.value.message

    asr, readiness, servable, refused = run(body())
    assert "speech-recognition" not in SERVED_TASKS
    assert (asr.status, asr.task) == (Status.UNSUPPORTED, "speech-recognition")
    assert asr.reason == "task 'speech-recognition' is not served by this version of the service"
    assert asr.classifier is None and asr.batcher is None and asr.provider is None
    assert asr.describe()["status"] == "unsupported"
    assert readiness == (True, [])
    assert servable == ["vit/1"]
    assert refused == "model 'asr' is a 'speech-recognition' model, not a 'image-classification' model"


def test_a_repository_with_only_unsupported_tasks_is_not_ready(tmp_path):
    root = tmp_path / "models"
    derive(VIT, root / "asr" / "1", _speech)

    async def body():
        async with loaded(root) as registry:
            return registry.models["asr"].status, registry.readiness()

    status, readiness = run(body())
    assert status is Status.UNSUPPORTED
    assert readiness == (False, [f"no model in {root} has a task this service serves"])


def test_the_highest_numeric_version_is_the_one_served(tmp_path):
    root = tmp_path / "models"
    for version in ("2", "9", "10"):
        derive(VIT, root / "vit" / version, lambda m, v=version: m.update(version=v))
    derive(VIT, root / "vit" / "latest")  # not a number: never a version

    async def body():
        async with loaded(root) as registry:
            vit = registry.get("vit")
            ready = sample(registry.metrics, "attnserve_model_ready", model="vit", version="10")
            return list(registry.models), vit.key, vit.path, vit.describe()["version"], ready

    names, key, path, described_version, ready = run(body())
    assert names == ["vit"]
    assert (key, path, described_version) == ("vit/10", root / "vit" / "10", "10")
    assert ready == 1


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ("missing", "model repository {root} does not exist"),
        ("empty", "model repository {root} holds no <name>/<version>/ entries"),
        ("no numeric versions", "model repository {root} holds no <name>/<version>/ entries"),
    ],
)
def test_a_repository_without_entries_is_not_ready_and_says_why(tmp_path, layout, message):
    root = tmp_path / "models"
    if layout != "missing":
        root.mkdir()
    if layout == "no numeric versions":
        derive(VIT, root / "vit" / "latest")

    async def body():
        async with loaded(root) as registry:
            with pytest.raises(ModelNotFound) as refused:
                registry.get(None)
            return registry, registry.readiness(), refused.value.message

    registry, readiness, refused = run(body())
    expected = message.format(root=root)
    assert registry.loaded and registry.models == {}
    assert registry.repository_error == expected
    assert readiness == (False, [expected])
    assert refused == "no model loaded"


# ---- before loading, and stopping ----------------------------------------------------------------------------
def test_before_loading_nothing_is_ready_and_requests_are_told_to_retry():
    registry = Registry(settings(SHIPPED), Metrics())
    assert registry.readiness() == (False, ["loading the model repository"])
    for name in (None, "vit"):
        with pytest.raises(ModelNotReady) as refused:
            registry.get(name)
        assert (refused.value.status, refused.value.message) == (503, "models are still loading")
        assert refused.value.headers == {"Retry-After": "7"}


def test_stop_loading_before_load_leaves_every_model_unstarted_and_not_ready():
    async def body():
        registry = Registry(settings(SHIPPED), Metrics())
        registry.stop_loading()
        await registry.load()
        try:
            with pytest.raises(ModelNotReady) as refused:
                registry.get("vit")
            return (
                {k: (m.status, m.batcher, m.scheduler) for k, m in registry.models.items()},
                registry.readiness(),
                refused.value.message,
                sample(registry.metrics, "attnserve_model_ready", model="vit", version="1"),
            )
        finally:
            await registry.close()

    models, readiness, refused, ready_gauge = run(body())
    assert models == {"translator": (Status.WARMING, None, None), "vit": (Status.WARMING, None, None)}
    assert readiness == (False, ["translator/3: warming", "vit/1: warming"])
    assert refused == "model vit/1 is warming"
    assert ready_gauge is None  # never set: no model became ready


def test_close_stops_the_batcher_and_the_scheduler_and_takes_the_ready_gauge_down():
    pixels, _ = sample_pixels("sample-0-t-shirt-top.png")

    async def body():
        registry = Registry(settings(SHIPPED), Metrics())
        await registry.load()
        vit, translator = registry.get("vit"), registry.get("translator", TRANSLATE)
        gauges_before = {
            name: sample(registry.metrics, "attnserve_model_ready", model=name, version=VERSIONS[name])
            for name in ("vit", "translator")
        }
        threads_before = sorted(t.name for t in threading.enumerate() if t.name.startswith("ort-vit/1"))
        await registry.close()
        gauges_after = {
            name: sample(registry.metrics, "attnserve_model_ready", model=name, version=VERSIONS[name])
            for name in ("vit", "translator")
        }
        threads_after = [t.name for t in threading.enumerate() if t.name.startswith("ort-vit/1")]
        with pytest.raises(ShuttingDown) as batcher_refused:
            vit.batcher.submit(vit.classifier.preprocessing.stack([pixels[0]]))
        (job,) = translator.translator.jobs(
            ["Hello."],
            limits=Limits(100, 32, 32, 1),
            beam_size=1,
            length_penalty=1.0,
            num_return_sequences=1,
            max_new_tokens=None,
        )
        with pytest.raises(ShuttingDown) as scheduler_refused:
            translator.scheduler.submit(job.requests)
        return (
            gauges_before,
            gauges_after,
            threads_before,
            threads_after,
            batcher_refused.value,
            scheduler_refused.value,
        )

    before, after, threads_before, threads_after, batcher_refused, scheduler_refused = run(body())
    assert before == {"vit": 1, "translator": 1}
    assert after == {"vit": 0, "translator": 0}
    assert threads_before == ["ort-vit/1_0"] and threads_after == []  # model_instances=1: one thread, joined
    assert (batcher_refused.status, batcher_refused.code) == (503, "shutting_down")
    assert batcher_refused.message == "model vit/1 is shutting down"
    assert scheduler_refused.message == "model translator/3 is shutting down"
