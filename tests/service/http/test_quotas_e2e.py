"""Quotas on real servers (``python -m service`` on the shipped models): two replicas sharing a real
``redis-server``, one serving gRPC too, and a replica without keys limiting client addresses.

What an operator relies on: a key's quota is one quota whichever replica it calls (not one per replica);
over it the caller gets 429 with ``Retry-After`` over HTTP and OIP REST, ``RESOURCE_EXHAUSTED`` with
``retry-after`` and a ``RetryInfo`` over gRPC, and every answer says where it stands (``RateLimit``); other
keys are not touched; a key whose terms say ``priority=batch`` queues as batch work; the SDK waits out a
short window instead of failing.
"""

from __future__ import annotations

import hashlib
import re
import time

import grpc
import httpx
import pytest
from attnserve_client import Client, QuotaExceededError
from google.rpc import error_details_pb2, status_pb2

from service.grpc.generated import grpc_service_pb2 as pb
from service.grpc.generated.grpc_service_pb2_grpc import GRPCInferenceServiceStub
from tests.conftest import ROOT
from tests.service.service_testing import free_port, metric_value, start_subprocess_server

SHIPPED = ROOT / "models"
KEYS = {name: f"quota-key-{name}" for name in ("bulk", "chars", "grpc", "sdk", "spent", "free")}
TERMS = {
    "bulk": "quota=requests=4/h priority=batch",
    "chars": "quota=characters=100/h",
    "grpc": "quota=requests=2/h",
    "sdk": "quota=requests=1/s",
    "spent": "quota=requests=1/h",
    "free": "",  # the default: ATTNSERVE_QUOTA
}
TEXT = {"text": "Open the file.", "beam_size": 1}


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


@pytest.fixture(scope="module")
def replicas(redis, tmp_path_factory):
    """Replicas ``a`` and ``b`` (gRPC) counting in one Redis, with each key's terms in the key file; ``anonymous``
    without keys, its quota per address with the loopback not exempt."""
    folder = tmp_path_factory.mktemp("quotas")
    key_file = folder / "keys"
    key_file.write_text("".join(f"{hashlib.sha256(KEYS[n].encode()).hexdigest()} {TERMS[n]}\n" for n in KEYS))
    common = {"api_key_hashes_file": str(key_file), "quota": "requests=1000/h", "quota_store": "redis"}
    common |= {"redis_url": redis.url, "redis_timeout_s": "1"}
    started = {
        "a": start_subprocess_server(folder, SHIPPED, **common),
        "b": start_subprocess_server(folder, SHIPPED, grpc_port=str(free_port()), **common),
        "anonymous": start_subprocess_server(
            folder, SHIPPED, anonymous_quota="requests=3/h,images=2/h", quota_exempt="[]"
        ),
    }
    try:
        for srv in started.values():
            srv.wait_ready()
        past_the_hour()
        yield started
    finally:
        for srv in started.values():
            srv.stop()


def past_the_hour() -> None:
    """The hourly windows of these tests must not end during them: wait out the last 60 s of an hour."""
    left = 3600 - time.time() % 3600
    if left < 60:
        time.sleep(left + 1)


def standing(r: httpx.Response) -> dict[str, tuple[int, int]]:
    """``RateLimit`` as {policy: (remaining, seconds to reset)}."""
    return {m[1]: (int(m[2]), int(m[3])) for m in re.finditer(r'"(\w+)";r=(\d+);t=(\d+)', r.headers["ratelimit"])}


def test_a_keys_quota_is_shared_by_the_replicas_and_refused_with_retry_after(replicas):
    a, b = replicas["a"], replicas["b"]
    answers = [httpx.post(f"{srv.url}/translate", json=TEXT, headers=auth("bulk"), timeout=60) for srv in (a, b, a, b)]
    assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]
    assert [standing(r)["requests"][0] for r in answers] == [3, 2, 1, 0]  # one count over both replicas
    assert all(r.headers["ratelimit-policy"] == '"requests";q=4;w=3600' for r in answers)
    refused = [
        httpx.post(f"{b.url}/translate", json=TEXT, headers=auth("bulk"), timeout=60),
        httpx.post(f"{a.url}/v2/models/translator/infer", json=oip_text(), headers=auth("bulk"), timeout=60),
    ]
    for r in refused:
        assert r.status_code == 429, r.text
        assert 1 <= int(r.headers["retry-after"]) <= 3600 and standing(r)["requests"][0] == 0
    assert refused[0].json()["error"]["code"] == "quota_exceeded"
    assert "quota exceeded: requests 4 per 3600 s" in refused[1].json()["error"]
    other = httpx.post(f"{b.url}/translate", json=TEXT, headers=auth("free"), timeout=60)  # the default quota
    assert other.status_code == 200 and other.headers["ratelimit-policy"] == '"requests";q=1000;w=3600'
    # its key's terms queue it as batch work, whatever it asked
    metrics = httpx.get(f"{a.url}/metrics").text
    assert metric_value(metrics, "attnserve_priority_queue_wait_seconds_count", priority="batch") >= 2
    assert metric_value(metrics, "attnserve_quota_refusals_total", measure="requests") == 1


def oip_text() -> dict:
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["Open the file."]}]}


def test_characters_are_charged_once_the_body_is_read(replicas):
    url = replicas["a"].url
    first = httpx.post(f"{url}/translate", json={"texts": ["a" * 30, "b" * 30]}, headers=auth("chars"), timeout=60)
    assert first.status_code == 200 and standing(first)["characters"][0] == 40
    over = httpx.post(f"{url}/translate", json={"text": "c" * 41}, headers=auth("chars"), timeout=60)
    assert over.status_code == 429 and "characters 100 per 3600 s" in over.json()["error"]["message"]
    whole = httpx.post(f"{url}/translate", json={"text": "d" * 101}, headers=auth("chars"), timeout=60)
    assert whole.status_code == 429 and "retry-after" not in whole.headers and "split it" in whole.text
    bad = httpx.post(f"{url}/translate", json={"text": "e" * 10, "beam_size": 99}, headers=auth("chars"), timeout=60)
    assert bad.status_code == 422  # refused before it is charged
    fits = httpx.post(f"{url}/translate", json={"text": "f" * 40}, headers=auth("chars"), timeout=60)
    assert fits.status_code == 200 and standing(fits)["characters"][0] == 0


def test_grpc_answers_resource_exhausted_with_retry_info(replicas):
    with grpc.insecure_channel(replicas["b"].grpc) as channel:
        stub = GRPCInferenceServiceStub(channel)
        metadata = (("authorization", f"Bearer {KEYS['grpc']}"),)
        request = pb.ModelInferRequest(
            model_name="translator",
            inputs=[
                pb.ModelInferRequest.InferInputTensor(
                    name="text", datatype="BYTES", shape=[1], contents=pb.InferTensorContents(bytes_contents=[b"Hi."])
                )
            ],
        )
        for left in (1, 0):
            _, call = stub.ModelInfer.with_call(request, metadata=metadata, timeout=60)
            trailing = dict(call.trailing_metadata())
            assert trailing["ratelimit"].startswith(f'"requests";r={left};t=')
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(request, metadata=metadata, timeout=60)
        (streamed,) = list(stub.ModelStreamInfer(iter([request]), metadata=metadata, timeout=60))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    trailing = dict(refused.value.trailing_metadata())
    status = status_pb2.Status.FromString(trailing["grpc-status-details-bin"])
    info = error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(info) and info.retry_delay.seconds == int(trailing["retry-after"]) >= 1
    assert "quota exceeded" in streamed.error_message


def test_the_sdk_waits_out_a_short_window_and_raises_past_its_limit(replicas):
    with Client(base_url=replicas["a"].url, api_key=KEYS["sdk"], max_retries=3) as client:
        started = time.monotonic()
        for _ in range(3):
            assert client.translate("Open the file.", beam_size=1).results
        assert time.monotonic() - started >= 1.0  # a second window waited for, at least
    assert httpx.post(f"{replicas['a'].url}/translate", json=TEXT, headers=auth("spent"), timeout=60).status_code == 200
    client = Client(base_url=replicas["a"].url, api_key=KEYS["spent"], max_retries=3)
    with client, pytest.raises(QuotaExceededError) as e:  # an hour's window is past what a call waits for
        client.translate("Open the file.", beam_size=1)
    assert e.value.status == 429 and e.value.code == "quota_exceeded" and (e.value.retry_after or 0) > 60


def test_without_keys_each_address_has_the_anonymous_quota(replicas, fashion_pngs):
    url = replicas["anonymous"].url
    r = httpx.post(f"{url}/classify", files=[("file", ("a.png", fashion_pngs[0]))], timeout=60)
    assert r.status_code == 200 and standing(r) == {"requests": (2, standing(r)["requests"][1]), "images": (1, ANY)}
    assert httpx.post(f"{url}/translate", json=TEXT, timeout=60).status_code == 200
    assert httpx.post(f"{url}/translate", json=TEXT, timeout=60).status_code == 200
    over = httpx.post(f"{url}/translate", json=TEXT, timeout=60)
    assert over.status_code == 429 and over.json()["error"]["code"] == "quota_exceeded"
    assert httpx.get(f"{url}/healthz").status_code == 200  # only the routes that queue work are metered


class _Any:
    def __eq__(self, other: object) -> bool:
        return True


ANY = _Any()
