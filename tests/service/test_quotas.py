"""Quotas (``service/core/quotas.py``): policies as written, fixed windows counted in memory and in a real Redis,
refusals whole, the RateLimit fields, who is limited, and the key file's terms."""

from __future__ import annotations

import asyncio
import hashlib
import re
import time

import pytest

from service.core.keys import Keys, read_terms
from service.core.quotas import (
    KeyTerms,
    Limit,
    MemoryCounter,
    Quota,
    QuotaExceeded,
    Quotas,
    RedisCounter,
    parse_policy,
)


class Clock:
    def __init__(self, now: float = 1_000_040.0) -> None:  # 20 s into a minute
        self.now = now

    def __call__(self) -> float:
        return self.now


def run(coro):
    return asyncio.run(coro)


def test_a_policy_is_read_as_written_and_a_bad_one_is_named():
    assert parse_policy("requests=600/min, characters=100000/min,images=5/s") == (
        Limit("requests", 600, 60),
        Limit("characters", 100000, 60),
        Limit("images", 5, 1),
    )
    assert parse_policy("") == parse_policy("off") == parse_policy(" None ") == ()
    for bad, said in [
        ("requests=600", "MEASURE=AMOUNT/WINDOW"),
        ("tokens=5/min", "measure 'tokens'"),
        ("requests=5/day", "window 'day'"),
        ("requests=5/min,requests=6/h", "requests is limited twice"),
        ("requests=-5/min", "MEASURE=AMOUNT/WINDOW"),
    ]:
        with pytest.raises(ValueError, match=re.escape(said)):
            parse_policy(bad)


def test_a_charge_counts_until_the_amount_then_is_refused_whole_until_the_window_ends():
    clock, refused = Clock(), []
    counter = MemoryCounter()
    limits = parse_policy("requests=3/min,characters=100/min")

    def quota() -> Quota:
        return Quota(counter, "key:a", limits, clock, refused.extend)

    for n in range(3):
        q = quota()
        run(q.charge(requests=1))
        assert q.headers()["RateLimit"] == f'"requests";r={2 - n};t=40, "characters";r=100;t=40'
    q = quota()
    with pytest.raises(QuotaExceeded) as e:
        run(q.charge(requests=1))
    assert e.value.status == 429 and e.value.code == "quota_exceeded"
    assert e.value.headers["Retry-After"] == "40" and "requests 3 per 60 s" in e.value.message
    assert e.value.headers["RateLimit-Policy"] == '"requests";q=3;w=60, "characters";q=100;w=60'
    assert refused == ["requests"]
    # characters are counted on their own, and a charge over one limit adds to none
    run(quota().charge(characters=90))
    with pytest.raises(QuotaExceeded):
        run(quota().charge(characters=20))
    q = quota()
    run(q.charge(characters=10))
    assert q.standing[1].remaining == 0
    clock.now += 40  # the next window
    q = quota()
    run(q.charge(requests=1, characters=100))
    assert q.headers()["RateLimit"] == '"requests";r=2;t=60, "characters";r=0;t=60'


def test_a_request_larger_than_the_whole_quota_is_refused_without_a_retry_after():
    q = Quota(MemoryCounter(), "key:a", parse_policy("characters=50/min"), Clock())
    with pytest.raises(QuotaExceeded) as e:
        run(q.charge(characters=51))
    assert "Retry-After" not in e.value.headers and "split it" in e.value.message


def test_a_measure_the_policy_does_not_limit_is_free_and_asks_nothing():
    class Refusing(MemoryCounter):
        async def take(self, *args):
            raise AssertionError("asked the counter")

    q = Quota(Refusing(), "key:a", parse_policy("requests=1/min"), Clock())
    run(q.charge(characters=10_000, images=5))
    assert q.headers() == {"RateLimit-Policy": '"requests";q=1;w=60'}


def test_who_is_limited_by_what():
    counter = MemoryCounter()
    own = parse_policy("requests=5/min")
    quotas = Quotas(
        counter,
        default=parse_policy("requests=100/min"),
        anonymous=parse_policy("requests=10/min"),
        exempt=["127.0.0.0/8", "::1", "10.1.0.0/16"],
        terms={"aaa": KeyTerms(quota=own), "bbb": KeyTerms(quota=())},
    )
    assert quotas.for_caller("aaa", "1.2.3.4").limits == own
    assert quotas.for_caller("bbb", "1.2.3.4") is None  # its terms: no quota
    assert quotas.for_caller("ccc", "127.0.0.1").limits == parse_policy("requests=100/min")  # keys: never by address
    anonymous = quotas.for_caller(None, "192.0.2.7")
    assert anonymous.partition == "address:192.0.2.7" and anonymous.limits == parse_policy("requests=10/min")
    for exempt in ("127.0.0.1", "::1", "10.1.200.3", None, "testclient"):
        assert quotas.for_caller(None, exempt) is None, exempt


def test_the_key_file_gives_each_key_its_terms(tmp_path):
    a, b, c = (hashlib.sha256(k.encode()).hexdigest() for k in ("a", "b", "c"))
    path = tmp_path / "keys"
    path.write_text(
        f"# team keys\n{a} quota=requests=60/min,characters=5000/min priority=batch\n\n{b}   # interactive\n"
        f"{c.upper()} quota=off\n"
    )
    terms = read_terms((), path)
    assert terms[a] == KeyTerms(parse_policy("requests=60/min,characters=5000/min"), "batch")
    assert terms[b] == KeyTerms() and terms[c] == KeyTerms(quota=())
    keys = Keys(tuple(terms), terms)
    assert keys.batch_only(a[:12]) and not keys.batch_only(b[:12]) and not keys.batch_only(None)
    for bad, said in [(f"{a} priority=urgent", "line 1: 'priority=urgent'"), (f"{a} quota=rps=1/s", "measure 'rps'")]:
        path.write_text(bad + "\n")
        with pytest.raises(ValueError, match=re.escape(said)):
            read_terms((), path)


def test_replicas_sharing_a_redis_share_the_quota(redis):
    """Two counters on one real Redis (two replicas): the quota is taken once between them, not once each;
    the keys expire after their window."""
    limits = parse_policy("requests=4/h")
    hour = int(time.time() // 3600) + 1  # 10 minutes into the next hour: its keys expire after it, not at once
    clock = Clock(hour * 3600.0 + 600)

    async def scenario() -> list[object]:
        counters = [RedisCounter(redis.url, 1.0), RedisCounter(redis.url, 1.0)]
        outcomes = []
        try:
            for i in range(6):
                q = Quota(counters[i % 2], "key:shared", limits, clock)
                try:
                    await q.charge(requests=1)
                    outcomes.append(q.standing[0].remaining)
                except QuotaExceeded as e:
                    outcomes.append(e.headers["Retry-After"])
            client = counters[0]._redis
            ttl = await client.pttl(f"{RedisCounter.PREFIX}key:shared:requests:3600:{hour}")
            outcomes.append(0 < ttl)
        finally:
            for c in counters:
                await c.close()
        return outcomes

    assert run(scenario()) == [3, 2, 1, 0, "3000", "3000", True]


def test_a_redis_that_fails_lets_requests_through_and_counts_it(caplog):
    errors = []
    counter = RedisCounter("redis://127.0.0.1:9/0", 0.2, lambda: errors.append(1))  # nothing listens there

    async def scenario() -> None:
        try:
            for _ in range(3):
                q = Quota(counter, "key:a", parse_policy("requests=1/min"), Clock())
                await q.charge(requests=1)
                assert q.standing is None and "RateLimit" not in q.headers()
        finally:
            await counter.close()

    run(scenario())
    assert len(errors) == 3
    assert len([r for r in caplog.records if "uncounted" in r.getMessage()]) == 1  # logged once a minute
