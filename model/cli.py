"""How every attnserve CLI treats a person's mistakes: one ``error:`` line and exit status 2.

Torch-free, so data CLIs (corpus, tokenizer, samples) start fast.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


class CliError(RuntimeError):
    """An error a person must fix (missing data, bad option); printed as one line, exit status 2."""


def run_cli(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> None:
    """Run a CLI ``main``; user errors become one ``error:`` line and a non-zero exit, not a traceback."""
    from model.data import DatasetError

    try:
        sys.exit(main(argv))
    except (CliError, DatasetError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
