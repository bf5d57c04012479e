"""Per-domain scoring of an exported translator: domain files, pooling, example choice and the figures."""

from __future__ import annotations

import pytest

from export.scoring import ScoringError, domain_groups, evaluate, pick_examples, read_domains

PAIRS = [(f"Sentence number {i} is here.", f"Satz Nummer {i} ist hier.") for i in range(30)]
DOMAINS = ["ding"] * 10 + ["help"] * 12 + ["tuxpaint"] * 3 + ["wesnoth"] * 5


def test_read_domains(tmp_path):
    assert read_domains(tmp_path, "test", 3) == ["all", "all", "all"]  # a corpus built without domains
    (tmp_path / "test.domains").write_text("ding\nhelp\nui\n", encoding="utf-8")
    assert read_domains(tmp_path, "test", 3) == ["ding", "help", "ui"]
    with pytest.raises(ScoringError, match="has 3 lines for 4 pairs"):
        read_domains(tmp_path, "test", 4)


def test_everyday_pools_the_dictionary_and_the_stamps():
    groups = domain_groups(DOMAINS)
    assert list(groups) == ["ding", "everyday", "help", "tuxpaint", "wesnoth"]
    assert groups["everyday"] == list(range(10)) + [22, 23, 24]
    assert "everyday" not in domain_groups(["help", "ui"])


def test_examples_spread_over_the_domains_and_skip_long_sentences():
    long_pairs = list(PAIRS)
    long_pairs[0] = (" ".join(["word"] * 30), "lang")
    chosen = pick_examples(long_pairs, DOMAINS, count=8)
    assert len(chosen) == 8 and 0 not in chosen and chosen == sorted(set(chosen))
    assert sorted({DOMAINS[i] for i in chosen}) == ["ding", "help", "tuxpaint", "wesnoth"]
    assert len(pick_examples(PAIRS, DOMAINS, count=100)) == 30  # never more than there are


def test_evaluate_scores_each_domain_from_the_same_translations():
    def translate(sources: list[str], beam: int) -> tuple[list[str], float]:
        refs = dict(PAIRS)
        # perfect on everything but the help domain, which gets the source copied
        return [refs[s] if DOMAINS[i] != "help" else s for i, s in enumerate(sources)], 0.01 * beam

    result = evaluate(translate, PAIRS, DOMAINS, beam=4)
    assert result["domains"]["ding"]["greedy"]["bleu"] == 100 == result["domains"]["everyday"]["beam4"]["bleu"]
    assert result["domains"]["help"]["beam4"]["bleu"] < 20 and result["domains"]["help"]["sentences"] == 12
    assert 20 < result["greedy"]["bleu"] < 100 and result["beam4"]["beam"] == 4
    assert result["copy_source"]["bleu"] < 20 and len(result["examples"]) == 20
    assert {"domain", "source", "reference", "greedy", "beam4", "chrf", "quality"} <= set(result["examples"][0])
    marks = {e["domain"]: e["quality"] for e in result["examples"]}
    assert marks["ding"] == "good" and marks["help"] == "poor"  # the copied source is far from its reference
    assert all(e["chrf"] == 100 for e in result["examples"] if e["domain"] != "help")
    assert result["signatures"]["chrf"].startswith("nrefs:1|")
