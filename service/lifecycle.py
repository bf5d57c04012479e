"""Loading, switching and unloading model versions while the service runs, without dropping a request.

``load(name)`` reads the model's folder again and brings up, in the background of the running
service, every version its policy now selects that is not loaded (or failed before and has changed
since): verify sha256, create sessions, warm up, start the engine. Unpinned requests move to a new
version the moment it is ready (the registry routes them to the highest ready version). Versions
the policy no longer selects are retired only once a selected version is ready: they take no new
requests, finish what they queued and run, and are stopped when idle. A version that fails to load
is listed with its reason and counted (``attnserve_model_load_failures_total``); what was serving
goes on. ``unload(name)`` retires every version. Loads and unloads of one model are serialised; a
request for a model that is busy answers 409 with what it is doing instead of starting another.

With ``ATTNSERVE_REPOSITORY_POLL_S`` > 0 the repository is read every so many seconds and every
model whose folder changed is loaded (or unloaded, when its folder is gone): copying ``vit/3/``
into place is a deploy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from contract.manifest import ManifestError
from service.errors import ModelNotFound, ServiceError
from service.memory import release_freed_memory
from service.registry import Registry, ServedModel, Status
from service.versions import model_policy, parse_setting, version_folders

log = logging.getLogger("attnserve.lifecycle")


class ModelBusy(ServiceError):
    status, code = 409, "model_busy"


class ModelLoadFailed(ServiceError):
    status, code = 400, "model_load_failed"


def fingerprint(folder: Path) -> tuple:
    """What changes when a version folder's files do: names, sizes and modification times."""
    try:
        return tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in folder.iterdir()))
    except OSError:
        return ()


class Lifecycle:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._locks: dict[str, asyncio.Lock] = {}
        self._doing: dict[str, str] = {}  # model -> what it is doing now, for a request that finds it busy
        self._fingerprints: dict[str, tuple] = {}  # "name/version" -> the folder as it was when it failed
        self._poll: asyncio.Task | None = None
        self._releases: set[asyncio.Task] = set()

    # ---- the repository extension --------------------------------------------------------------
    def index(self) -> list[dict]:
        """Every version folder of the repository, and its state: READY, LOADING, UNLOADING or UNAVAILABLE."""
        root = self.registry.settings.model_repository
        out = []
        for folder in sorted(p for p in Path(root).iterdir() if p.is_dir()) if Path(root).is_dir() else []:
            loaded = self.registry.versions.get(folder.name, {})
            for version in sorted(version_folders(folder), key=int):
                model = loaded.get(version)
                out.append({"name": folder.name, "version": version, **_state(model)})
        return out

    async def load(self, name: str) -> list[ServedModel]:
        """Bring the model in line with its folder and policy; the versions loaded now, ready first."""
        async with self._exclusive(name, "loading"):
            folder = self.registry.settings.model_repository / name
            if not folder.is_dir() or not version_folders(folder):
                raise ModelNotFound(f"no model folder {name!r} with version folders in the repository")
            try:
                policy = model_policy(folder, parse_setting(self.registry.settings.version_policy))
            except ManifestError as e:
                raise ModelLoadFailed(str(e)) from e
            selected = policy.select(version_folders(folder))
            if name not in self.registry.versions:
                self.registry.added_later.add(name)
            versions = self.registry.versions.setdefault(name, {})
            self.registry.policies[name] = policy
            fresh = [v for v in selected if v not in versions or self._changed_since_failure(versions[v])]
            for version in fresh:
                model = ServedModel(name, version, folder / version)
                versions[version] = model
                self.registry.versions[name] = dict(sorted(versions.items(), key=lambda kv: int(kv[0])))
                versions = self.registry.versions[name]
                self._doing[name] = f"loading version {version}"
                await self.registry.bring_up(model)
                if model.status is Status.FAILED:
                    self._fingerprints[model.key] = fingerprint(model.path)
            ready = [versions[v] for v in selected if versions[v].status is Status.READY]
            if ready:  # only now may what the policy no longer selects go
                self.registry.added_later.discard(name)
                for version in [v for v in versions if v not in selected]:
                    self._doing[name] = f"unloading version {version}"
                    await self.registry.retire(versions[version])
                    versions.pop(version, None)
            self._release_memory_later()
            failed = [versions[v] for v in fresh if versions[v].status is Status.FAILED]
            if failed:
                raise ModelLoadFailed("; ".join(f"{m.key} failed to load: {m.reason}" for m in failed))
            return ready

    async def unload(self, name: str) -> None:
        async with self._exclusive(name, "unloading"):
            versions = self.registry.versions.get(name)
            if versions is None:
                raise ModelNotFound(f"model {name!r} is not loaded")
            for model in list(versions.values()):
                await self.registry.retire(model)
            self.registry.versions.pop(name, None)
            self.registry.policies.pop(name, None)
            self.registry.added_later.discard(name)
            self._release_memory_later()

    def _release_memory_later(self, after_s: float = 1.0) -> None:
        """Once this call has returned and the requests that still held a retired version are answered,
        give the heap pages its sessions freed back to the system (``service.memory``), in a thread."""

        async def release() -> None:
            await asyncio.sleep(after_s)
            await asyncio.to_thread(release_freed_memory)

        task = asyncio.get_running_loop().create_task(release(), name="release-freed-memory")
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    def _changed_since_failure(self, model: ServedModel) -> bool:
        """A failed version is tried again only once its folder changed (a copy finished, a file fixed)."""
        return model.status is Status.FAILED and fingerprint(model.path) != self._fingerprints.get(model.key)

    @contextlib.asynccontextmanager
    async def _exclusive(self, name: str, doing: str):
        lock = self._locks.setdefault(name, asyncio.Lock())
        if lock.locked():
            raise ModelBusy(f"model {name} is busy: {self._doing.get(name, 'loading')}; try again when it is done")
        async with lock:
            self._doing[name] = doing
            try:
                yield
            finally:
                self._doing.pop(name, None)

    # ---- poll mode ---------------------------------------------------------------------------------
    def start_polling(self, every_s: float) -> None:
        self._poll = asyncio.get_running_loop().create_task(self._poll_loop(every_s), name="repository-poll")

    async def stop(self) -> None:
        if self._poll is not None:
            self._poll.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poll
        for task in list(self._releases):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _poll_loop(self, every_s: float) -> None:
        while not self.registry.loaded:
            await asyncio.sleep(0.1)
        while True:
            await asyncio.sleep(every_s)
            for name, action in self._pending().items():
                if self._locks.get(name) is not None and self._locks[name].locked():
                    continue
                try:
                    await (self.load(name) if action == "load" else self.unload(name))
                    log.info("poll: %s %s done", action, name)
                except ServiceError as e:
                    log.error("poll: %s %s: %s", action, name, e.message)

    def _pending(self) -> dict[str, str]:
        """Models whose folder differs from what is loaded: ``load`` (or ``unload``, folder gone)."""
        root = Path(self.registry.settings.model_repository)
        default = parse_setting(self.registry.settings.version_policy)
        out = {}
        folders = {p.name: p for p in root.iterdir() if p.is_dir() and version_folders(p)} if root.is_dir() else {}
        for name, folder in folders.items():
            loaded = self.registry.versions.get(name, {})
            try:
                selected = model_policy(folder, default).select(version_folders(folder))
            except ManifestError:
                continue
            if set(selected) != set(loaded) or any(self._changed_since_failure(loaded[v]) for v in selected):
                out[name] = "load"
        for name in set(self.registry.versions) - set(folders):
            out[name] = "unload"
        return out


def _state(model: ServedModel | None) -> dict:
    if model is None:
        return {
            "state": "UNAVAILABLE",
            "reason": "not loaded (the version policy does not select it, or it was unloaded)",
        }
    if model.status is Status.READY:
        return {"state": "READY", "reason": ""}
    if model.status is Status.UNLOADING:
        return {"state": "UNLOADING", "reason": ""}
    if model.status in (Status.FAILED, Status.UNSUPPORTED):
        return {"state": "UNAVAILABLE", "reason": model.reason or model.status.value}
    return {"state": "LOADING", "reason": model.status.value}
