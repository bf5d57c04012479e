"""Settings come from ATTNSERVE_* variables and refuse unsafe or contradictory values at startup."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from service.settings import MAX_BODY_CEILING, MAX_PIXELS_CEILING, Settings
from tests.service.service_testing import ROOT


def test_defaults_are_safe_and_serving_ready():
    s = Settings(_env_file=None)
    assert s.max_body_bytes <= MAX_BODY_CEILING
    assert s.max_image_pixels <= MAX_PIXELS_CEILING
    assert s.max_images_per_request <= s.max_batch_size <= s.max_queue_images
    assert s.allow_spinning is False  # spinning threads steal the CPU the HTTP layer needs
    assert s.host == "127.0.0.1"


def test_reads_the_environment(monkeypatch):
    monkeypatch.setenv("ATTNSERVE_MAX_BATCH_SIZE", "8")
    monkeypatch.setenv("ATTNSERVE_MAX_IMAGES_PER_REQUEST", "4")
    monkeypatch.setenv("ATTNSERVE_IMAGE_FORMATS", '["png", "jpeg"]')
    monkeypatch.setenv("ATTNSERVE_REQUIRE_GPU", "true")
    s = Settings()
    assert (s.max_batch_size, s.max_images_per_request, s.require_gpu) == (8, 4, True)
    assert s.image_formats == ("PNG", "JPEG")


@pytest.mark.parametrize(
    "overrides, complaint",
    [
        ({"max_body_bytes": MAX_BODY_CEILING + 1}, "max_body_bytes"),
        ({"max_image_pixels": MAX_PIXELS_CEILING + 1}, "max_image_pixels"),
        ({"max_image_bytes": 2 << 20, "max_body_bytes": 1 << 20}, "max_image_bytes"),
        ({"max_batch_size": 8, "max_images_per_request": 9}, "never split"),
        ({"max_batch_size": 64, "max_queue_images": 32}, "max_queue_images"),
        ({"require_gpu": True, "execution_provider": "cpu"}, "contradicts"),
        ({"max_beam_size": 16, "max_running_sequences": 8}, "a beam runs in one batch"),
        ({"default_beam_size": 5, "max_beam_size": 4}, "default_beam_size must not exceed max_beam_size"),
        ({"max_waiting_sequences": 100}, "one full request"),
        ({"request_timeout_s": 120, "max_request_timeout_s": 60}, "request_timeout_s must not exceed"),
        ({"request_timeout_s": 0}, "request_timeout_s"),
        ({"image_formats": ("PNG", "NOTAFORMAT")}, "NOTAFORMAT"),
        ({"port": 0}, "port"),
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_queue_delay_ms": -1}, "max_queue_delay_ms"),
        ({"graph_optimization_level": "turbo"}, "graph_optimization_level"),
        ({"unknown_knob": 1}, "unknown_knob"),
    ],
)
def test_refuses_unsafe_or_contradictory_values(overrides, complaint):
    with pytest.raises(ValidationError, match=complaint):
        Settings(**overrides)


def test_python_m_service_refuses_bad_settings_with_a_clear_message():
    env = {"PATH": "/usr/bin:/bin", "ATTNSERVE_MAX_BATCH_SIZE": "4", "ATTNSERVE_MAX_IMAGES_PER_REQUEST": "8"}
    proc = subprocess.run(
        [sys.executable, "-m", "service"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 2
    assert "invalid settings" in proc.stderr and "max_images_per_request" in proc.stderr
