"""Loading, switching and unloading versions on a running server (``python -m service``), driven by the
real ``tritonclient`` through the repository extension and by poll mode, under continuous load."""

from __future__ import annotations

import base64
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Self

import httpx
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT
from tests.service.service_testing import metric_value, serving
from tests.service.test_versions import add_version

SHIPPED_VIT = ROOT / "models" / "vit" / "1"


@pytest.fixture
def repo(both_repository, tmp_path) -> Path:
    """vit/1 (tiny) and translator/1 (tiny), copied so the test may add versions."""
    out = tmp_path / "models"
    shutil.copytree(both_repository, out)
    return out


class Load:
    """Clients sending /classify and /translate back to back in threads, recording every answer."""

    def __init__(self, url: str, png: bytes) -> None:
        self.url, self.stop = url, threading.Event()
        self.answers: list[tuple[str, float, int, str | None]] = []  # (route, time, status, version)
        self.image = base64.b64encode(png).decode()
        routes = ("classify", "translate", "classify")
        self.sequences: dict[tuple[int, str], list[str | None]] = {(i, r): [] for i, r in enumerate(routes)}
        self.threads = [
            threading.Thread(target=self._run, args=(r, self.sequences[i, r])) for i, r in enumerate(routes)
        ]

    def _run(self, route: str, sequence: list[str | None]) -> None:
        body = {"images": [self.image]} if route == "classify" else {"text": "Open the file."}
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                r = client.post(f"{self.url}/{route}", json=body)
                version = r.json().get("version") if r.status_code == 200 else None
                self.answers.append((route, time.monotonic(), r.status_code, version))
                sequence.append(version)  # one client's answers in order: each waits for the one before

    def __enter__(self) -> Self:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        time.sleep(0.5)  # answers after the switch, too
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def versions(self, route: str) -> list[str | None]:
        return [v for r, _, _, v in self.answers if r == route]


def client_for(srv) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(srv.url.removeprefix("http://"), network_timeout=300)


def test_a_new_version_loads_under_load_with_zero_failed_requests_and_the_old_one_drains(repo, tmp_path, fashion_pngs):
    with serving(tmp_path, repo) as srv, Load(srv.url, fashion_pngs[0]) as load:
        client = client_for(srv)
        time.sleep(0.5)
        add_version(SHIPPED_VIT, repo / "vit" / "2", "2")
        add_version(repo / "translator" / "1", repo / "translator" / "2", "2")
        started = time.monotonic()
        client.load_model("vit")
        client.load_model("translator")
        done = time.monotonic()
        listed = {(m["name"], m["version"]): m["status"] for m in srv.get("/models").json()["models"]}
        index = client.get_model_repository_index()
    statuses = [s for _, _, s, _ in load.answers]
    assert statuses.count(200) == len(statuses) > 50, {s: statuses.count(s) for s in set(statuses)}  # zero failed
    for (_, route), versions in load.sequences.items():  # each client sees one switch, and never goes back
        switched = versions.index("2")
        assert set(versions[:switched]) == {"1"} and set(versions[switched:]) == {"2"}, route
    before = [v for r, t, _, v in load.answers if t < started]
    after = [v for r, t, _, v in load.answers if t > done + 0.1]
    assert set(before) == {"1"} and set(after) == {"2"}
    assert listed == {("vit", "2"): "ready", ("translator", "2"): "ready"}  # the old versions drained and went
    states = {(e["name"], e["version"]): e["state"] for e in index}
    assert states == {
        ("vit", "1"): "UNAVAILABLE",
        ("vit", "2"): "READY",
        ("translator", "1"): "UNAVAILABLE",
        ("translator", "2"): "READY",
    }


def test_a_corrupt_version_fails_to_load_and_the_old_one_keeps_answering(repo, tmp_path, fashion_pngs):
    add_version(SHIPPED_VIT, tmp_path / "held", "3")  # copied in once the service runs
    (tmp_path / "held" / "model.onnx").write_bytes(b"not the file the manifest hashed")
    with serving(tmp_path, repo) as srv, Load(srv.url, fashion_pngs[0]) as load:
        shutil.move(tmp_path / "held", repo / "vit" / "3")
        client = client_for(srv)
        with pytest.raises(InferenceServerException, match="vit/3 failed to load") as failure:
            client.load_model("vit")
        models = {(m["name"], m["version"]): m for m in srv.get("/models").json()["models"]}
        ready = srv.get("/readyz")
        metrics = srv.get("/metrics").text
    assert failure.value.status() == "400"
    assert [s for _, _, s, _ in load.answers].count(200) == len(load.answers) > 20
    assert set(load.versions("classify")) == {"1"}
    assert models[("vit", "1")]["status"] == "ready" and models[("vit", "1")]["unpinned"]
    assert models[("vit", "3")]["status"] == "failed" and "sha256" in models[("vit", "3")]["reason"]
    assert ready.status_code == 200  # every model still has a ready version
    assert metric_value(metrics, "attnserve_model_load_failures_total", model="vit", version="3") == 1


def test_unload_lets_running_requests_finish_then_the_model_is_gone(repo, tmp_path):
    with serving(tmp_path, repo) as srv:
        client = client_for(srv)
        made = httpx.post(srv.url + "/translate", json={"text": "Open the file.", "return_attention": True})
        attention_id = made.json()["results"][0]["attention_id"]
        results: list = []
        long_text = " ".join(["Open the file and save the document."] * 6)

        def translate_long() -> None:
            results.append(httpx.post(srv.url + "/translate", json={"text": long_text, "beam_size": 4}, timeout=60))

        # eight at once: one alone can be decoded between two reads of /metrics on a busy machine. The unload
        # comes once all eight are queued (a request arriving after it is refused, rightly) and one is decoding;
        # the one sentence translated above is counted among the finished
        workers = [threading.Thread(target=translate_long) for _ in range(8)]
        for w in workers:
            w.start()
        deadline, running, submitted = time.monotonic() + 30, 0.0, 0.0
        while (not running or submitted < 8 * 6) and time.monotonic() < deadline:
            metrics = srv.get("/metrics").text
            running = metric_value(metrics, "attnserve_running_sequences", model="translator")
            rows = running + metric_value(metrics, "attnserve_waiting_sequences", model="translator")
            done = metric_value(metrics, "attnserve_time_per_output_token_seconds_count", model="translator")
            submitted = rows / 4 + done - 1  # sentences queued, decoding or finished (six a request, four rows each)
            time.sleep(0.005)
        assert running and submitted == 8 * 6, f"not all queued and decoding: {running=} {submitted=} {results=}"
        client.unload_model("translator")
        for w in workers:
            w.join(60)
        after = httpx.post(srv.url + "/translate", json={"text": "Open."})
        listed = [m["name"] for m in srv.get("/models").json()["models"]]
        ready = srv.get("/readyz").status_code
        kept = httpx.get(f"{srv.url}/attention/{attention_id}")
    assert kept.status_code == 200 and kept.json()["version"] == "1"  # ids outlive their model until their TTL
    assert len(results) == 8 and all(r.status_code == 200 and r.json()["version"] == "1" for r in results)
    assert after.status_code == 404 and after.json()["error"]["code"] == "model_not_found"
    assert listed == ["vit"] and ready == 200


def test_a_second_load_of_a_busy_model_answers_its_state(repo, tmp_path):
    add_version(SHIPPED_VIT, repo / "vit" / "2", "2")
    shutil.move(repo / "vit" / "2", tmp_path / "v2")
    with serving(tmp_path, repo) as srv:
        shutil.move(tmp_path / "v2", repo / "vit" / "2")
        first = threading.Thread(target=lambda: httpx.post(srv.url + "/v2/repository/models/vit/load", timeout=120))
        first.start()
        deadline, loading = time.monotonic() + 60, False
        while not loading and time.monotonic() < deadline:  # until the first load is under way
            states = {(m["version"], m["status"]) for m in srv.get("/models").json()["models"] if m["name"] == "vit"}
            loading = any(v == "2" and s in ("pending", "loading", "warming") for v, s in states)
        second = httpx.post(srv.url + "/v2/repository/models/vit/load", timeout=120)
        first.join(120)
        unknown = httpx.post(srv.url + "/v2/repository/models/nope/load")
    # the first load's operation is under way: loading version 2, or (the warm-up is two runs) already
    # unloading version 1 behind it
    assert second.status_code == 409, second.text
    assert re.search(r"busy: (loading version 2|unloading version 1);", second.json()["error"]), second.text
    assert unknown.status_code == 404


def test_poll_mode_picks_up_a_copied_version_folder(repo, tmp_path, fashion_pngs):
    image = base64.b64encode(fashion_pngs[0]).decode()
    with serving(tmp_path, repo, repository_poll_s=0.3) as srv:
        before = httpx.post(srv.url + "/classify", json={"images": [image]}).json()["version"]
        staging = tmp_path / "staging"
        add_version(SHIPPED_VIT, staging, "2")
        shutil.move(staging, repo / "vit" / "2")  # a deploy: the folder appears, complete
        deadline, after = time.monotonic() + 60, None
        while time.monotonic() < deadline and after != "2":
            after = httpx.post(srv.url + "/classify", json={"images": [image]}).json()["version"]
            time.sleep(0.1)
        shutil.rmtree(repo / "translator")  # and a removed folder is unloaded
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "translator" in str(srv.get("/models").json()):
            time.sleep(0.1)
        names = [m["name"] for m in srv.get("/models").json()["models"]]
    assert (before, after) == ("1", "2")
    assert names == ["vit"]
