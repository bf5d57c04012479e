"""Structured logs: one JSON object per line, each carrying the id of the request it belongs to.

The request id is kept in a context variable so that any module logging during a request (the
batcher, the decoder) is tagged with it without passing it around. Ids sent by clients in
``X-Request-ID`` are accepted only when short and plain, so a client cannot forge log lines.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import datetime as dt
import json
import logging
import os
import random
import re
import time
import weakref
from typing import Any

REQUEST_ID_HEADER = "x-request-id"
_SAFE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("attnserve_request_id", default=None)

# Attributes every LogRecord has; anything else was passed through ``extra=`` and is logged as a field.
_STANDARD_ATTRS = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "request_id", "color_message"}


# Generated ids: 32 hex digits, a random per-process half and a pseudo-random half from a generator
# seeded by the OS. No system call per request (a ``getrandom`` cost as much as the rest of the id
# handling on a loaded 2-core VM), and unlike a counter they do not tell clients the request rate.
_ID_PREFIX = os.urandom(8).hex()
_id_random = random.Random(os.urandom(16))


def _reseed_ids() -> None:  # a forked worker must not repeat its parent's ids
    global _ID_PREFIX
    _ID_PREFIX = os.urandom(8).hex()
    _id_random.seed(os.urandom(16))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed_ids)


def new_request_id() -> str:
    return f"{_ID_PREFIX}{_id_random.getrandbits(64):016x}"


def current_request_id() -> str | None:
    return _request_id.get()


def bind_request_id(candidate: str | None) -> tuple[str, contextvars.Token]:
    """The client's id when it is safe to log, else a fresh one; bound to the current context."""
    request_id = candidate if candidate and _SAFE_REQUEST_ID.match(candidate) else new_request_id()
    return request_id, _request_id.set(request_id)


def unbind_request_id(token: contextvars.Token) -> None:
    _request_id.reset(token)


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = _request_id.get()
        return True


def _line(created: float, level: str, logger: str, message: str, request_id: str | None) -> dict[str, Any]:
    """The fields every JSON line starts with (``JsonFormatter`` and ``AccessLog`` alike)."""
    out: dict[str, Any] = {
        "ts": dt.datetime.fromtimestamp(created, dt.timezone.utc).isoformat(timespec="milliseconds"),
        "level": level.lower(),
        "logger": logger,
        "message": message,
    }
    if request_id:
        out["request_id"] = request_id
    return out


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "message", "request_id", ...extra fields, "exc"}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", None)
        out = _line(record.created, record.levelname, record.name, record.getMessage(), request_id)
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class AccessLog:
    """The access log's lines, written straight to the stream of its JSON handler, in batches.

    Through ``logging`` a line cost about 23 us (a record, a filter, a generic formatter walking the
    record's attributes, a write and a flush), an eighth of the event loop's CPU per request under
    load. Here a request only notes its fields; the lines (the dict ``JsonFormatter`` would build:
    ``_line`` and the same fields) are formatted and written together at most ``FLUSH_AFTER_S``
    later, or once ``FLUSH_LINES`` are waiting, and when the service stops. Formatting one line
    as a request ends cost the loop about 55 us in the running service, against 6 us in a tight
    loop: code run between other work is cold on this VM, and a batch is formatted warm. Any other
    set-up of the ``attnserve.access`` logger (text format, other handlers, tests capturing
    records) goes through ``logging`` at once, as before.
    """

    FLUSH_AFTER_S = 0.02
    FLUSH_LINES = 256

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self._pending: list[tuple] = []
        self._handler: logging.StreamHandler | None = None
        self._timer: asyncio.TimerHandle | None = None
        _ACCESS_LOGS.add(self)

    def log(
        self,
        level: int,
        method: str,
        path: str,
        status: int,
        duration_ms: float,
        client: str | None,
        request_id: str | None,
        key: str | None = None,
    ) -> None:
        """One request's line; ``key`` is the fingerprint of its API key (never the key)."""
        logger = self.logger
        if not logger.isEnabledFor(level):
            return
        handler = self._direct_handler()
        if handler is None:
            logger.log(
                level,
                "%s %s %d",
                method,
                path,
                status,
                extra={
                    "method": method,
                    "path": path,
                    "status": status,
                    "duration_ms": duration_ms,
                    "client": client,
                    **({"key": key} if key else {}),
                },
            )
            return
        if self._pending and handler is not self._handler:
            self.flush()
        self._handler = handler
        self._pending.append((time.time(), level, method, path, status, duration_ms, client, request_id, key))
        if len(self._pending) >= self.FLUSH_LINES:
            self.flush()
        elif self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(self.FLUSH_AFTER_S, self.flush)
            except RuntimeError:  # no loop running: write now
                self.flush()

    def flush(self) -> None:
        """Write the waiting lines now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        entries, self._pending = self._pending, []
        handler = self._handler
        if not entries or handler is None:
            return
        name, lines = self.logger.name, []
        for created, level, method, path, status, duration_ms, client, request_id, key in entries:
            out = _line(created, logging.getLevelName(level), name, f"{method} {path} {status}", request_id)
            out.update(method=method, path=path, status=status, duration_ms=duration_ms, client=client)
            if key:
                out["key"] = key
            lines.append(json.dumps(out) + "\n")
        with handler.lock or contextlib.nullcontext():
            handler.stream.write("".join(lines))
            handler.flush()

    def _direct_handler(self) -> logging.StreamHandler | None:
        """The one JSON stream handler the line goes to, when that is all it goes to."""
        handlers: list[logging.Handler] = []
        logger: logging.Logger | None = self.logger
        while logger is not None:
            if logger.filters:
                return None
            handlers += logger.handlers
            logger = logger.parent if logger.propagate else None
        if len(handlers) != 1:
            return None
        handler = handlers[0]
        if type(handler) is not logging.StreamHandler or type(handler.formatter) is not JsonFormatter:
            return None
        if handler.level > logging.DEBUG or any(type(f) is not RequestIdFilter for f in handler.filters):
            return None
        return handler


_ACCESS_LOGS: weakref.WeakSet[AccessLog] = weakref.WeakSet()


def flush_access_logs() -> None:
    """Write every access line still waiting (the service is stopping)."""
    for access_log in list(_ACCESS_LOGS):
        access_log.flush()


atexit.register(flush_access_logs)


class TextFormatter(logging.Formatter):
    """For a person at a terminal: ``time LEVEL logger [request id] message``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        record.request_id = getattr(record, "request_id", None) or "-"
        return super().format(record)


def logging_config(level: str = "info", fmt: str = "json") -> dict:
    """A ``logging.config.dictConfig`` for the service and uvicorn's own loggers alike."""
    formatter = {"()": JsonFormatter} if fmt == "json" else {"()": TextFormatter}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": RequestIdFilter}},
        "formatters": {"default": formatter},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "default",
                "filters": ["request_id"],
            }
        },
        "loggers": {
            "attnserve": {"handlers": ["stderr"], "level": level.upper(), "propagate": False},
            "uvicorn": {"handlers": ["stderr"], "level": level.upper(), "propagate": False},
            "uvicorn.error": {"level": level.upper()},
            "uvicorn.access": {"handlers": [], "level": "WARNING", "propagate": False},
        },
    }


def configure_logging(level: str = "info", fmt: str = "json") -> None:
    """Install the service's handlers (idempotent: replaces earlier ones instead of stacking)."""
    import logging.config

    logging.config.dictConfig(logging_config(level, fmt))
