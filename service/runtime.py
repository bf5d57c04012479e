"""onnxruntime sessions: which execution provider, which threads, and what was really obtained.

onnxruntime falls back to the CPU without raising when the CUDA provider cannot load (missing
libraries, no device); the most common complaint about it. So the provider is read back from the
session after creation, reported everywhere, and ``require_gpu`` turns a fallback into a failure.
Sessions whose graphs point into one weights file can compute on one mapping of it (``SharedWeights``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from service.memory import available_cores
from service.settings import Settings

log = logging.getLogger("attnserve.runtime")

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"

_OPTIMIZATION_LEVELS = {
    "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


class RuntimeUnavailable(RuntimeError):
    """The execution provider the settings demand cannot be had on this machine."""


@dataclass(frozen=True, eq=False)  # one per mapping: compared and hashed by identity
class SharedWeights:
    """One read-only mapping of a weights file (a graph's ONNX external data) for every session that points
    into it: onnxruntime computes on the mapped pages themselves, so memory holds the weights once."""

    name: str  # the file name the graphs' external data refers to
    data: np.memmap

    @classmethod
    def map(cls, path: Path) -> SharedWeights:
        return cls(path.name, np.memmap(path, dtype=np.uint8, mode="r"))

    def add_to(self, opts: ort.SessionOptions) -> None:
        """Make a session read its external data from this mapping, unpacked: onnxruntime packs each constant
        MatMul weight into a copy of its own, and its Python API cannot share such copies between sessions."""
        opts.add_external_initializers_from_files_in_memory([self.name], [self.data], [len(self.data)])
        opts.add_session_config_entry("session.use_external_initializer_file_buffers_directly", "1")
        opts.add_session_config_entry("session.disable_prepacking", "1")


@dataclass(frozen=True)
class SessionHandle:
    session: ort.InferenceSession
    provider: str  # the provider that runs the graph, read back from the session
    weights: SharedWeights | None = None  # the mapping the session computes on, kept as long as the session

    @property
    def on_gpu(self) -> bool:
        return self.provider == CUDA


def available_providers() -> list[str]:
    return list(ort.get_available_providers())


def requested_providers(settings: Settings, available: list[str] | None = None) -> list[str | tuple[str, dict]]:
    """CUDA first when allowed and offered by this onnxruntime build, the CPU always as the last resort."""
    available = available_providers() if available is None else available
    if settings.execution_provider == "cpu":
        return [CPU]
    if settings.execution_provider == "cuda" or CUDA in available:
        if CUDA not in available:
            raise RuntimeUnavailable(
                f"execution_provider='cuda' but this onnxruntime build offers only {available} "
                "(install the `gpu` extra, onnxruntime-gpu, and check the CUDA libraries)"
            )
        return [(CUDA, {"device_id": settings.cuda_device_id}), CPU]
    return [CPU]


def check_gpu_available(settings: Settings) -> None:
    """Fail fast at startup when a GPU is required and this onnxruntime cannot even offer one."""
    if settings.require_gpu and CUDA not in available_providers():
        raise RuntimeUnavailable(
            f"require_gpu is set but onnxruntime {ort.__version__} offers only {available_providers()}; "
            "install onnxruntime-gpu (the `gpu` extra) with matching CUDA/cuDNN, or unset ATTNSERVE_REQUIRE_GPU"
        )


def intra_op_threads(settings: Settings) -> int:
    """The configured count, or every available core but one: the event loop parses, decodes and
    answers requests on a core of its own, and an onnxruntime thread pool that also wants that core
    stalls at each parallel step while the loop runs (measured on 2 cores: one thread served 1.4x
    the requests of two, at half the single-client latency)."""
    if settings.intra_op_threads:
        return settings.intra_op_threads
    return max(1, available_cores() - 1)


def decoding_lanes(settings: Settings, provider: str) -> int:
    """The configured count, or on the CPU as many lanes as the available cores hold intra-op pools (each lane
    runs the model's sessions from its own thread), one on a GPU, whose one stream the lanes would share."""
    if settings.decoding_lanes:
        return settings.decoding_lanes
    if provider == CUDA:
        return 1
    return max(1, available_cores() // intra_op_threads(settings))


def session_options(settings: Settings) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = _OPTIMIZATION_LEVELS[settings.graph_optimization_level]
    opts.intra_op_num_threads = intra_op_threads(settings)
    opts.inter_op_num_threads = settings.inter_op_threads
    spin = "1" if settings.allow_spinning else "0"
    opts.add_session_config_entry("session.intra_op.allow_spinning", spin)
    opts.add_session_config_entry("session.inter_op.allow_spinning", spin)
    opts.log_severity_level = 3  # onnxruntime's own warnings go to its stderr logger; keep errors only
    return opts


def create_session(graph: Path, settings: Settings, weights: SharedWeights | None = None) -> SessionHandle:
    """An inference session for ``graph`` with the provider actually obtained; raises if a GPU was required.
    With ``weights``, the graph's external data is read from that mapping (see ``SharedWeights``)."""
    opts = session_options(settings)
    if weights is not None:
        weights.add_to(opts)
    session = ort.InferenceSession(str(graph), opts, providers=requested_providers(settings))
    provider = session.get_providers()[0]
    if settings.require_gpu and provider != CUDA:
        raise RuntimeUnavailable(
            f"require_gpu is set but {graph} runs on {provider} (onnxruntime could not start CUDA; "
            "its log above says why)"
        )
    if settings.execution_provider != "cpu" and CUDA in available_providers() and provider != CUDA:
        log.warning("CUDA was offered but %s fell back to %s", graph, provider)
    return SessionHandle(session, provider, weights)
