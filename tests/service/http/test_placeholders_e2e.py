"""Placeholders and long texts through ``POST /translate`` on a real uvicorn server serving the shipped models.

What a localiser relies on: every placeholder, tag, entity and escape of a software string comes back
exactly once, whatever the decoding (greedy, beam, n-best, streaming); a text of several sentences
comes back as one translation with its sentences reported and one attention id; a sentence cut at the
length limit is reported; what cannot be protected is refused with a JSON error.
"""

from __future__ import annotations

import json
from collections import Counter

import httpx
import pytest

from contract.placeholders import find_spans
from tests.conftest import ROOT
from tests.service.service_testing import serving

SHIPPED = ROOT / "models"
STRINGS = (ROOT / "benchmarks" / "placeholder_sentences.txt").read_text().splitlines()
LONG = "Could not open file %s. Check that the file exists.\nDeleted %d files in <b>%s</b>."


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("placeholders"), SHIPPED, max_texts_per_request="64") as srv:
        yield srv


def post(server, **body) -> httpx.Response:
    return httpx.post(server.url + "/translate", json=body, timeout=120)


def spans(text: str) -> Counter:
    return Counter(s.text for s in find_spans(text))


@pytest.mark.parametrize("beam", [1, 4])
def test_every_placeholder_of_real_software_strings_comes_back_exactly_once(server, beam):
    results = post(server, texts=STRINGS, beam_size=beam).json()["results"]
    for source, r in zip(STRINGS, results):
        assert spans(r["translation"]) == spans(source), (source, r["translation"])
        assert [p["text"] for p in r["placeholders"]] == [s.text for s in find_spans(source)]
        assert all(p["restored"] for p in r["placeholders"])
        assert "%n" not in r["translation"]


def test_every_hypothesis_of_the_nbest_list_keeps_them(server):
    results = post(server, texts=STRINGS[:8], beam_size=4, num_return_sequences=3).json()["results"]
    for source, r in zip(STRINGS, results):
        assert len(r["nbest"]) == 3 and r["nbest"][0]["translation"] == r["translation"]
        assert all(spans(h["translation"]) == spans(source) for h in r["nbest"])


def test_unprotected_the_text_goes_to_the_model_as_it_is(server):
    (r,) = post(server, text=STRINGS[1], beam_size=4, protect_placeholders=False).json()["results"]
    assert r["placeholders"] == [] and "%" in "".join(r["source_tokens"])  # the model sees the % itself


def test_several_sentences_decode_as_rows_of_one_batch_and_join_back(server):
    (r,) = post(server, text=LONG, beam_size=4, return_attention=True).json()["results"]
    assert [s["source"] for s in r["sentences"]] == [
        "Could not open file %s.",
        "Check that the file exists.",
        "Deleted %d files in %s.",  # the text each sentence's search translated: markup is taken out
    ]
    first, second, third = (s["translation"] for s in r["sentences"])
    assert r["translation"] == f"{first} {second}\n{third}"  # the whitespace between sentences is kept
    assert spans(r["translation"]) == spans(LONG) and r["finished"]
    maps = httpx.get(f"{server.url}/attention/{r['attention_id']}").json()
    assert maps["source_tokens"] == r["source_tokens"] and maps["source_tokens"].count("</s>") == 3
    assert len(r["attention"]["alignment"][0]) == len(r["source_tokens"])


def test_a_sentence_cut_at_the_length_limit_is_reported_with_its_placeholders_placed(server):
    (r,) = post(server, text="Could not read the configuration file %s: %s", max_new_tokens=3).json()["results"]
    assert r["finished"] is False and r["sentences"][0]["finished"] is False
    assert spans(r["translation"]) == Counter({"%s": 2})


def test_the_stream_shows_the_placeholders_and_ends_with_the_plain_answer(server):
    plain = post(server, text=LONG, beam_size=1).json()
    events = []
    with httpx.stream("POST", server.url + "/translate", json={"text": LONG, "stream": True}, timeout=60) as r:
        kind = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                events.append((kind, json.loads(line[6:])))
    tokens = [data for kind, data in events if kind == "token"]
    assert events[-1] == ("done", plain)
    assert [t["index"] for t in tokens] == list(range(len(tokens)))
    assert [t["token"] for t in tokens] == plain["results"][0]["target_tokens"]
    # the tokens show the text as decoded; the markup taken out of it is back in the final answer
    assert tokens[-1]["text"] == plain["results"][0]["translation"].replace("<b>", "").replace("</b>", "")
    assert "<b>%s</b>" in plain["results"][0]["translation"]
    assert any("%s" in t["token"] for t in tokens)


def test_the_accelerator_is_kept(server):
    (r,) = post(server, text="Save &As...").json()["results"]
    assert r["translation"].count("&") == 1


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"text": " ".join(["%s"] * 30)}, "protected spans"),
        ({"text": "Copy %s to %s.", "max_new_tokens": 2}, "leaves no room for the 2 placeholders"),
    ],
)
def test_what_cannot_be_protected_is_refused(server, body, message):
    r = post(server, **body)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_field"
    assert message in r.json()["error"]["message"]
