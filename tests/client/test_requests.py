"""What the clients send: settings from arguments or the environment, headers, and each endpoint's request.

Checked on a recording transport (``httpx.MockTransport``) for both clients; the end-to-end tests
show the real service accepts these requests.
"""

from __future__ import annotations

import json

import httpx
import pytest
from attnserve_client import AsyncClient, Client

from tests.client.sdk_testing import Script

OK = httpx.Response(200, json={"status": "ok"})
CLASSIFIED = httpx.Response(200, json={"model": "vit", "version": "1", "results": [{"top_k": []}]})
TRANSLATED = httpx.Response(200, json={"model": "translator", "version": "1", "results": []})
ENV = ("ATTNSERVE_BASE_URL", "ATTNSERVE_API_KEY", "ATTNSERVE_TIMEOUT", "ATTNSERVE_MAX_RETRIES", "ATTNSERVE_DEADLINE")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_settings_come_from_arguments_then_environment_then_defaults(cls, monkeypatch):
    default = cls()
    assert (default.base_url, default.api_key, default.timeout, default.max_retries) == (
        "http://127.0.0.1:8000",
        None,
        60.0,
        2,
    )
    monkeypatch.setenv("ATTNSERVE_BASE_URL", "http://env:1/")
    monkeypatch.setenv("ATTNSERVE_API_KEY", "env-key")
    monkeypatch.setenv("ATTNSERVE_TIMEOUT", "2.5")
    monkeypatch.setenv("ATTNSERVE_MAX_RETRIES", "7")
    from_env = cls()
    assert (from_env.base_url, from_env.api_key, from_env.timeout, from_env.max_retries) == (
        "http://env:1",
        "env-key",
        2.5,
        7,
    )
    given = cls(base_url="http://arg:2", api_key="arg-key", timeout=1.0, max_retries=0)
    assert (given.base_url, given.api_key, given.timeout, given.max_retries) == ("http://arg:2", "arg-key", 1.0, 0)
    with pytest.raises(TypeError):
        cls("http://positional:3")  # keyword-only
    monkeypatch.setenv("ATTNSERVE_MAX_RETRIES", "many")
    with pytest.raises(ValueError, match="ATTNSERVE_MAX_RETRIES"):
        cls()
    with pytest.raises(ValueError, match="http://"):
        cls(base_url="localhost:8000", max_retries=0)


def test_every_request_carries_auth_user_agent_request_id_and_timeout(make_client):
    script = Script(OK)
    client = make_client(script, base_url="http://gateway.test/attnserve/", api_key="s3cret", timeout=4.0)
    client.health()
    client.health()
    first, second = script.requests
    assert str(first.url) == "http://gateway.test/attnserve/healthz"
    assert first.headers["Authorization"] == "Bearer s3cret" and first.headers["Accept"] == "application/json"
    assert first.headers["User-Agent"].startswith("attnserve-client/")
    assert first.headers["X-Request-ID"] != second.headers["X-Request-ID"]
    assert first.extensions["timeout"] == {"connect": 4.0, "read": 4.0, "write": 4.0, "pool": 4.0}


def test_a_deadline_is_sent_as_x_request_timeout_only_when_set(make_client, monkeypatch):
    for var in ENV:
        monkeypatch.delenv(var, raising=False)
    script = Script(OK, OK, OK)
    make_client(script).health()
    make_client(script, deadline=2.5).health()
    monkeypatch.setenv("ATTNSERVE_DEADLINE", "0.25")
    make_client(script).health()
    assert [r.headers.get("X-Request-Timeout") for r in script.requests] == [None, "2.5", "0.25"]
    with pytest.raises(ValueError, match="deadline must be > 0"):
        make_client(Script(), deadline=0)


def test_classify_sends_multipart_file_parts_and_only_the_options_given(make_client):
    script = Script(CLASSIFIED)
    client = make_client(script)
    client.classify([b"first", b"second"], top_k=3, model="vit", return_attention=True, rollout_fusion="max")
    client.classify(b"only")
    full, plain = (_form(r) for r in script.requests)
    assert full == {
        "file": [b"first", b"second"],
        "top_k": [b"3"],
        "model": [b"vit"],
        "return_attention": [b"true"],
        "rollout_fusion": [b"max"],
    }
    assert plain == {"file": [b"only"], "top_k": [b"5"]}


def _form(request: httpx.Request) -> dict[str, list[bytes]]:
    """Parts of a multipart body by name (a minimal reader; the e2e tests use the real server's parser)."""
    boundary = request.headers["Content-Type"].split("boundary=")[1].encode()
    parts: dict[str, list[bytes]] = {}
    for chunk in request.content.split(b"--" + boundary)[1:-1]:
        head, _, body = chunk.strip(b"\r\n").partition(b"\r\n\r\n")
        name = head.split(b'name="')[1].split(b'"')[0].decode()
        parts.setdefault(name, []).append(body)
    return parts


@pytest.mark.parametrize(
    ("text", "options", "body"),
    [
        ("Open the file.", {}, {"text": "Open the file."}),
        (["One.", "Two."], {}, {"texts": ["One.", "Two."]}),
        (
            ("One.",),
            {
                "beam_size": 4,
                "num_return_sequences": 2,
                "max_new_tokens": 9,
                "length_penalty": 0.5,
                "model": "translator",
                "return_attention": True,
            },
            {
                "texts": ["One."],
                "beam_size": 4,
                "num_return_sequences": 2,
                "max_new_tokens": 9,
                "length_penalty": 0.5,
                "model": "translator",
                "return_attention": True,
            },
        ),
    ],
    ids=["one text", "a list", "every option"],
)
def test_translate_sends_json_with_only_the_options_given(make_client, text, options, body):
    script = Script(TRANSLATED)
    make_client(script).translate(text, **options)
    (request,) = script.requests
    assert request.headers["Content-Type"] == "application/json" and json.loads(request.content) == body


def test_a_stream_asks_for_server_sent_events(make_client):
    done = b'event: done\ndata: {"model": "translator", "version": "1", "results": []}\n\n'
    script = Script(httpx.Response(200, content=done))
    list(make_client(script).translate_stream("Open the file.", max_new_tokens=5))
    (request,) = script.requests
    assert request.headers["Accept"] == "text/event-stream"
    assert json.loads(request.content) == {"text": "Open the file.", "max_new_tokens": 5, "stream": True}


def test_server_sent_events_are_parsed_by_the_protocol_not_by_line_shapes(make_client):
    body = (
        ': a comment\r\nevent: token\r\ndata: {"index": 0, "token": "\u2581Sch", "text": "Sch\ufffd"}\r\n\r\n'
        'event: token\ndata: {"index": 1, "token": "\u00f6n", "text": "Sch\u00f6n"}\nid: 7\n\n'
        "event: unknown\ndata: {}\n\n"
        'event: done\ndata: {"model": "translator", "version": "1",\ndata:  "results": []}'
    )  # no final blank line
    events = list(make_client(Script(httpx.Response(200, content=body.encode()))).translate_stream("Nice."))
    assert [e.type for e in events] == ["token", "token", "done"]
    assert [e.delta for e in events[:2]] == ["Sch", "\u00f6n"]  # a character split over tokens shows once whole
    assert events[-1].response.model == "translator"


def test_attention_ids_are_quoted_and_only_given_options_sent(make_client):
    record = {"id": "a/b c", "model": "vit", "version": "1", "task": "image-classification", "maps": {}}
    script = Script(httpx.Response(200, json=record), httpx.Response(200, content=b"\x89PNG"))
    client = make_client(script)
    assert client.attention("a/b c", layer=0).id == "a/b c"
    assert client.attention_png("a/b c", kind="attention", head=2, fusion="max") == b"\x89PNG"
    maps, png = script.requests
    assert maps.url.raw_path == b"/attention/a%2Fb%20c?layer=0&format=json"
    assert png.url.raw_path == b"/attention/a%2Fb%20c.png?head=2&kind=attention&fusion=max"
    assert png.headers["Accept"] == "image/png"


@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_a_client_closes_its_own_connections_not_a_given_client(cls):
    import asyncio

    given = httpx.Client() if cls is Client else httpx.AsyncClient()

    async def use(client):
        async with client:
            pass

    for client in (cls(), cls(http_client=given)):
        if cls is Client:
            with client:
                pass
        else:
            asyncio.run(use(client))
        assert client._http.is_closed == (client._http is not given)
