"""Execution-provider choice and session options: CUDA first when offered, settings honoured, no silent fallback."""

from __future__ import annotations

import pytest

from service.runtime import (
    CPU,
    CUDA,
    RuntimeUnavailable,
    check_gpu_available,
    create_session,
    requested_providers,
    session_options,
)
from service.settings import Settings
from tests.conftest import ROOT


@pytest.mark.parametrize(
    "setting, available, expected",
    [
        ("auto", [CUDA, CPU], [CUDA, CPU]),
        ("auto", [CPU], [CPU]),
        ("cpu", [CUDA, CPU], [CPU]),
        ("cuda", [CUDA, CPU], [CUDA, CPU]),
    ],
)
def test_cuda_comes_first_when_offered_and_allowed(setting, available, expected):
    providers = requested_providers(Settings(execution_provider=setting), available)
    assert [p[0] if isinstance(p, tuple) else p for p in providers] == expected


def test_forcing_cuda_where_it_is_not_offered_fails_loudly():
    with pytest.raises(RuntimeUnavailable, match="offers only"):
        requested_providers(Settings(execution_provider="cuda"), [CPU])


def test_by_default_onnxruntime_leaves_one_core_to_the_event_loop():
    import os

    cores = len(os.sched_getaffinity(0))
    assert session_options(Settings()).intra_op_num_threads == max(1, cores - 1)


def test_session_options_come_from_settings():
    opts = session_options(Settings(intra_op_threads=3, inter_op_threads=2, graph_optimization_level="basic"))
    assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (3, 2)
    assert str(opts.graph_optimization_level).endswith("ENABLE_BASIC")
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    spinning = session_options(Settings(allow_spinning=True))
    assert spinning.get_session_config_entry("session.intra_op.allow_spinning") == "1"


def test_the_provider_in_use_is_read_back_from_the_session():
    import onnxruntime as ort

    handle = create_session(ROOT / "models" / "vit" / "1" / "model.onnx", Settings(intra_op_threads=1))
    assert handle.provider == handle.session.get_providers()[0]
    expected = CUDA if CUDA in ort.get_available_providers() else CPU
    assert handle.provider == expected and handle.on_gpu == (expected == CUDA)


def test_require_gpu_refuses_a_cpu_only_runtime(monkeypatch):
    monkeypatch.setattr("service.runtime.available_providers", lambda: [CPU])  # a CPU-only onnxruntime, anywhere
    with pytest.raises(RuntimeUnavailable, match="require_gpu"):
        check_gpu_available(Settings(require_gpu=True))
