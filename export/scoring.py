"""How an exported translator is scored: BLEU and chrF per source domain and overall, on the held-out test split.

The corpus builder writes ``test.domains`` beside ``test.tsv`` (the source of each pair: ``ding``,
``help``, ``ui``, ``wesnoth``, ...). Every figure is sacrebleu's corpus BLEU and chrF with default
settings, whose signatures go in the manifest with them. ``everyday`` pools the domains of plain
everyday sentences (the dictionary's examples and the stamp descriptions), the text a visitor tries
first. A corpus without domains (a user's own TSV) is one domain, ``all``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import sacrebleu

EVERYDAY = ("ding", "tuxpaint")
EXAMPLES = 20  # fixed example translations in the manifest, spread over the domains
EXAMPLE_MAX_WORDS = 16  # examples are read by people: short sentences
# An example's beam-search translation against its reference, by sentence chrF: what the web page
# marks it as, so that a visitor sees what the model does well and badly, not only its best.
GOOD_CHRF, POOR_CHRF = 60.0, 35.0


def quality(chrf: float) -> str:
    return "good" if chrf >= GOOD_CHRF else "poor" if chrf < POOR_CHRF else "fair"


class ScoringError(ValueError):
    """The domains file does not match the test split."""


def read_domains(data: Path, split: str, pairs: int) -> list[str]:
    """The source domain of each pair of ``<split>.tsv`` (``all`` for a corpus built without domains)."""
    path = Path(data) / f"{split}.domains"
    if not path.is_file():
        return ["all"] * pairs
    domains = path.read_text(encoding="utf-8").splitlines()
    if len(domains) != pairs:
        raise ScoringError(f"{path} has {len(domains)} lines for {pairs} pairs: rebuild the corpus")
    return domains


METRICS = {"bleu": sacrebleu.BLEU(), "chrf": sacrebleu.CHRF()}  # default settings, as corpus_bleu/corpus_chrf


def score(hyps: Sequence[str], refs: Sequence[str]) -> dict:
    return {name: round(m.corpus_score(list(hyps), [list(refs)]).score, 2) for name, m in METRICS.items()}


def signatures() -> dict[str, str]:
    """sacrebleu's signatures of the metrics (valid once a score was computed: they name the reference count)."""
    return {name: str(m.get_signature()) for name, m in METRICS.items()}


def domain_groups(domains: Sequence[str]) -> dict[str, list[int]]:
    """Pair indices of each domain, plus ``everyday`` when one of its domains is present."""
    groups: dict[str, list[int]] = {}
    for i, d in enumerate(domains):
        groups.setdefault(d, []).append(i)
    everyday = sorted(i for d in EVERYDAY for i in groups.get(d, []))
    if everyday:
        groups["everyday"] = everyday
    return dict(sorted(groups.items()))


def pick_examples(pairs: Sequence[tuple[str, str]], domains: Sequence[str], count: int = EXAMPLES) -> list[int]:
    """``count`` test pairs shared out evenly over the domains (a small domain's unused share goes to the
    others), evenly spaced within each; short sentences only."""
    pools = {
        d: [i for i in idx if len(pairs[i][0].split()) <= EXAMPLE_MAX_WORDS]
        for d, idx in domain_groups(domains).items()
        if d != "everyday"
    }
    share = dict.fromkeys(pools, 0)
    open_ = [d for d in pools if pools[d]]
    left = count
    while left and open_:
        each = max(1, left // len(open_))
        for d in list(open_):
            take = min(each, len(pools[d]) - share[d], left)
            share[d], left = share[d] + take, left - take
            if share[d] == len(pools[d]):
                open_.remove(d)
            if not left:
                break
    chosen = [pool[j * len(pool) // share[d]] for d, pool in pools.items() for j in range(share[d])]
    return sorted(chosen)


Translate = Callable[[list[str], int], tuple[list[str], float]]  # (sources, beam) -> (translations, seconds)


def evaluate(translate: Translate, pairs: Sequence[tuple[str, str]], domains: Sequence[str], beam: int) -> dict:
    """Greedy and beam-``beam`` scores overall and per domain, the copy baseline, and fixed examples."""
    sources, refs = [s for s, _ in pairs], [t for _, t in pairs]
    result: dict = {"split": "test", "sentences": len(pairs), "copy_source": score(sources, refs)}
    hyps: dict[str, list[str]] = {}
    for name, b in (("greedy", 1), (f"beam{beam}", beam)):
        hyps[name], seconds = translate(sources, b)
        result[name] = {**score(hyps[name], refs), "seconds": round(seconds, 1), "beam": b}
    result["domains"] = {
        d: {
            "sentences": len(idx),
            **{name: score([h[i] for i in idx], [refs[i] for i in idx]) for name, h in hyps.items()},
        }
        for d, idx in domain_groups(domains).items()
    }
    best = f"beam{beam}"
    result["examples"] = []
    for i in pick_examples(pairs, domains):
        chrf = round(sacrebleu.sentence_chrf(hyps[best][i], [refs[i]]).score, 1)
        result["examples"].append(
            {
                "domain": domains[i],
                "source": sources[i],
                "reference": refs[i],
                **{name: h[i] for name, h in hyps.items()},
                "chrf": chrf,
                "quality": quality(chrf),
            }
        )
    result["sacrebleu"] = sacrebleu.__version__
    result["signatures"] = signatures()
    return result
