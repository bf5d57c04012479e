"""API keys on a real server (``python -m service`` on the shipped models): every route that needs a key
refuses requests without one or with a wrong one (the list comes from the app's routes, so a new route
cannot slip through), the probes stay open, the SDK, CLI and tritonclient work with a key, an attention
id is another key's 404, and the log names keys by fingerprint only."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from attnserve_client import Client, NotFoundError
from tritonclient.utils import InferenceServerException

from service.core.keys import hash_key
from service.http.routes import ROUTES
from tests.conftest import ROOT
from tests.service.service_testing import serving, wait_until

KEY_A, KEY_B, KEY_C = "key-a-5f1c2b", "key-b-77d0e4", "key-c-from-a-secret-file"
SAMPLE = ROOT / "models" / "vit" / "1" / "sample-9-ankle-boot.png"
OPEN = {"/healthz", "/readyz", "/v2/health/live", "/v2/health/ready", "/", "/static/{path:path}", "/docs", "/redoc", "/docs/assets/{path:path}", "/openapi.json", "/metrics"}  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("auth")
    secret = tmp / "hashes"
    secret.write_text(f"# mounted from a Secret\n{hash_key(KEY_C)}\n")
    hashes = json.dumps([hash_key(KEY_A), hash_key(KEY_B)])
    with serving(tmp, ROOT / "models", api_key_hashes=hashes, api_key_hashes_file=secret) as srv:
        yield srv


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def concrete(path: str) -> str:
    return re.sub(r"{(\w+)(:\w+)?}", lambda m: {"version": "1", "name": "vit"}.get(m[1], "x"), path)


GUARDED = [r for r in ROUTES if r.access != "open" and r.path not in OPEN]


@pytest.mark.parametrize("route", GUARDED, ids=lambda r: f"{r.method} {r.path}")
def test_every_guarded_route_refuses_a_missing_or_wrong_key(server, route):
    url = server.url + concrete(route.path)
    for headers in ({}, bearer("not-a-key"), {"Authorization": KEY_A}):  # the last: no Bearer scheme
        r = httpx.request(route.method, url, headers=headers, content=b"{}")
        assert r.status_code == 401, (route.path, headers, r.text)
        assert r.headers["www-authenticate"].startswith("Bearer")
        if route.path.startswith("/v2"):  # the protocol's error form
            assert list(r.json()) == ["error"] and "API key" in r.json()["error"]
        else:
            assert r.json()["error"]["code"] == "unauthorized"


def test_tritonclient_reads_a_refusal(server):
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("vit")
    assert e.value.status() == "401" and "requires an API key" in str(e.value)


def test_the_open_routes_and_metrics_need_no_key(server):
    assert {r.path for r in ROUTES if r.access != "key"} == OPEN  # a new open route is a decision made here
    for path in (
        "/healthz",
        "/readyz",
        "/v2/health/live",
        "/v2/health/ready",
        "/",
        "/docs",
        "/openapi.json",
        "/metrics",
    ):
        assert httpx.get(server.url + path).status_code == 200, path


def test_keys_from_the_setting_and_the_file_work_for_native_oip_sdk_and_cli(server):
    for key in (KEY_A, KEY_B, KEY_C):
        r = httpx.post(server.url + "/translate", json={"text": "Open the file."}, headers=bearer(key))
        assert r.status_code == 200, key
    with Client(base_url=server.url, api_key=KEY_A) as client:
        assert client.classify(SAMPLE).results[0].top_k[0].label == "Ankle boot"
    triton_client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    text = triton.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array(["Open the file."], dtype=object))
    assert triton_client.infer("translator", [text], headers=bearer(KEY_B)).as_numpy("translation").shape == (1,)
    cli = [sys.executable, "-m", "attnserve_client.cli", "--base-url", server.url, "classify", str(SAMPLE)]
    env = {k: v for k, v in os.environ.items() if k != "ATTNSERVE_API_KEY"}
    with_key = subprocess.run(
        cli, check=False, env={**env, "ATTNSERVE_API_KEY": KEY_C}, capture_output=True, text=True, timeout=60
    )
    without = subprocess.run(cli, check=False, env=env, capture_output=True, text=True, timeout=60)
    assert with_key.returncode == 0 and "Ankle boot" in with_key.stdout
    assert without.returncode != 0 and "401" in without.stderr


def test_an_attention_id_belongs_to_the_key_that_made_it(server):
    made = httpx.post(
        server.url + "/translate", json={"text": "Open the file.", "return_attention": True}, headers=bearer(KEY_A)
    )
    attention_id = made.json()["results"][0]["attention_id"]
    mine = httpx.get(f"{server.url}/attention/{attention_id}", headers=bearer(KEY_A))
    theirs = httpx.get(f"{server.url}/attention/{attention_id}", headers=bearer(KEY_B))
    theirs_png = httpx.get(f"{server.url}/attention/{attention_id}.png", headers=bearer(KEY_B))
    unknown = httpx.get(f"{server.url}/attention/no-such-id", headers=bearer(KEY_B))
    assert mine.status_code == 200
    assert theirs.status_code == theirs_png.status_code == 404
    assert theirs.json()["error"]["message"].replace(attention_id, "ID") == unknown.json()["error"]["message"].replace(
        "no-such-id", "ID"
    )  # no oracle
    with Client(base_url=server.url, api_key=KEY_B) as client, pytest.raises(NotFoundError):
        client.attention(attention_id)


def test_the_log_names_keys_by_fingerprint_and_never_holds_a_key(server):
    httpx.get(server.url + "/models", headers=bearer(KEY_B), params={"probe": "fingerprint"})
    httpx.get(server.url + "/healthz")
    fingerprint = hash_key(KEY_B)[:12]

    def written() -> list[dict]:  # access lines are written in batches, up to 20 ms after their request
        lines = server.logs()
        keyed = [line for line in lines if line.get("path") == "/models" and line.get("key") == fingerprint]
        return lines if keyed else []

    lines = wait_until(written, timeout=10, what="the access lines of both requests")
    text = server.log_path.read_text()
    assert all(key not in text for key in (KEY_A, KEY_B, KEY_C))
    keyed = [line for line in lines if line.get("path") == "/models" and line.get("key") == fingerprint]
    assert keyed[-1]["status"] == 200
    assert all("key" not in line for line in lines if line.get("path") == "/healthz")
