"""The translator's subword tokenizer: one SentencePiece model shared by training, export and serving.

It lives in the contract package and imports only ``sentencepiece``, so that training, export and
the torch-free service load the very same class. ``model/translation/tokenizer.py`` trains it.

Round trip: ``decode(encode(text)) == normalize_text(text)`` for every string. Two choices make that
hold: the model is trained with SentencePiece's ``identity`` normalisation (so SentencePiece changes
no character: the NFKC of its default ``nmt_nfkc`` rule would turn ``…`` into ``...`` and ``²`` into
``2``), and with byte fallback (a character never seen in training becomes its UTF-8 bytes, not
``<unk>``). The only normalisation is :func:`normalize_text`, the same function the corpus builder
applies as its last cleaning step, so training text and served text are normalised alike.

An imported translator (``export/huggingface.py``: Marian / OPUS-MT) brings its own tokenizer
instead, described by its manifest: :class:`SentencePiecePair`, a source and a target SentencePiece
model whose pieces are numbered by one JSON vocabulary. :func:`load_tokenizer` reads either kind.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import sentencepiece as spm

if TYPE_CHECKING:
    from contract.manifest import TokenizerSpec

# Fixed ids, recorded in every manifest: the model's embedding rows and the decoder's stop rule rely on them.
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3

_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'"})
_INVISIBLE = re.compile("[\u00ad\u200b\u200c\u200d\u2060\ufeff]")  # soft hyphen, zero-width (non-)joiners, BOM


def normalize_text(text: str) -> str:
    """The one normalisation that training and serving share.

    Unicode NFC (a composed ``ä`` and ``a`` + combining diaeresis become the same token), typographic
    apostrophes to ``'`` (the dictionary mixes both; users type ``'``), invisible characters
    removed, control characters and every run of whitespace (tabs, newlines, no-break spaces)
    collapsed to one space, ends stripped. A corpus line therefore never holds a tab or newline.
    """
    text = unicodedata.normalize("NFC", text).translate(_APOSTROPHES)
    text = _INVISIBLE.sub("", text)
    text = "".join(" " if unicodedata.category(c) == "Cc" else c for c in text)
    return " ".join(text.split())


class TokenizerError(RuntimeError):
    """A tokenizer model file is missing, unreadable, or does not use the fixed special ids."""


@dataclass(frozen=True)
class SpecialIds:
    pad: int = PAD_ID
    bos: int = BOS_ID
    eos: int = EOS_ID
    unk: int = UNK_ID

    def as_dict(self) -> dict[str, int]:
        return {"pad": self.pad, "bos": self.bos, "eos": self.eos, "unk": self.unk}


class _SpecialIdAccess:
    """What both tokenizers share: the special ids by name, and ``encode`` as a batch of one."""

    special: SpecialIds

    @property
    def pad_id(self) -> int:
        return self.special.pad

    @property
    def eos_id(self) -> int:
        return self.special.eos

    @property
    def unk_id(self) -> int:
        return self.special.unk

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Normalise (:func:`normalize_text`) then split into subword ids, optionally framed by bos/eos."""
        return self.encode_batch([text], add_bos=add_bos, add_eos=add_eos)[0]

    def encode_batch(self, texts: Sequence[str], *, add_bos: bool = False, add_eos: bool = False) -> list[list[int]]:
        raise NotImplementedError


class Tokenizer(_SpecialIdAccess):
    """A SentencePiece model with the project's special ids and normalisation.

    Build it with :meth:`load` (a ``.model`` file) or :meth:`from_bytes` (the serialized model, as
    the trainer produces it). Ids are plain ``list[int]``; callers add padding themselves.
    """

    def __init__(self, processor: spm.SentencePieceProcessor) -> None:
        self._sp = processor
        self.special = SpecialIds()
        found = SpecialIds(processor.pad_id(), processor.bos_id(), processor.eos_id(), processor.unk_id())
        if found != self.special:
            raise TokenizerError(f"tokenizer special ids {found.as_dict()} differ from {self.special.as_dict()}")

    @classmethod
    def from_bytes(cls, model_proto: bytes) -> Tokenizer:
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(model_proto)
        except (RuntimeError, OSError) as e:
            raise TokenizerError(f"not a SentencePiece model: {e}") from e
        return cls(processor)

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as e:
            raise TokenizerError(f"cannot read tokenizer model {path}: {e.strerror or e}") from e
        return cls.from_bytes(data)

    def save(self, path: str | Path) -> Path:
        """Write the ``.model`` file (the serialized protobuf, self-contained: vocabulary and settings)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.to_bytes())
        return path

    def to_bytes(self) -> bytes:
        return self._sp.serialized_model_proto()

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def bos_id(self) -> int:
        return self.special.bos

    def encode_batch(self, texts: Sequence[str], *, add_bos: bool = False, add_eos: bool = False) -> list[list[int]]:
        """:meth:`encode` for many texts. One SentencePiece call per text: its list call starts a thread pool
        every time (0.3 ms against 5 µs a sentence on 2 vCPUs), which a request pays on the event loop."""
        batch = [self._sp.encode(normalize_text(t), out_type=int) for t in texts]
        head = [self.bos_id] if add_bos else []
        tail = [self.eos_id] if add_eos else []
        return [head + ids + tail for ids in batch]

    def decode(self, ids: Iterable[int]) -> str:
        """Ids back to text; pad/bos/eos are dropped, so a decoder's raw output can be passed as is."""
        control = (self.pad_id, self.bos_id, self.eos_id)
        return self._sp.decode([int(i) for i in ids if int(i) not in control])

    def pieces(self, ids: Iterable[int]) -> list[str]:
        """The subword string of each id (``▁`` marks a word start): labels for attention maps."""
        return [self._sp.id_to_piece(int(i)) for i in ids]

    def piece_to_id(self, piece: str) -> int:
        return self._sp.piece_to_id(piece)


NORMALIZE_TEXT = "contract.tokenizer.normalize_text"  # the manifest's name for normalize_text
_LANGUAGE_CODE = re.compile(r"^>>[^<>]*<<")  # a leading ">>de<<": one token, not split by SentencePiece


class SentencePiecePair(_SpecialIdAccess):
    """Marian's tokenizer layout: source text is split by the source model, the target's pieces are
    joined by the target model, and the pieces of both sides are numbered by one vocabulary (a JSON
    ``{piece: id}``), not by the models' own ids.

    It encodes and decodes as transformers' ``MarianTokenizer`` does (the importer checks it on real
    sentences): a leading ``>>xx<<`` language code is one token, a piece the vocabulary lacks is
    ``unk``, ``eos`` ends every source; decoding drops the special ids and lets the target model join
    the rest. Normalisation is SentencePiece's own unless the manifest names :func:`normalize_text`.
    """

    def __init__(
        self,
        source: spm.SentencePieceProcessor,
        target: spm.SentencePieceProcessor,
        vocab: dict[str, int],
        special: SpecialIds,
        normalize: bool = False,
    ) -> None:
        self._source, self._target, self._vocab = source, target, vocab
        self._pieces = {i: piece for piece, i in vocab.items()}
        self.special = special
        self._normalize = normalize
        self._skipped = {special.pad, special.bos, special.eos, special.unk}
        self._special_pieces = {self._pieces[i] for i in self._skipped if i in self._pieces}
        self._specials = re.compile("(" + "|".join(map(re.escape, sorted(self._special_pieces))) + ")")

    @classmethod
    def load(
        cls, source: Path, target: Path, vocab: Path, special: SpecialIds, normalize: bool = False
    ) -> SentencePiecePair:
        models = []
        for path in (source, target):
            processor = spm.SentencePieceProcessor()
            try:
                processor.LoadFromSerializedProto(Path(path).read_bytes())
            except (RuntimeError, OSError) as e:
                raise TokenizerError(f"cannot read SentencePiece model {path}: {e}") from e
            models.append(processor)
        try:
            mapping = json.loads(Path(vocab).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise TokenizerError(f"cannot read vocabulary {vocab}: {e}") from e
        if not isinstance(mapping, dict) or not all(isinstance(i, int) for i in mapping.values()):
            raise TokenizerError(f"{vocab}: not a JSON object of piece -> id")
        ids = set(mapping.values())
        if len(ids) != len(mapping) or ids != set(range(len(ids))):
            raise TokenizerError(f"{vocab}: ids are not 0..{len(mapping) - 1}, each once")
        return cls(models[0], models[1], mapping, special, normalize)

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    def encode_batch(self, texts: Sequence[str], *, add_bos: bool = False, add_eos: bool = False) -> list[list[int]]:
        """Source texts to ids (``add_bos`` is accepted for the common interface; Marian has no bos)."""
        out = []
        for text in texts:
            text = normalize_text(text) if self._normalize else text
            ids = []
            for part in self._specials.split(text):  # a special token written in the text is that token
                if part in self._special_pieces:
                    ids.append(self._vocab[part])
                elif part:
                    code = _LANGUAGE_CODE.match(part)
                    pieces = [code.group()] if code else []
                    pieces += self._source.encode(part[code.end() :] if code else part, out_type=str)
                    ids += [self._vocab.get(p, self.special.unk) for p in pieces]
            out.append(ids + ([self.special.eos] if add_eos else []))
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """Target ids back to text: special ids are dropped, the target model joins the pieces."""
        pieces = [self._pieces.get(int(i), "") for i in ids if int(i) not in self._skipped]
        return self._target.decode_pieces([p for p in pieces if p]).replace("\u2581", " ").strip()

    def pieces(self, ids: Iterable[int]) -> list[str]:
        """The vocabulary's piece of each id: labels for attention maps."""
        return [self._pieces.get(int(i), "<unk>") for i in ids]

    def piece_to_id(self, piece: str) -> int:
        return self._vocab.get(piece, self.special.unk)


def load_tokenizer(folder: Path, spec: TokenizerSpec) -> Tokenizer | SentencePiecePair:
    """The tokenizer a translation entry's manifest describes, checked against its special ids."""
    folder = Path(folder)
    ids = spec.special_ids
    if spec.library == "sentencepiece":
        tok = Tokenizer.load(folder / str(spec.file))
        if ids.bos is None or tok.special != SpecialIds(ids.pad, ids.bos, ids.eos, ids.unk):
            raise TokenizerError(f"tokenizer special ids {tok.special.as_dict()} differ from the manifest's")
        return tok
    special = SpecialIds(ids.pad, ids.start if ids.bos is None else ids.bos, ids.eos, ids.unk)
    pair = SentencePiecePair.load(
        folder / str(spec.source_file),
        folder / str(spec.target_file),
        folder / str(spec.vocab_file),
        special,
        normalize=spec.normalization == NORMALIZE_TEXT,
    )
    if pair.vocab_size != spec.vocab_size:
        raise TokenizerError(f"the vocabulary holds {pair.vocab_size} pieces, the manifest says {spec.vocab_size}")
    if max(ids.pad, ids.eos, ids.unk, ids.start) >= pair.vocab_size:
        raise TokenizerError(f"special ids {ids.model_dump()} are outside the vocabulary of {pair.vocab_size}")
    return pair
