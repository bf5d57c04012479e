"""The fault plan of ``ATTNSERVE_FAULTS``: what it reads, when each fault happens, and what it refuses."""

from __future__ import annotations

import subprocess
import sys

import pytest

from service.faults import NONE, Faults, InjectedFault, parse


def test_rules_read_point_kind_argument_pass_and_count():
    rules = parse(" decoder:raise@400 ; encoder:stall=0.5@3x2;lane:raise@5x0; load:vanish; model:memory ")
    assert [(r.point, r.kind, r.at, r.count, r.seconds) for r in rules] == [
        ("decoder", "raise", 400, 1, 0.0),
        ("encoder", "stall", 3, 2, 0.5),
        ("lane", "raise", 5, 0, 0.0),
        ("load", "vanish", 1, 1, 0.0),
        ("model", "memory", 1, 1, 0.0),
    ]
    assert parse("") == [] and parse(" ; ") == []


@pytest.mark.parametrize(
    "plan, says",
    [
        ("decoder:explode", "KIND one of raise, memory, stall, vanish"),
        ("gpu:raise", "POINT one of encoder, decoder"),
        ("decoder:stall@3", "stall takes =SECONDS"),
        ("decoder:raise=2", "stall takes =SECONDS"),
        ("decoder:vanish", "vanish is the load point's only kind"),
        ("decoder raise", "cannot read fault 'decoder raise'"),
    ],
)
def test_a_plan_it_cannot_read_is_refused_naming_the_rule(plan, says):
    with pytest.raises(ValueError, match=says):
        parse(plan)


def test_faults_happen_on_the_passes_named_and_only_once_armed():
    faults = Faults(parse("decoder:raise@3x2;lane:raise@2x0"))
    faults.hit("decoder")  # warm-up: not counted
    faults.arm()
    outcomes = []
    for _ in range(6):
        try:
            faults.hit("decoder")
            outcomes.append("ok")
        except InjectedFault:
            outcomes.append("fault")
    assert outcomes == ["ok", "ok", "fault", "fault", "ok", "ok"]
    faults.hit("lane")
    for _ in range(5):
        with pytest.raises(InjectedFault, match="fault injected at lane"):
            faults.hit("lane")
    faults.hit("encoder")  # a point without a rule never fails


def test_memory_is_onnxruntimes_allocation_error_and_vanish_deletes_the_graph(tmp_path):
    from onnxruntime.capi.onnxruntime_pybind11_state import RuntimeException

    faults = Faults(parse("model:memory;load:vanish@2"))
    faults.arm()
    with pytest.raises(RuntimeException, match="Failed to allocate memory"):
        faults.hit("model")
    first, second = tmp_path / "a.onnx", tmp_path / "b.onnx"
    first.write_bytes(b"x")
    second.write_bytes(b"x")
    faults.hit("load", first)
    faults.hit("load", second)
    assert first.exists() and not second.exists()


def test_only_named_sessions_are_wrapped_and_a_wrapped_one_fails_on_its_pass():
    class Session:
        def run(self, outputs, feeds):
            return ["ran"]

        def get_inputs(self):
            return ["inputs"]

    session = Session()
    faults = Faults(parse("decoder:raise@2"))
    faults.arm()
    assert faults.wrap(session, "encoder") is session and NONE.wrap(session, "decoder") is session
    wrapped = faults.wrap(session, "decoder")
    assert wrapped.run(None, {}) == ["ran"] and wrapped.get_inputs() == ["inputs"]
    with pytest.raises(InjectedFault):
        wrapped.run(None, {})


def test_the_service_refuses_a_plan_it_cannot_read_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "service"],
        check=False,
        env={"PATH": "", "ATTNSERVE_FAULTS": "decoder:explode@3", "ATTNSERVE_MODEL_REPOSITORY": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "ATTNSERVE_FAULTS" in line and "cannot read fault 'decoder:explode@3'" in line
