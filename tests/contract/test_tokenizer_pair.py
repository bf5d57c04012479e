"""The manifest's second tokenizer kind, a SentencePiece pair numbered by one vocabulary (Marian's layout),
read by the same ``load_tokenizer`` as our own; torch-free, with SentencePiece models trained here."""

from __future__ import annotations

import io
import json

import pytest
import sentencepiece as spm

from contract.decoding import DecoderSpec
from contract.manifest import ManifestError, SpecialIds, TokenizerSpec, parse_manifest
from contract.tokenizer import SentencePiecePair, TokenizerError, load_tokenizer
from tests.contract.test_manifest import TRANSLATOR, raw

EN = ["Saves the current document.", "Open the file.", "Where is the nearest train station?", "Prints the sheet."]
DE = ["Speichert das aktuelle Dokument.", "Öffnen Sie die Datei.", "Wo ist der nächste Bahnhof?", "Druckt die Tabelle."]


def train(lines: list[str], size: int) -> bytes:
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines * 4),
        model_writer=buf,
        vocab_size=size,
        character_coverage=1.0,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return buf.getvalue()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """source.spm, target.spm and vocab.json as MarianTokenizer saves them: </s> 0, <unk> 1, <pad> last."""
    out = tmp_path_factory.mktemp("pair")
    (out / "source.spm").write_bytes(train(EN, 40))
    (out / "target.spm").write_bytes(train(DE, 45))
    vocab = {"</s>": 0, "<unk>": 1, ">>de<<": 2}
    for name in ("source.spm", "target.spm"):
        sp = spm.SentencePieceProcessor(model_file=str(out / name))
        for i in range(sp.get_piece_size()):
            if not (sp.is_control(i) or sp.is_unknown(i)):
                vocab.setdefault(sp.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    return out


def spec(folder, **changes) -> TokenizerSpec:
    vocab = json.loads((folder / "vocab.json").read_text())
    pad = vocab["<pad>"]
    section = {
        "library": "sentencepiece-pair",
        "source_file": "source.spm",
        "target_file": "target.spm",
        "vocab_file": "vocab.json",
        "special_ids": {"pad": pad, "eos": 0, "unk": 1, "decoder_start": pad},
        "vocab_size": len(vocab),
        "normalization": None,
    }
    return TokenizerSpec.model_validate(section | changes)


def test_the_pair_numbers_source_pieces_by_the_vocabulary_and_joins_target_pieces(folder):
    tok = load_tokenizer(folder, spec(folder))
    assert isinstance(tok, SentencePiecePair)
    vocab = json.loads((folder / "vocab.json").read_text())
    source = spm.SentencePieceProcessor(model_file=str(folder / "source.spm"))
    ids = tok.encode(">>de<< Open the file.", add_eos=True)
    pieces = source.encode("Open the file.", out_type=str)
    assert ids == [2, *(vocab.get(p, 1) for p in pieces), 0]  # the language code is one token, eos ends it
    assert tok.pieces(ids)[0] == ">>de<<" and tok.pieces(ids)[-1] == "</s>"
    target = spm.SentencePieceProcessor(model_file=str(folder / "target.spm"))
    german = [vocab[p] for p in target.encode("Öffnen Sie die Datei.", out_type=str)]
    assert tok.decode([*german, 0, vocab["<pad>"]]) == "Öffnen Sie die Datei."  # special ids dropped
    assert tok.encode("x</s>", add_eos=False)[-1] == 0  # a special token written in the text is that token


def test_a_marian_manifest_decodes_from_its_decoder_start():
    manifest = raw(TRANSLATOR)
    manifest["tokenizer"] = {
        "library": "sentencepiece-pair",
        "source_file": "source.spm",
        "target_file": "target.spm",
        "vocab_file": "vocab.json",
        "special_ids": {"pad": 95, "eos": 0, "unk": 1, "decoder_start": 95},
        "vocab_size": 96,
    }
    decoder = DecoderSpec.from_manifest(parse_manifest(manifest))
    assert (decoder.bos_id, decoder.pad_id, decoder.eos_id) == (95, 95, 0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"library": "sentencepiece-pair", "source_file": "s.spm", "target_file": "t.spm"}, "needs vocab_file"),
        ({"library": "sentencepiece", "file": None}, "needs file"),
        ({"special_ids": {"pad": 3, "eos": 0, "unk": 1}}, "needs bos or decoder_start"),
    ],
)
def test_a_tokenizer_section_without_what_its_kind_needs_is_refused(change, message):
    manifest = raw(TRANSLATOR)
    manifest["tokenizer"] = {**manifest["tokenizer"], **change}
    with pytest.raises(ManifestError, match=message):
        parse_manifest(manifest)


def test_a_vocabulary_that_disagrees_with_the_manifest_is_refused(folder):
    with pytest.raises(TokenizerError, match="the manifest says 7"):
        load_tokenizer(folder, spec(folder, vocab_size=7))
    assert SpecialIds(pad=3, eos=0, unk=1, decoder_start=3).start == 3
