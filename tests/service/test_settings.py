"""Settings come from ATTNSERVE_* variables and refuse unsafe or contradictory values at startup.

``python -m service`` says why in one line on stderr, exit status 2, and never repeats a secret setting's value.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import BeforeValidator, ValidationError
from pydantic_settings import EnvSettingsSource

from service.settings import (
    MAX_BODY_CEILING,
    MAX_PIXELS_CEILING,
    SECRET_SETTINGS,
    Settings,
    explain,
    list_from_env,
)
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
        ({"response_cache": True}, "response_cache is shared through Redis: set redis_url"),
        ({"response_cache_ttl_s": 0}, "response_cache_ttl_s"),
        ({"response_cache_scope": "tenant"}, "response_cache_scope"),
        ({"response_cache_scope": "key"}, "no keys are configured"),
    ],
)
def test_refuses_unsafe_or_contradictory_values(overrides, complaint):
    with pytest.raises(ValidationError, match=complaint):
        Settings(**overrides)


@pytest.mark.parametrize(
    "written, value",
    [
        ('["a", "b"]', ["a", "b"]),
        ("a,b", ["a", "b"]),
        (" a , b ,", ["a", "b"]),
        ("a", ["a"]),
        ("", []),
        ("  ", []),
        ("[]", []),
        (("a", "b"), ("a", "b")),  # given in Python, not in the environment: untouched
    ],
)
def test_a_list_setting_is_a_json_list_or_comma_separated(written, value):
    assert list_from_env(written) == value


@pytest.mark.parametrize("written, complaint", [("[a", "not a JSON list"), ('["a", 1]', "strings only")])
def test_a_malformed_json_list_is_refused_with_both_forms(written, complaint):
    with pytest.raises(ValueError, match=complaint) as refused:
        list_from_env(written)
    assert '["a","b"] or as a,b' in str(refused.value)


HASH_A, HASH_B = "a" * 64, "b" * 64


@pytest.mark.parametrize(
    "variable, json_form, comma_form, value",
    [
        ("ATTNSERVE_API_KEY_HASHES", f'["{HASH_A}", "{HASH_B}"]', f"{HASH_A},{HASH_B}", (HASH_A, HASH_B)),
        ("ATTNSERVE_CORS_ORIGINS", '["https://a.example", "*"]', "https://a.example, *", ("https://a.example", "*")),
        ("ATTNSERVE_IMAGE_FORMATS", '["png", "jpeg"]', "png,jpeg", ("PNG", "JPEG")),
    ],
)
def test_list_settings_read_both_forms_from_the_environment(monkeypatch, variable, json_form, comma_form, value):
    field = variable.removeprefix("ATTNSERVE_").lower()
    for written in (json_form, comma_form):
        monkeypatch.setenv(variable, written)
        assert getattr(Settings(), field) == value


@pytest.mark.parametrize("variable", ["ATTNSERVE_API_KEY_HASHES", "ATTNSERVE_CORS_ORIGINS"])
def test_an_empty_list_setting_is_the_empty_list(monkeypatch, variable):
    monkeypatch.setenv(variable, "")
    assert getattr(Settings(), variable.removeprefix("ATTNSERVE_").lower()) == ()


def test_every_list_setting_takes_both_forms():
    """A list field added later without ``EnvList`` would read only one of them."""
    source = EnvSettingsSource(Settings)
    lists = [name for name, field in Settings.model_fields.items() if source.field_is_complex(field)]
    assert lists, "no list settings found: the check looks at nothing"
    for name in lists:
        validators = [m.func for m in Settings.model_fields[name].metadata if isinstance(m, BeforeValidator)]
        assert list_from_env in validators, f"{name} does not parse its value with list_from_env"


def test_secret_settings_are_settings():
    assert SECRET_SETTINGS <= set(Settings.model_fields)


def test_a_conflict_names_the_variables_of_both_settings():
    with pytest.raises(ValidationError) as refused:
        Settings(max_batch_size=4, max_images_per_request=8)
    assert explain(refused.value) == (
        "ATTNSERVE_MAX_IMAGES_PER_REQUEST (8) must not exceed ATTNSERVE_MAX_BATCH_SIZE (4): "
        "a request is never split across batches"
    )


def test_the_response_cache_takes_the_redis_url_given_in_the_environment(monkeypatch):
    monkeypatch.setenv("ATTNSERVE_RESPONSE_CACHE", "true")
    with pytest.raises(ValidationError, match="set redis_url"):
        Settings()
    monkeypatch.setenv("ATTNSERVE_REDIS_URL", "redis://redis:6379/0")
    settings = Settings()
    assert settings.response_cache and settings.redis_url == "redis://redis:6379/0"
    assert (settings.response_cache_ttl_s, settings.response_cache_scope) == (86_400, "shared")


def run_service(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "service"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    "env, named, shown, hidden",
    [
        pytest.param(  # comma-separated, now read, but these are keys, not their hashes
            {"ATTNSERVE_API_KEY_HASHES": "s3cret-key-one,s3cret-key-two"},
            ["ATTNSERVE_API_KEY_HASHES", "sha256 hex digests"],
            [],
            ["s3cret-key"],
            id="secret-keys-instead-of-hashes",
        ),
        pytest.param(
            {"ATTNSERVE_API_KEY_HASHES": '["s3cret-key-one", "s3cret-key-two"'},
            ["ATTNSERVE_API_KEY_HASHES", "not a JSON list", '["a","b"] or as a,b'],
            [],
            ["s3cret-key"],
            id="secret-bad-json",
        ),
        pytest.param(
            {"ATTNSERVE_REDIS_URL": ":pa55word@redis:6379/0"},
            ["ATTNSERVE_REDIS_URL", "redis|rediss|unix"],
            [],
            ["pa55word"],
            id="secret-redis-url-without-scheme",
        ),
        pytest.param(
            {"ATTNSERVE_PORT": "eighty"}, ["ATTNSERVE_PORT", "valid integer"], ["'eighty'"], [], id="wrong-type"
        ),
        pytest.param(
            {"ATTNSERVE_WORKERS": "0"}, ["ATTNSERVE_WORKERS", "greater than or equal to 1"], [], [], id="out-of-range"
        ),
        pytest.param(
            {"ATTNSERVE_LOG_FORMAT": "xml"}, ["ATTNSERVE_LOG_FORMAT", "'json' or 'text'"], ["'xml'"], [], id="choice"
        ),
        pytest.param(
            {"ATTNSERVE_REQUIRE_GPU": "maybe"}, ["ATTNSERVE_REQUIRE_GPU", "true or false"], [], [], id="boolean"
        ),
        pytest.param(
            {"ATTNSERVE_IMAGE_FORMATS": "[PNG"},
            ["ATTNSERVE_IMAGE_FORMATS", "not a JSON list"],
            ["'[PNG'"],
            [],
            id="bad-json-list",
        ),
        pytest.param(
            {"ATTNSERVE_MAX_BATCH_SIZE": "4", "ATTNSERVE_MAX_IMAGES_PER_REQUEST": "8"},
            ["ATTNSERVE_MAX_IMAGES_PER_REQUEST (8)", "ATTNSERVE_MAX_BATCH_SIZE (4)", "never split"],
            [],
            [],
            id="contradiction",
        ),
        pytest.param(
            {"ATTNSERVE_RESPONSE_CACHE": "true"},
            ["ATTNSERVE_RESPONSE_CACHE is shared through Redis: set ATTNSERVE_REDIS_URL"],
            [],
            [],
            id="cache-without-redis",
        ),
        pytest.param(
            {"ATTNSERVE_PORT": "eighty", "ATTNSERVE_API_KEY_HASHES": "s3cret-key"},
            ["ATTNSERVE_PORT", "ATTNSERVE_API_KEY_HASHES"],
            ["'eighty'"],
            ["s3cret-key"],
            id="two-mistakes-one-line",
        ),
    ],
)
def test_python_m_service_refuses_bad_settings_in_one_line(env, named, shown, hidden):
    proc = run_service(env)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("attnserve: invalid settings: ")
    for text in named + shown:
        assert text in line
    for secret in hidden:
        assert secret not in proc.stderr + proc.stdout
    assert proc.stdout == ""


def test_the_configuration_page_shows_a_refusal_as_the_service_prints_it():
    proc = run_service({"ATTNSERVE_PORT": "eighty"})
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert f"\n{proc.stderr}```" in page
