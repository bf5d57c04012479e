"""CORS on a real server: preflights answered for allowed origins only, and answers carrying the headers
a browser needs; without an allowlist, nothing changes (browsers refuse cross-origin calls)."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import ROOT
from tests.service.service_testing import serving

ALLOWED, OTHER = "https://app.example.com", "https://evil.example.net"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("cors"), ROOT / "models", cors_origins=f'["{ALLOWED}"]') as srv:
        yield srv


def preflight(
    url: str, origin: str, method: str = "POST", headers: str = "content-type, authorization, x-request-timeout"
):
    return httpx.options(
        url,
        headers={"Origin": origin, "Access-Control-Request-Method": method, "Access-Control-Request-Headers": headers},
    )


@pytest.mark.parametrize("path", ["/classify", "/translate", "/v2/models/vit/infer"])
def test_an_allowed_origin_gets_its_preflight_answered(server, path):
    r = preflight(server.url + path, ALLOWED)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == ALLOWED
    assert "POST" in r.headers["access-control-allow-methods"]
    assert {"authorization", "content-type", "x-request-timeout"} <= {
        h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")
    }


def test_another_origin_or_method_is_refused_with_a_json_error(server):
    for r in (
        preflight(server.url + "/classify", OTHER),
        preflight(server.url + "/classify", ALLOWED, method="DELETE"),
    ):
        assert r.status_code == 400 and r.json()["error"]["code"] == "cors_refused"
        assert ALLOWED in r.json()["error"]["message"]
    refused = preflight(server.url + "/v2/models/vit/infer", OTHER)  # the protocol's error form under /v2
    assert refused.status_code == 400 and list(refused.json()) == ["error"] and ALLOWED in refused.json()["error"]


def test_answers_carry_the_headers_for_an_allowed_origin_only(server):
    body = {"text": "Open the file."}
    allowed = httpx.post(server.url + "/translate", json=body, headers={"Origin": ALLOWED})
    other = httpx.post(server.url + "/translate", json=body, headers={"Origin": OTHER})
    assert allowed.status_code == other.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == ALLOWED
    assert "x-request-id" in allowed.headers["access-control-expose-headers"].lower()
    assert "access-control-allow-origin" not in other.headers  # the browser withholds the answer
    error = httpx.post(server.url + "/translate", json={}, headers={"Origin": ALLOWED})
    assert error.status_code == 422 and error.headers["access-control-allow-origin"] == ALLOWED  # errors too


def test_without_an_allowlist_preflights_are_not_answered(tmp_path):
    with serving(tmp_path, ROOT / "models") as srv:
        r = preflight(srv.url + "/classify", ALLOWED)
    assert r.status_code == 405 and "access-control-allow-origin" not in r.headers
