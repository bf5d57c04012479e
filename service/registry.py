"""The models this process serves: loaded from the repository, verified, warmed up, then ready.

Loading runs in the background of the lifespan so that the server answers ``/healthz`` and
``/readyz`` (503, with the reason) while it verifies sha256s and warms up; an orchestrator then
sends traffic only once every model is ready. A model that fails to load stays listed with the
reason, keeps the service not ready, and never takes the process down with it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from contract.manifest import Entry, Manifest, ManifestError, load_entry, read_manifest
from service.classifier import TASK as IMAGE_CLASSIFICATION
from service.classifier import Classifier, shares_weights, warm_up_batch_sizes
from service.engine.batching import Batcher, Intake
from service.engine.scheduler import Scheduler
from service.engine.supervision import Supervision
from service.errors import ModelNotFound, ModelNotReady
from service.faults import Faults, parse
from service.metrics import Metrics
from service.precision import choose
from service.runtime import (
    CPU,
    RuntimeUnavailable,
    SessionHandle,
    SharedWeights,
    create_session,
    decoding_lanes,
    requested_providers,
)
from service.settings import Settings
from service.translator import TASK as TRANSLATION
from service.translator import Translator
from service.versions import VersionPolicy, parse_setting, selected_versions

log = logging.getLogger("attnserve.registry")

SERVED_TASKS = {IMAGE_CLASSIFICATION, TRANSLATION}


class Status(str, enum.Enum):
    PENDING = "pending"
    LOADING = "loading"  # verifying sha256, creating the session
    WARMING = "warming"  # running every batch size once
    READY = "ready"
    FAILED = "failed"
    UNLOADING = "unloading"  # retired: takes no new requests, drains what it has, then goes away
    UNSUPPORTED = "unsupported"  # a task this version of the service does not serve; not a readiness blocker


@dataclass
class ServedModel:
    name: str
    version: str
    path: Path
    task: str | None = None
    status: Status = Status.PENDING
    reason: str | None = None
    manifest: Manifest | None = None
    classifier: Classifier | None = None
    batcher: Batcher | None = None
    translator: Translator | None = None
    scheduler: Scheduler | None = None
    provider: str | None = None
    load_seconds: float | None = None
    precision_reason: str | None = None  # why this precision was loaded (service/precision.py)

    @property
    def key(self) -> str:
        return f"{self.name}/{self.version}"

    @property
    def failing(self) -> str | None:
        """Why a ready model's engine counts as unhealthy (failing again and again), or None."""
        engine = self.batcher or self.scheduler
        return engine.supervision.reason() if engine is not None and self.status is Status.READY else None

    def describe(self) -> dict:
        """The model's entry in ``GET /models``: what a client needs to call it and judge it."""
        m = self.manifest
        out = {
            "name": self.name,
            "version": self.version,
            "task": self.task,
            "status": self.status.value,
            "reason": self.reason,
            "provider": self.provider,
            "created_at": m.created_at if m else None,
            "labels": (m.labels or None) if m else None,
            "evaluation": (m.evaluation or None) if m else None,
            # an int8 variant says so and names the fp32 entry it was made from (export/quantize.py)
            "precision": (m.variant.precision if m.variant else "fp32") if m else None,
            "variant_of": m.variant.from_ if m and m.variant else None,
            "precision_reason": self.precision_reason,
        }
        if self.classifier is not None:
            p = self.classifier.preprocessing
            out["input"] = {"image_size": p.image_size, "channels": p.channels, "color_mode": p.color_mode}
            a = self.classifier.attention
            if a is not None:
                out["attention"] = {"layers": a.layers, "heads": a.heads, "grid": list(a.grid)}
        if self.batcher is not None:
            out["max_batch_size"] = self.batcher.max_batch_size
        if self.translator is not None:
            out["languages"] = m.languages if m else None
            out["decoding"] = {
                "default_beam_size": self.translator.default_beam,
                "default_length_penalty": self.translator.default_length_penalty,
            }
            if self.translator.has_attention:
                att = (m.attention if m else None) or {}
                out["attention"] = {
                    "encoder_layers": att.get("encoder", {}).get("layers"),
                    "decoder_layers": self.translator.spec.layers,
                    "heads": self.translator.spec.heads,
                }
        if self.scheduler is not None:
            out["scheduler"] = self.scheduler.state()
        return out


class Registry:
    def __init__(self, settings: Settings, metrics: Metrics, intake: Intake | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.intake = intake or Intake()
        self.versions: dict[str, dict[str, ServedModel]] = {}  # name -> version -> model, lowest version first
        self.policies: dict[str, VersionPolicy] = {}
        self.repository_error: str | None = None
        self.added_later: set[str] = set()  # models first loaded after startup: until ready, they block nothing
        self.loaded = False  # the load pass has finished (successfully or not)
        self.faults = Faults(parse(settings.faults or ""))  # none unless a drill asks (service/faults.py)
        self._stop = threading.Event()

    # ---- loading -----------------------------------------------------------------------------
    async def load(self) -> None:
        """Discover, verify, create sessions and warm up every model; never raises."""
        root = self.settings.model_repository
        try:
            found = selected_versions(root, parse_setting(self.settings.version_policy))
            if not found:
                raise ManifestError(f"model repository {root} holds no <name>/<version>/ entries")
            empty = [f"{name} ({policy})" for name, (versions, policy) in found.items() if not versions]
            if empty:
                raise ManifestError(f"the version policy selects no version of {', '.join(empty)}")
        except ManifestError as e:
            self.repository_error = str(e)
            log.error("not ready: %s", e)
            self.loaded = True
            return
        for name, (versions, policy) in found.items():
            self.policies[name] = policy
            self.versions[name] = {v: ServedModel(name, v, root / name / v) for v in versions}
        for model in self.all():
            await self.bring_up(model)
        self.loaded = True
        ready, reasons = self.readiness()
        if ready:
            log.info("ready: %s", ", ".join(f"{m.key} on {m.provider}" for m in self.servable()))
        else:
            log.error("not ready: %s", "; ".join(reasons))

    async def bring_up(self, model: ServedModel) -> None:
        """Verify, create sessions and warm up (in a thread), then start the engine: READY, or FAILED with why."""
        await asyncio.to_thread(self._load_one, model)
        if model.status is Status.WARMING and not self._stop.is_set():
            if model.classifier is not None:
                self._start_batcher(model, model.classifier)
            elif model.translator is not None:
                self._start_scheduler(model, model.translator)

    async def retire(self, model: ServedModel, quiet_s: float = 1.0, timeout_s: float = 60.0) -> None:
        """Stop routing to ``model``, let what it queued and runs finish, then stop its engine.

        Requests still on their way to it (a handler that picked this version a moment ago) are
        served: the engine is stopped only after it has been idle for ``quiet_s``.
        """
        model.status = Status.UNLOADING
        engine = model.batcher or model.scheduler
        loop = asyncio.get_running_loop()
        deadline, quiet_since = loop.time() + timeout_s, None
        while engine is not None and loop.time() < deadline:
            if engine.idle:
                quiet_since = quiet_since or loop.time()
                if loop.time() - quiet_since >= quiet_s:
                    break
            else:
                quiet_since = None
            await asyncio.sleep(0.05)
        if model.batcher is not None:
            await model.batcher.stop()
        if model.scheduler is not None:
            await model.scheduler.stop()
        self.metrics.ready.labels(model.name, model.version).set(0)
        if model.provider is not None:
            self.metrics.provider.labels(model.name, model.version, model.provider).set(0)
        log.info("model %s unloaded", model.key, extra={"model": model.name, "version": model.version})

    def _load_one(self, model: ServedModel) -> None:
        """Runs in a worker thread: sha256, session, warm-up. Leaves the model WARMING or FAILED."""
        started = time.perf_counter()
        model.status = Status.LOADING
        try:
            model.task = read_manifest(model.path).get("task")
            if model.task not in SERVED_TASKS:
                model.status = Status.UNSUPPORTED
                model.reason = f"task {model.task!r} is not served by this version of the service"
                log.warning("skipping %s: %s", model.key, model.reason)
                return
            on_cpu = requested_providers(self.settings)[0] == CPU
            folder, precision, model.precision_reason = choose(model.path, self.settings.precision, on_cpu)
            log.info("loading %s in %s: %s", model.key, precision, model.precision_reason)
            entry = load_entry(folder)  # verifies every file's sha256
            if entry.name != model.name or entry.version != model.version:
                raise ManifestError(
                    f"{model.path}: manifest says {entry.name}/{entry.version} but the entry lives in "
                    f"{model.name}/{model.version}"
                )
            model.manifest = entry.manifest
            if model.task == TRANSLATION:
                self._load_translator(model, entry)
                return
            graphs = entry.manifest.graphs
            shared = (
                SharedWeights.map(entry.path / graphs["model"].weights)
                if self.settings.share_classifier_weights and shares_weights(graphs)
                else None
            )
            handle = self._session(entry.path / graphs["model"].file, "model", shared)
            attention = (
                self._session(entry.path / graphs["attention"].file, "model", shared) if "attention" in graphs else None
            )
            model.provider = handle.provider
            model.classifier = Classifier(entry, handle, attention)
            model.status = Status.WARMING
            sizes = warm_up_batch_sizes(self.settings.max_batch_size)
            log.info(
                "loaded %s on %s (%s); warming up batch sizes %s",
                model.key,
                handle.provider,
                "packed weights" if shared is None else f"one mapped copy of {shared.name} for both graphs",
                ", ".join(map(str, sizes)),
            )
            model.classifier.warm_up(sizes, self._stop.is_set)
        except (ManifestError, RuntimeUnavailable) as e:
            self._fail(model, str(e))
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types for unreadable graphs
            self._fail(model, f"{type(e).__name__}: {e}")
        finally:
            model.load_seconds = round(time.perf_counter() - started, 3)

    def _session(self, graph: Path, point: str, shared: SharedWeights | None = None) -> SessionHandle:
        """``create_session``, through the fault points a drill names (``service/faults.py``)."""
        self.faults.hit("load", graph)
        handle = create_session(graph, self.settings, shared)
        session = self.faults.wrap(handle.session, point)
        return handle if session is handle.session else dataclasses.replace(handle, session=session)

    def _load_translator(self, model: ServedModel, entry: Entry) -> None:
        graphs = entry.manifest.graphs
        encoder = self._session(entry.path / graphs["encoder"].file, "encoder")
        decoder = self._session(entry.path / graphs["decoder"].file, "decoder")
        prefix = (
            self._session(entry.path / graphs["decoder_prefix"].file, "decoder") if "decoder_prefix" in graphs else None
        )
        model.provider = decoder.provider
        s = self.settings
        model.translator = Translator(
            entry, encoder, decoder, prefix, s.default_beam_size, s.max_beam_size, s.decoder_cache
        )
        model.status = Status.WARMING
        log.info(
            "loaded %s on %s, decoder cache on the %s; warming up up to %d rows",
            model.key,
            decoder.provider,
            "device" if model.translator.cache_on_device else "host",
            self.settings.max_running_sequences,
        )
        model.translator.warm_up(self.settings.max_running_sequences, self._stop.is_set)

    def _start_scheduler(self, model: ServedModel, translator: Translator) -> None:
        s = self.settings
        model.scheduler = Scheduler(
            model.key,  # "name/version": errors, logs and thread names say the version
            translator,
            max_running_rows=s.max_running_sequences,
            max_waiting_rows=s.max_waiting_sequences,
            retry_after_s=s.retry_after_s,
            observer=self.metrics.for_decoder(model.name, model.version),
            lanes=decoding_lanes(s, translator.provider),
            faults=self.faults,
            supervision=self._supervision(model),
            batch_max_wait_s=s.batch_max_wait_s,
        )
        model.scheduler.start()
        self._mark_ready(model)

    def _fail(self, model: ServedModel, reason: str) -> None:
        model.status, model.reason, model.classifier, model.translator = Status.FAILED, reason, None, None
        model.provider = None  # a session may have been created before the failure: nothing is served on it
        self.metrics.load_failures.labels(model.name, model.version).inc()
        log.error(
            "model %s failed to load and will not be served: %s",
            model.key,
            reason,
            extra={"model": model.name, "version": model.version},
        )

    def _start_batcher(self, model: ServedModel, classifier: Classifier) -> None:
        s = self.settings
        model.batcher = Batcher(
            model.key,
            classifier.forward,
            prepare=classifier.preprocessing.normalize,
            finish=classifier.rank,
            max_batch_size=s.max_batch_size,
            max_queue_images=s.max_queue_images,
            max_queue_delay_s=s.max_queue_delay_ms / 1000.0,
            retry_after_s=s.retry_after_s,
            instances=s.model_instances,
            intake=self.intake,
            observer=self.metrics.for_model(model.name, model.version),
            faults=self.faults,
            supervision=self._supervision(model),
            batch_max_wait_s=s.batch_max_wait_s,
        )
        model.batcher.start()
        self._mark_ready(model)

    def _supervision(self, model: ServedModel) -> Supervision:
        s = self.settings
        return Supervision(s.engine_restart_limit, s.engine_restart_window_s)

    def _mark_ready(self, model: ServedModel) -> None:
        self.faults.arm()  # a drill's counts start with the first request, not the warm-up
        model.status = Status.READY
        self.metrics.provider.labels(model.name, model.version, model.provider).set(1)
        self.metrics.ready.labels(model.name, model.version).set(1)
        log.info(
            "model %s ready on %s (loaded and warmed up in %.2f s)",
            model.key,
            model.provider,
            model.load_seconds or 0.0,
            extra={"model": model.name, "provider": model.provider},
        )

    def stop_loading(self) -> None:
        """Make a warm-up still running in its thread give up between two batch sizes."""
        self._stop.set()

    async def close(self) -> None:
        self._stop.set()
        for model in self.all():
            if model.batcher is not None:
                await model.batcher.stop()
            if model.scheduler is not None:
                await model.scheduler.stop()
            self.metrics.ready.labels(model.name, model.version).set(0)

    # ---- queries -----------------------------------------------------------------------------
    @property
    def models(self) -> dict[str, ServedModel]:
        """Each model's version that answers requests naming no version: the highest ready one (else the highest)."""
        return {name: self._unpinned(versions) for name, versions in self.versions.items()}

    @staticmethod
    def _unpinned(versions: dict[str, ServedModel]) -> ServedModel:
        ready = [m for m in versions.values() if m.status is Status.READY]
        return (ready or list(versions.values()))[-1]

    def all(self) -> list[ServedModel]:
        """Every loaded version of every model."""
        return [m for versions in self.versions.values() for m in versions.values()]

    def servable(self) -> list[ServedModel]:
        return [m for m in self.all() if m.task in SERVED_TASKS]

    def readiness(self) -> tuple[bool, list[str]]:
        """(ready, reasons): ready once the repository was loaded and every model has a ready version
        (all of them at startup; later, a version failing to load leaves the one serving in place)."""
        if self.repository_error:
            return False, [self.repository_error]
        if not self.loaded:
            blocking = self.all()
        else:
            blocking = [
                m
                for name, versions in self.versions.items()
                if name not in self.added_later
                and not any(v.status in (Status.READY, Status.UNSUPPORTED) for v in versions.values())
                for m in versions.values()
            ]
        reasons = [
            f"{m.key}: {m.status.value}" + (f" ({m.reason})" if m.reason else "")
            for m in blocking
            if m.status not in (Status.READY, Status.UNSUPPORTED)
        ]
        if not self.loaded and not self.versions:
            reasons = ["loading the model repository"]
        if self.loaded and not self.servable():
            reasons.append(f"no model in {self.settings.model_repository} has a task this service serves")
        reasons += [f"{m.key}: {why}" for m in self.all() if (why := m.failing)]  # a balancer moves its traffic
        return not reasons, reasons

    def default_model_name(self, task: str = IMAGE_CLASSIFICATION) -> str | None:
        if self.settings.default_model and task == IMAGE_CLASSIFICATION:
            return self.settings.default_model
        names = [m.name for m in self.models.values() if m.task == task]
        return min(names) if names else None

    def get(self, name: str | None, task: str = IMAGE_CLASSIFICATION, version: str | None = None) -> ServedModel:
        """The model a request names (``name`` or ``name:version``; none: the task's default model), ready
        to take requests: the pinned version, or the one that answers unpinned requests."""
        if name is not None and ":" in name and version is None:
            name, _, version = name.partition(":")
        wanted = name or self.default_model_name(task)
        versions = self.versions.get(wanted) if wanted else None
        model = None
        if versions is not None:
            model = self._unpinned(versions) if version is None else versions.get(version)
            if model is None:
                raise ModelNotFound(
                    f"model {wanted!r} has no version {version!r} loaded (loaded: {', '.join(versions)})"
                )
        if model is None:
            if not self.loaded:
                raise ModelNotReady(
                    "models are still loading", headers={"Retry-After": str(self.settings.retry_after_s)}
                )
            known = ", ".join(sorted(self.models)) or "none"
            raise ModelNotFound(f"no model named {wanted!r} (loaded models: {known})" if wanted else "no model loaded")
        if model.task is not None and model.task != task:
            raise ModelNotFound(f"model {model.name!r} is a {model.task!r} model, not a {task!r} model")
        if model.status is not Status.READY:
            detail = f": {model.reason}" if model.reason else ""
            raise ModelNotReady(
                f"model {model.key} is {model.status.value}{detail}",
                headers={"Retry-After": str(self.settings.retry_after_s)},
            )
        return model
