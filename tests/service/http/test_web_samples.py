"""Which translation examples the web page offers: a mix of what the model translates well and badly."""

from __future__ import annotations

from service.http.routes.web import MAX_SAMPLE_TEXTS, sample_texts


def examples(*qualities: str | None) -> list[dict]:
    return [{"source": f"Sentence {i}.", **({"quality": q} if q else {})} for i, q in enumerate(qualities)]


def test_unmarked_examples_are_offered_in_order():
    assert sample_texts(examples(*[None] * 12)) == examples(*[None] * 12)[:MAX_SAMPLE_TEXTS]


def test_as_many_bad_as_good_where_both_exist():
    chosen = sample_texts(examples(*["good"] * 10, *["poor"] * 10))
    assert [e["quality"] for e in chosen] == ["good"] * 4 + ["poor"] * 4


def test_fair_ones_fill_in_after_the_good_and_a_short_side_leaves_room_to_the_other():
    chosen = sample_texts(examples("poor", "fair", "good", *["poor"] * 9))
    assert [e["quality"] for e in chosen] == ["good", "fair"] + ["poor"] * 6
    chosen = sample_texts(examples(*["good"] * 10, "poor"))
    assert [e["quality"] for e in chosen] == ["good"] * 7 + ["poor"]
