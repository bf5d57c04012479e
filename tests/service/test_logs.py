"""Structured logs: request ids, and the access log's direct path writing exactly what logging would."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re

from service.logs import (
    AccessLog,
    JsonFormatter,
    RequestIdFilter,
    bind_request_id,
    flush_access_logs,
    new_request_id,
    unbind_request_id,
)


def _logger(name: str, stream: io.StringIO, formatter: logging.Formatter) -> logging.Logger:
    parent = logging.getLogger(name)
    parent.handlers.clear()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    handler.addFilter(RequestIdFilter())
    parent.addHandler(handler)
    parent.setLevel(logging.INFO)
    parent.propagate = False
    return logging.getLogger(f"{name}.access")  # propagates to the parent's handler, as in logging_config


def test_a_forked_process_generates_other_ids_than_its_parent():
    import os

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next ids and leave at once
        os.write(write, " ".join(new_request_id() for _ in range(3)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 4096).decode().split()
    os.close(read)
    parent = [new_request_id() for _ in range(3)]
    assert len(child) == 3 and not set(child) & set(parent)
    assert child[0][:16] != parent[0][:16]  # a new per-process half too


def test_generated_request_ids_are_unique_32_hex_digits():
    ids = [new_request_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    request_id, token = bind_request_id('x" level=error')  # unsafe ids are replaced by a generated one
    unbind_request_id(token)
    assert re.fullmatch(r"[0-9a-f]{32}", request_id)


def test_access_lines_written_directly_are_the_lines_logging_writes():
    direct, through_logging = io.StringIO(), io.StringIO()
    access = AccessLog(_logger("t_direct", direct, JsonFormatter()))
    reference = _logger("t_reference", through_logging, JsonFormatter())

    async def log_both() -> int:
        for path, status in (("/classify", 200), ('/odd"path\\', 404)):
            access.log(logging.INFO, "POST", path, status, 1.234, "127.0.0.1", "rid-1")
            _, token = bind_request_id("rid-1")
            reference.log(
                logging.INFO,
                "%s %s %d",
                "POST",
                path,
                status,
                extra={"method": "POST", "path": path, "status": status, "duration_ms": 1.234, "client": "127.0.0.1"},
            )
            unbind_request_id(token)
        access.log(logging.DEBUG, "GET", "/healthz", 200, 0.1, None, "rid-2")  # below the level: not written
        written = [direct.getvalue()]
        await asyncio.sleep(0)
        written.append(direct.getvalue())  # still waiting: lines are written in batches
        await asyncio.sleep(AccessLog.FLUSH_AFTER_S + 0.2)
        return written

    assert asyncio.run(log_both()) == ["", ""]
    ours = [json.loads(line) for line in direct.getvalue().splitlines()]
    theirs = [json.loads(line) for line in through_logging.getvalue().splitlines()]
    assert len(ours) == len(theirs) == 2
    for a, b in zip(ours, theirs):
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", a.pop("ts"))
        b.pop("ts")
        assert (a["logger"], b["logger"]) == ("t_direct.access", "t_reference.access")
        a["logger"] = b["logger"]
        assert list(a) == list(b) and a == b  # same fields, same order, same values


def test_access_lines_go_through_logging_when_it_is_set_up_otherwise(caplog):
    logger = _logger("t_other", io.StringIO(), logging.Formatter("%(message)s"))  # not the JSON handler
    with caplog.at_level(logging.INFO, logger="t_other"):
        logger.parent.propagate = True  # caplog's handler sits on the root logger
        AccessLog(logger).log(logging.INFO, "POST", "/classify", 200, 2.5, "10.0.0.1", "rid-3")
    record = next(r for r in caplog.records if r.name == "t_other.access")
    assert record.getMessage() == "POST /classify 200"
    assert (record.method, record.path, record.status, record.duration_ms, record.client) == (
        "POST",
        "/classify",
        200,
        2.5,
        "10.0.0.1",
    )


def test_access_lines_wait_at_most_for_a_full_batch_or_the_service_stopping():
    stream = io.StringIO()
    access = AccessLog(_logger("t_batch", stream, JsonFormatter()))

    async def log(n: int) -> int:
        for i in range(n):
            access.log(logging.INFO, "POST", "/classify", 200, 1.0, None, f"rid-{i}")
        return len(stream.getvalue().splitlines())

    assert asyncio.run(log(AccessLog.FLUSH_LINES - 1)) == 0  # the loop stopped before the timer fired
    flush_access_logs()  # as the service's shutdown does
    assert len(stream.getvalue().splitlines()) == AccessLog.FLUSH_LINES - 1
    assert asyncio.run(log(AccessLog.FLUSH_LINES)) == 2 * AccessLog.FLUSH_LINES - 1  # a full batch goes at once
    ids = [json.loads(line)["request_id"] for line in stream.getvalue().splitlines()]
    assert ids[: AccessLog.FLUSH_LINES - 1] == [f"rid-{i}" for i in range(AccessLog.FLUSH_LINES - 1)]  # in order
    access.log(logging.INFO, "GET", "/models", 200, 1.0, None, "no-loop")  # outside any loop: written at once
    assert json.loads(stream.getvalue().splitlines()[-1])["request_id"] == "no-loop"
