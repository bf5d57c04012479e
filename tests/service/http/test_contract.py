"""The OpenAPI document is the contract: schemathesis runs every check over ``/openapi.json`` against a
real server (``python -m service`` on the tiny ViT and translator), with API keys off and on, and finds
nothing. What it sends, how many cases and which answers the schema cannot foresee are set in
``schemathesis.toml`` beside this file; the run is deterministic, so a failure reproduces.

The server's limits are small so that the ones the document states are the ones a request meets first
(a 64-character text cannot reach the token limit), and so that translations stay short.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.core.keys import hash_key
from tests.service.service_testing import serving

CONFIG = Path(__file__).with_name("schemathesis.toml")
MAX_EXAMPLES = 30  # per operation and phase: about a minute per run on 2 cores
UNLOAD = "/v2/repository/models/{name}/unload"  # run last, on its own: it takes the models away
KEY = "contract-test-key"
LIMITS = {
    "max_text_chars": "64",
    "max_texts_per_request": "4",
    "max_images_per_request": "4",
    "max_new_tokens": "16",
    "max_beam_size": "2",
    "access_log": "false",
}


def schemathesis(url: str, cwd: Path, *args: str, key: str | None = None) -> None:
    """``schemathesis run --checks all`` over ``url``'s document; fails the test with its report."""
    command = [
        *(sys.executable, "-c", "from schemathesis.cli import schemathesis; schemathesis()"),
        *("--config-file", str(CONFIG), "run", f"{url}/openapi.json", "--checks", "all"),
        *("--max-examples", str(MAX_EXAMPLES), "--no-color", "--output-truncate", "false", *args),
    ]
    env = {**os.environ, "CONTRACT_API_KEY": key or ""}  # the bearer token schemathesis.toml sends
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-20000:] + proc.stderr[-5000:]
    assert "No issues found" in proc.stdout, proc.stdout[-5000:]


@pytest.mark.parametrize("keys", [False, True], ids=["keys-off", "keys-on"])
def test_schemathesis_finds_the_service_true_to_its_openapi_document(both_repository, tmp_path, keys):
    settings = dict(LIMITS, api_key_hashes=json.dumps([hash_key(KEY)])) if keys else LIMITS
    with serving(tmp_path, both_repository, **settings) as srv:
        document = srv.get("/openapi.json").json()
        assert ("bearer" in document["components"].get("securitySchemes", {})) is keys
        schemathesis(srv.url, tmp_path, "--exclude-path", UNLOAD, key=KEY if keys else None)
        schemathesis(srv.url, tmp_path, "--include-path", UNLOAD, key=KEY if keys else None)
