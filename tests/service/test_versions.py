"""Version policies (per model ``config.json`` or the repository-wide setting), and several versions of
one model served at once on a real server: unpinned requests go to the highest ready version,
``name:version`` (and the OIP version paths) pin one."""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import time
from pathlib import Path

import httpx
import pytest

from contract.manifest import ManifestError
from service.settings import Settings
from service.versions import VersionPolicy, model_policy, parse_config, parse_setting, selected_versions
from tests.conftest import ROOT
from tests.service.service_testing import serving, start_subprocess_server

SHIPPED_VIT = ROOT / "models" / "vit" / "1"


@pytest.mark.parametrize(
    ("text", "versions"),
    [("latest:1", ["10"]), ("latest:2", ["3", "10"]), ("all", ["1", "3", "10"]), ("specific:1,10", ["1", "10"])],
)
def test_setting_policies_select_by_numeric_order(text, versions):
    assert parse_setting(text).select(["10", "1", "3"]) == versions
    assert str(parse_setting(text)) == text


@pytest.mark.parametrize("text", ["latest:0", "latest", "newest:1", "specific:", "specific:a", "all:2"])
def test_bad_setting_policies_are_refused_with_the_accepted_forms(text):
    with pytest.raises(ValueError, match="latest:N"):
        parse_setting(text)
    with pytest.raises(ValueError, match="version_policy"):
        Settings(version_policy=text)


@pytest.mark.parametrize(
    ("value", "policy"),
    [({"latest": 2}, VersionPolicy(latest=2)), ("all", VersionPolicy()), ({"specific": [1, "3"]}, VersionPolicy(specific=("1", "3")))],
)  # fmt: skip
def test_config_policies(value, policy):
    assert parse_config(value, "x") == policy


@pytest.mark.parametrize(
    "value", [{"latest": 0}, {"latest": True}, "every", {"specific": []}, {"latest": 1, "all": {}}]
)
def test_bad_config_policies_name_the_file(value):
    with pytest.raises(ManifestError, match="where: version_policy must be"):
        parse_config(value, "where")


def test_a_model_config_overrides_the_repository_default(tmp_path):
    for name, versions in {"a": ["1", "2", "3"], "b": ["1", "2"]}.items():
        for v in versions:
            (tmp_path / name / v).mkdir(parents=True)
    (tmp_path / "a" / "config.json").write_text(json.dumps({"version_policy": {"specific": [1, 3]}}))
    (tmp_path / "b" / "config.json").write_text(json.dumps({"other": "settings"}))  # no policy: the default
    found = selected_versions(tmp_path, parse_setting("latest:1"))
    assert found == {"a": (["1", "3"], VersionPolicy(specific=("1", "3"))), "b": (["2"], VersionPolicy(latest=1))}
    (tmp_path / "b" / "config.json").write_text("{broken")
    with pytest.raises(ManifestError, match="config.json"):
        model_policy(tmp_path / "b", VersionPolicy())


def add_version(src: Path, dst: Path, version: str) -> None:
    """A copy of the entry ``src`` as version ``version`` of the same model (its manifest says so)."""
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["version"] = version
    (dst / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def two_versions(tiny_vit_repository, tmp_path_factory) -> Path:
    """vit/1: the tiny ViT of the test session; vit/2: the shipped ViT. Two different models, so answers tell them apart."""
    repo = tmp_path_factory.mktemp("versions") / "models"
    shutil.copytree(tiny_vit_repository / "vit" / "1", repo / "vit" / "1")
    add_version(SHIPPED_VIT, repo / "vit" / "2", "2")
    return repo


def classify(srv, png: bytes, model: str | None = None) -> httpx.Response:
    body = {"images": [base64.b64encode(png).decode()], "top_k": 10, **({"model": model} if model else {})}
    return httpx.post(srv.url + "/classify", json=body)


def test_two_versions_are_served_at_once_and_pinned(two_versions, tmp_path, fashion_pngs):
    (two_versions / "vit" / "config.json").write_text(json.dumps({"version_policy": "all"}))
    try:
        with serving(tmp_path, two_versions) as srv:
            listed = {
                (m["version"], m["status"], m["unpinned"], m["default"]) for m in srv.get("/models").json()["models"]
            }
            unpinned, v1, v2 = (
                classify(srv, fashion_pngs[0]),
                classify(srv, fashion_pngs[0], "vit:1"),
                classify(srv, fashion_pngs[0], "vit:2"),
            )
            missing = classify(srv, fashion_pngs[0], "vit:7")
            oip = httpx.get(srv.url + "/v2/models/vit").json()
            oip_v1 = httpx.post(
                srv.url + "/v2/models/vit/versions/1/infer",
                json={
                    "inputs": [
                        {
                            "name": "images",
                            "shape": [1],
                            "datatype": "BYTES",
                            "data": [base64.b64encode(fashion_pngs[0]).decode()],
                        }
                    ]
                },
            ).json()
    finally:
        (two_versions / "vit" / "config.json").unlink()
    assert listed == {("1", "ready", False, False), ("2", "ready", True, True)}
    assert [r.json()["version"] for r in (unpinned, v1, v2)] == ["2", "1", "2"]
    assert unpinned.json()["results"] == v2.json()["results"] != v1.json()["results"]  # two different models
    assert missing.status_code == 404 and "no version '7'" in missing.json()["error"]["message"]
    assert oip["versions"] == ["1", "2"] and oip_v1["model_version"] == "1"
    v1_scores = {t["index"]: t["score"] for t in v1.json()["results"][0]["top_k"]}
    assert oip_v1["outputs"][0]["data"] == [v1_scores[i] for i in range(10)]  # the same version's answer


def test_the_default_policy_loads_the_latest_version_only(two_versions, tmp_path, fashion_pngs):
    with serving(tmp_path, two_versions) as srv:
        listed = [(m["name"], m["version"]) for m in srv.get("/models").json()["models"]]
        pinned_old = classify(srv, fashion_pngs[0], "vit:1")
    assert listed == [("vit", "2")]
    assert pinned_old.status_code == 404 and pinned_old.json()["error"]["code"] == "model_not_found"


def test_a_policy_that_selects_nothing_keeps_the_service_not_ready_and_says_why(two_versions, tmp_path):
    srv = start_subprocess_server(tmp_path, two_versions, version_policy="specific:5")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.get(srv.url + "/readyz")
                if "version policy" in r.text:
                    break
            time.sleep(0.2)
    finally:
        srv.stop()
    assert r.status_code == 503
    assert r.json()["error"]["message"] == "the version policy selects no version of vit (specific:5)"
