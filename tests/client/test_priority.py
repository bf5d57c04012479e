"""``priority`` in the SDK: sent only when it is ``batch`` (an older service, which knows no ``priority``, still
translates), and ``translate_po`` sends its catalog as ``batch``, sync and async."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.client.sdk_testing import Script

TRANSLATED = {"model": "translator", "version": "3", "results": []}
CATALOG = (
    'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n"Language: de\\n"\n\nmsgid "Open"\nmsgstr ""\n'
)


def translated(*texts: str) -> dict:
    results = [
        {
            "translation": f"[{t}]",
            "source_tokens": [],
            "target_tokens": [],
            "finished": True,
            "placeholders": [],
            "sentences": [],
        }
        for t in texts
    ]
    return {"model": "translator", "version": "3", "results": results}


@pytest.mark.parametrize(
    ("options", "field"), [({}, None), ({"priority": "interactive"}, None), ({"priority": "batch"}, "batch")]
)
def test_priority_is_sent_only_when_batch(make_client, options, field):
    script = Script(httpx.Response(200, json=TRANSLATED))
    make_client(script).translate("Open.", **options)
    assert json.loads(script.requests[0].content).get("priority", None) == field


def test_a_catalog_is_translated_as_batch_work(make_client):
    script = Script(httpx.Response(200, json=translated("Open")))
    result = make_client(script).translate_po(CATALOG)
    assert json.loads(script.requests[0].content)["priority"] == "batch"
    assert result.summary.filled == 1
