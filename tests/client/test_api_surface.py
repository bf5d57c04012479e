"""``Client`` and ``AsyncClient`` are the same API: the same public methods with the same signatures.

A method added to one and forgotten in the other, or a parameter that differs, fails here.
"""

from __future__ import annotations

import inspect

from attnserve_client import AsyncClient, Client


def public_methods(cls) -> dict[str, object]:
    return {name: m for name, m in inspect.getmembers(cls, inspect.isfunction) if not name.startswith("_")}


def as_sync(annotation: str) -> str:
    """The sync spelling of an async client's annotation (``AsyncTranslationStream`` -> ``TranslationStream``)."""
    return annotation.replace("httpx.AsyncClient", "httpx.Client").replace(
        "AsyncTranslationStream", "TranslationStream"
    )


def test_both_clients_have_the_same_public_methods_and_signatures():
    sync, async_ = public_methods(Client), public_methods(AsyncClient)
    assert sorted(sync) == sorted(async_)
    assert {
        "classify",
        "translate",
        "translate_stream",
        "attention",
        "attention_png",
        "models",
        "health",
        "ready",
        "close",
    } <= set(sync)
    for name in [*sync, "__init__"]:
        s, a = inspect.signature(getattr(Client, name)), inspect.signature(getattr(AsyncClient, name))
        assert [(p.name, p.kind, p.default, as_sync(str(p.annotation))) for p in a.parameters.values()] == [
            (p.name, p.kind, p.default, str(p.annotation)) for p in s.parameters.values()
        ], name
        assert as_sync(str(a.return_annotation)) == str(s.return_annotation), name


def test_async_methods_are_coroutines_and_documented_like_their_twins():
    for name, method in public_methods(AsyncClient).items():
        assert inspect.iscoroutinefunction(method), name
        assert method.__doc__ == getattr(Client, name).__doc__, name
    assert all(m.__doc__ for m in public_methods(Client).values())


def test_constructor_arguments_are_keyword_only():
    for cls in (Client, AsyncClient):
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        assert [p.name for p in params] == ["base_url", "api_key", "timeout", "max_retries", "deadline", "http_client"]
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)
    assert hasattr(Client, "__enter__") and hasattr(AsyncClient, "__aenter__")
