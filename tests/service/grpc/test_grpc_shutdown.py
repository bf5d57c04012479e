"""SIGTERM to ``python -m service`` serving HTTP and gRPC: gRPC stops taking calls at once, while
uvicorn still drains HTTP (not after it, which could take twice the grace period and outlast a
container's stop timeout), and what either transport held in flight is answered."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, SHIPPED_TRANSLATOR
from tests.service.grpc.test_grpc import texts_input
from tests.service.service_testing import free_port, metric_value, start_subprocess_server, wait_until

SHIPPED = SHIPPED_TRANSLATOR.parent.parent
SENTENCES = (ROOT / "benchmarks" / "translate_sentences.txt").read_text().splitlines()


def test_sigterm_stops_grpc_beside_the_http_drain_and_answers_what_was_in_flight(tmp_path):
    srv = start_subprocess_server(tmp_path, SHIPPED, grpc_port=str(free_port()))
    try:
        srv.wait_ready()
        texts = SENTENCES[:32]
        body = {"texts": texts, "beam_size": 4, "max_new_tokens": 128}
        client = grpcclient.InferenceServerClient(srv.grpc)
        with ThreadPoolExecutor(2) as pool:
            over_http = pool.submit(httpx.post, srv.url + "/translate", json=body, timeout=120)
            over_grpc = pool.submit(client.infer, "translator", [texts_input(texts)], parameters={"beam_size": 4})

            def running() -> float:
                return metric_value(srv.get("/metrics").text, "attnserve_running_sequences", model="translator")

            wait_until(lambda: running() >= 2 * len(texts) or over_http.done(), timeout=60, what="both decoding")
            assert not over_http.done() and not over_grpc.done(), "the requests were too short to test a drain"
            srv.proc.send_signal(signal.SIGTERM)
            started = time.monotonic()

            def refused() -> bool:
                try:
                    grpcclient.InferenceServerClient(srv.grpc).is_server_live()
                except InferenceServerException as e:
                    return "UNAVAILABLE" in str(e.status())
                return False

            wait_until(refused, timeout=10, interval=0.05, what="gRPC refusing new calls")
            assert not over_http.done(), "gRPC stopped only after HTTP had drained"
            answer = over_http.result(timeout=60)
            translated = over_grpc.result(timeout=60).as_numpy("translation")
        assert answer.status_code == 200 and len(answer.json()["results"]) == len(texts)
        assert len(translated) == len(texts) and all(t.decode() for t in translated)
        # uvicorn re-raises the signal once it has shut down gracefully (as PID 1 of a container: exit 0)
        assert srv.proc.wait(timeout=30) in (0, -signal.SIGTERM)
        assert time.monotonic() - started < 30
    finally:
        srv.stop()
