"""``python -m service``: the service (``service/process.py``) under uvicorn, with host, port and workers from settings."""

from __future__ import annotations

import sys

import uvicorn
from pydantic import ValidationError

from service.http.connections import GuardedProtocol
from service.logs import configure_logging, logging_config
from service.settings import Settings, explain


def main() -> int:
    try:
        settings = Settings()
    except ValidationError as e:  # one line, no traceback: an operator's typo, not a bug of the service
        print(f"attnserve: invalid settings: {explain(e)}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    uvicorn.run(
        "service.process:worker_app",  # called in each worker process, which builds its own core
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_config=logging_config(settings.log_level, settings.log_format),
        access_log=False,  # the service logs each request itself, with its request id and latency
        server_header=False,
        timeout_keep_alive=settings.keep_alive_s,
        timeout_graceful_shutdown=settings.drain_timeout_s,  # after ATTNSERVE_DRAIN_DELAY_S (service/process.py)
        http=GuardedProtocol,  # httptools, as "auto" picks, with a header timeout and a connection bound
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
