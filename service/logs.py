"""Structured logs: one JSON object per line, each carrying the id of the request it belongs to.

The request id is kept in a context variable so that any module logging during a request (the
batcher, the decoder) is tagged with it without passing it around. Ids sent by clients in
``X-Request-ID`` are accepted only when short and plain, so a client cannot forge log lines.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import os
import re
from typing import Any

REQUEST_ID_HEADER = "x-request-id"
_SAFE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("attnserve_request_id", default=None)

# Attributes every LogRecord has; anything else was passed through ``extra=`` and is logged as a field.
_STANDARD_ATTRS = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "request_id", "color_message"}


def current_request_id() -> str | None:
    return _request_id.get()


def bind_request_id(candidate: str | None) -> tuple[str, contextvars.Token]:
    """The client's id when it is safe to log, else a fresh one; bound to the current context."""
    request_id = candidate if candidate and _SAFE_REQUEST_ID.match(candidate) else os.urandom(16).hex()
    return request_id, _request_id.set(request_id)


def unbind_request_id(token: contextvars.Token) -> None:
    _request_id.reset(token)


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = _request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "message", "request_id", ...extra fields, "exc"}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if getattr(record, "request_id", None):
            out["request_id"] = record.request_id
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


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
