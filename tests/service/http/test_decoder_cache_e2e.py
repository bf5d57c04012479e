"""``POST /translate`` answers the same with the decoder cache on the device as on the host.

Starts two in-process uvicorn servers (127.0.0.1, free ports) on the shipped translator, one with
``ATTNSERVE_DECODER_CACHE=device`` and one with ``host``, and sends both the same real sentences:
greedy, beam 4 with its n-best list, and concurrent requests that join and leave a running batch.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import httpx
import pytest

from service.process import create_app
from service.settings import Settings
from tests.conftest import ROOT, SHIPPED_TRANSLATOR
from tests.service.service_testing import BASE_ENV, ThreadServer

SENTENCES = [t for t in (ROOT / "benchmarks" / "translate_sentences.txt").read_text().splitlines() if t.strip()]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    repo = tmp_path_factory.mktemp("cache") / "models"
    (repo / "translator").mkdir(parents=True)
    (repo / "translator" / "3").symlink_to(SHIPPED_TRANSLATOR)
    base = {k.removeprefix("ATTNSERVE_").lower(): v for k, v in BASE_ENV.items()}
    with ExitStack() as stack:
        started = []
        for cache in ("device", "host"):
            settings = Settings(**{**base, "model_repository": repo, "decoder_cache": cache, "max_text_chars": 1000})
            app = create_app(settings)
            srv = stack.enter_context(ThreadServer(app))
            srv.wait_ready()
            srv.app = app
            started.append(srv)
        yield started


def test_the_servers_decode_where_they_were_told(servers):
    models = [srv.app.state.serving.registry.get("translator", task="translation") for srv in servers]
    assert [m.translator.cache_on_device for m in models] == [True, False]


@pytest.mark.parametrize(
    "options",
    [{"beam_size": 1}, {"beam_size": 4, "num_return_sequences": 4}, {"beam_size": 2, "max_new_tokens": 5}],
)
def test_one_request_of_many_sentences_gets_the_same_answer(servers, options):
    answers = [
        httpx.post(srv.url + "/translate", json={"texts": SENTENCES[:12], **options}, timeout=120) for srv in servers
    ]
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].json()["results"] == answers[1].json()["results"]  # translations, tokens, n-best scores


def test_concurrent_requests_joining_a_running_batch_get_the_same_translations(servers):
    bodies = [{"text": t, "beam_size": 1 + 3 * (i % 3 == 0)} for i, t in enumerate(SENTENCES[:24])]

    def send(url: str, body: dict) -> list[str]:
        r = httpx.post(url + "/translate", json=body, timeout=120)
        r.raise_for_status()
        return [x["translation"] for x in r.json()["results"]]

    got = []
    for srv in servers:
        with ThreadPoolExecutor(8) as pool:
            got.append(list(pool.map(lambda b, u=srv.url: send(u, b), bodies)))
    assert got[0] == got[1]
