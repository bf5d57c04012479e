"""Training pairs with placeholders: both sides' protected spans masked by the same sentinels.

A catalog string with a run-time placeholder (``Cannot open %s``) used to be left out whole, or had
its placeholder stripped; a translator then never sees one and breaks them. Where both sides carry the
same protected spans (``contract.placeholders.find_spans``, as a multiset of span texts), the pair is
kept with each span replaced by a sentinel of :data:`~contract.placeholders.TRAINING_SENTINELS`
(``⟦1⟧`` … ``⟦16⟧``, one SentencePiece piece each), the same sentinel for the same span on both sides:
the source is masked by ``contract.placeholders.mask`` (the service masks its input the same way), and
the k-th occurrence of a span text in the target gets the sentinel of its k-th occurrence in the source.
So the model learns to carry sentinels through, and the decoder (``contract/constraints.py``) to
place them. A pair whose sides carry different spans keeps the old treatment (left out or stripped).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from contract.placeholders import TRAINING_SENTINELS, TooManySpans, find_spans, mask

Pair = tuple[str, str]
_SENTINEL = re.compile("|".join(re.escape(s) for s in sorted(TRAINING_SENTINELS, key=len, reverse=True)))
_PERCENT_NAME = re.compile(r"%[A-Z][A-Za-z]{2}\w*")  # a capital and two letters: no printf (%LA, %I64d) or strftime
_HIDDEN = "\ufdd0"  # a noncharacter: stands for a set-aside %NAME while the rest is masked
_GLUED = re.compile(rf"(?<=[^\W_])(?={_SENTINEL.pattern})|(?<=\u27e7)(?=[^\W_]|{_SENTINEL.pattern})")


def span_texts(text: str) -> Counter:
    """The protected spans of ``text`` as a multiset of their texts."""
    return Counter(s.text for s in find_spans(text))


def mask_pair(source: str, target: str, pool: Sequence[str] = TRAINING_SENTINELS) -> Pair:
    """Both sides with their spans masked, the same sentinel for the same span (by text and occurrence).

    Raises ``ValueError`` when the sides carry different spans, or a side already holds a sentinel of
    ``pool``, and :class:`~contract.placeholders.TooManySpans` when there are more spans than sentinels."""
    if any(s in side for s in (*pool, _HIDDEN) for side in (source, target)):
        raise ValueError("a side already holds a sentinel")
    (source, source_names), (target, target_names) = _hide_names(source), _hide_names(target)
    if span_texts(source) != span_texts(target):
        raise ValueError("the two sides carry different protected spans")
    masked = mask(source, pool)
    sentinel: dict[tuple[str, int], str] = {}
    seen: Counter = Counter()
    for span, s in zip(masked.spans, masked.sentinels):
        sentinel[span.text, seen[span.text]] = s
        seen[span.text] += 1
    order, seen = [], Counter()
    for span in find_spans(target):
        order.append(sentinel[span.text, seen[span.text]])
        seen[span.text] += 1
    target_masked = mask(target, order).text  # the target holds no sentinel: its k-th span gets order[k]
    return _show_names(masked.text, source_names), _show_names(target_masked, target_names)


def _hide_names(text: str) -> tuple[str, list[str]]:
    """``text`` with its ``%NAME`` placeholders set aside: LibreOffice's names (``%PRODUCTNAME``,
    ``%LANGUAGENAME``, ``%Value``) keep the old treatment, and their first letters are no printf or
    strftime conversion (``%LA``, ``%V``)."""
    return _PERCENT_NAME.sub(_HIDDEN, text), _PERCENT_NAME.findall(text)


def _show_names(text: str, names: list[str]) -> str:
    back = iter(names)
    return re.sub(_HIDDEN, lambda _: next(back), text)


def protect_pair(source: str, target: str, pool: Sequence[str] = TRAINING_SENTINELS) -> Pair | None:
    """:func:`mask_pair` where both sides carry the same (one or more) spans and they fit ``pool``, else None."""
    if not find_spans(source):
        return None
    try:
        masked = mask_pair(source, target, pool)
    except (ValueError, TooManySpans):
        return None
    return masked if masked != (source, target) else None


def protect_entries(entries: list[tuple[str, str]], pool: Sequence[str] = TRAINING_SENTINELS) -> list[tuple[str, str]]:
    """Catalog entries ``(msgid, msgstr)`` with each form masked against its translation where their spans
    agree: ``context\x04singular\x00plural`` with ``msgstr[0]\x00msgstr[1]``, the forms
    ``sources.ui_message_pairs`` pairs (a language's further forms are not read)."""
    out = []
    for msgid, msgstr in entries:
        context, sep, ids = msgid.rpartition("\x04")
        forms, translated = ids.split("\x00"), msgstr.split("\x00")
        for i, (en, de) in enumerate(zip(forms, translated)):
            if en and de and (masked := protect_pair(en, de, pool)):
                forms[i], translated[i] = masked
        out.append((context + sep + "\x00".join(forms), "\x00".join(translated)))
    return out


def sentinels(text: str) -> list[str]:
    """The training sentinels in ``text``, in order."""
    return _SENTINEL.findall(text)


def sentinels_agree(source: str, target: str) -> bool:
    """Both sides hold the same sentinels, each once: after sentence splitting and cleaning, a pair whose
    sentinels went to different sentences (or were cut with a URL) would teach dropping or inventing one."""
    found = sentinels(source)
    return len(set(found)) == len(found) and Counter(found) == Counter(sentinels(target))


def renumber(source: str, target: str, pool: Sequence[str] = TRAINING_SENTINELS) -> Pair:
    """The sentinels renamed so that the source uses ``pool`` in order from the first, as masking at
    serving time does (a sentence cut from a longer text may start at ``⟦3⟧``)."""
    rename = {s: pool[i] for i, s in enumerate(sentinels(source))}
    if all(k == v for k, v in rename.items()):
        return source, target
    return tuple(_SENTINEL.sub(lambda m: rename.get(m.group(), m.group()), side) for side in (source, target))


def space_sentinels(text: str) -> str:
    """A space between a sentinel and a letter, digit or sentinel it touches, as ``mask`` writes it (a
    reader's markup rewriting, ``<header>text='Units'</header>``, may have glued one to a word)."""
    return _GLUED.sub(" ", text)
