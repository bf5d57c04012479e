"""The near-duplicate-aware split: what links two sentences, and that a group never spans two splits."""

from __future__ import annotations

import random

import pytest

from model.translation.split import SPLITS, assign_splits, group_sentences, mask


def test_mask_folds_case_drops_punctuation_and_masks_digits_and_names():
    assert mask("Open Tools - Options, then click OK 2 times.") == (
        "open",
        "N",
        "N",
        "then",
        "click",
        "N",
        "0",
        "times",
    )
    assert mask("Choose Format - Character.") == mask("Choose Edit - Paste") == ("choose", "N", "N")
    assert mask("Page 12 of 30") == ("page", "00", "of", "00")


@pytest.mark.parametrize(
    "a, b",
    [
        ("Click here to open the dialog box.", "Click here to close the dialog box."),  # a word replaced
        ("Click here to open the dialog box.", "Click here to open the new dialog box."),  # a word added
        ("Click here to open the dialog box.", "Click here to open dialog box."),  # a word left out
        ("Choose Format - Character.", "Choose Insert - Section..."),  # names masked
        ("Delete rows 1 to 10.", "Delete rows 20 to 99!"),  # digits masked, punctuation dropped
    ],
)
def test_near_duplicates_share_a_group(a, b):
    groups = group_sentences([a, "Something else entirely here, for contrast.", b])
    assert groups[0] == groups[2] != groups[1]


@pytest.mark.parametrize(
    "a, b",
    [
        ("Open the file.", "Close the file."),  # short sentences: one word apart is not near-duplicate
        ("Click here to open the dialog box.", "Click there to close the dialog window."),  # three words apart
        ("My sister lives in Berlin.", "Where is the nearest train station?"),
    ],
)
def test_different_sentences_stay_apart(a, b):
    groups = group_sentences([a, b])
    assert groups[0] != groups[1]


def test_links_are_transitive():
    chain = [
        "Select the cells you want to copy.",
        "Select the cells you want to move.",
        "Select the rows you want to move.",
    ]
    assert len(set(group_sentences(chain))) == 1


def corpus(n: int = 3000) -> list[str]:
    rng = random.Random(1)
    words = [
        "apple",
        "house",
        "river",
        "stone",
        "green",
        "quick",
        "window",
        "table",
        "light",
        "paper",
        "music",
        "forest",
        "letter",
        "bridge",
    ]
    out = []
    for i in range(n):
        out.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))).capitalize() + ".")
        if i % 5 == 0:  # a near-duplicate of it, one word replaced
            w = out[-1].rstrip(".").split()
            w[rng.randrange(len(w))] = "changed"
            out.append(" ".join(w) + ".")
    return out


def test_no_group_spans_two_splits_and_every_split_gets_some():
    sources = corpus()
    splits, stats = assign_splits(sources, 0.1, 0.1, max_group=10_000)
    where: dict[int, set[str]] = {}
    for g, split in zip(group_sentences(sources), splits):
        where.setdefault(g, set()).add(split)
    assert all(len(s) == 1 for s in where.values())
    assert set(splits) == set(SPLITS)
    assert stats["groups"] == len(where) < len(sources)
    assert 0.05 < splits.count("test") / len(sources) < 0.15


def test_split_does_not_depend_on_order():
    sources = corpus(1000)
    splits, _ = assign_splits(sources, 0.1, 0.1, max_group=10_000)
    order = list(range(len(sources)))
    random.Random(7).shuffle(order)
    shuffled, _ = assign_splits([sources[i] for i in order], 0.1, 0.1, max_group=10_000)
    assert [splits[i] for i in order] == shuffled


def test_groups_over_max_group_go_to_train():
    family = [f"Choose Format {name} - Character." for name in ("Bold", "Italic", "Under", "Over", "Strike", "Small")]
    splits, stats = assign_splits(family, 0.5, 0.49, max_group=5)
    assert splits == ["train"] * 6 and stats["in_groups_over_max"] == 6 and stats["largest_group"] == 6


def test_case_spacing_and_punctuation_variants_share_the_split():
    rng = random.Random(3)
    words = [
        "apple",
        "house",
        "river",
        "stone",
        "green",
        "quick",
        "window",
        "table",
        "light",
        "paper",
        "music",
        "forest",
        "letter",
        "bridge",
    ]
    english = [" ".join(rng.choice(words) for _ in range(4)).capitalize() + "." for _ in range(2000)]
    variants = [s.upper().rstrip(".") + "!" for s in english] + [s.title() for s in english]
    splits, _ = assign_splits(english + variants, 0.1, 0.1, max_group=10_000)
    n = len(english)
    assert splits[:n] == splits[n : 2 * n] == splits[2 * n :]
