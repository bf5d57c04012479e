"""``python -m export.evaluate_placeholders`` on the shipped translator: both modes, one table, one JSON."""

from __future__ import annotations

import json

import pytest

from export import evaluate_placeholders
from model.cli import CliError
from model.translation.textio import write_tsv
from tests.ci import needs_tool
from tests.conftest import ROOT

ENTRY = ROOT / "models" / "translator" / "3"
PAIRS = [
    ("Cannot open %s", "Kann %s nicht öffnen"),
    ("%s: file not found", "%s: Datei nicht gefunden"),
    ("<b>Warning:</b> %d files left", "<b>Warnung:</b> %d Dateien übrig"),
]

pytestmark = needs_tool("msgfmt", "Debian's gettext: make system-deps")


@pytest.fixture
def data(tmp_path):
    folder = tmp_path / "set"
    folder.mkdir()
    write_tsv(folder / "test.tsv", PAIRS)
    (folder / "test.domains").write_text("coreutils\ncoreutils\ngtk\n", encoding="utf-8")
    return folder


def test_both_modes_in_one_run(data, tmp_path, monkeypatch, capsys):
    calls = []

    def protected(encoder, decoder, tok, spec, texts, beam, sentinels):  # stands in for the service's pipeline
        calls.append((texts, beam, sentinels))
        return [dict(PAIRS)[t] for t in texts]

    monkeypatch.setattr(evaluate_placeholders, "translate_protected", protected)
    out = tmp_path / "result.json"
    args = ["--entry", str(ENTRY), "--data", str(data), "--beam", "1", "--out", str(out), "--no-progress"]
    assert evaluate_placeholders.main(args) == 0
    assert calls == [([s for s, _ in PAIRS], 1, ())]  # translator/3 names no sentinels: the pipeline's default
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["reference"]["span_agreement"]["percent"] == result["reference"]["msgfmt"]["percent"] == 100.0
    raw, perfect = result["modes"]["raw"], result["modes"]["protected"]
    assert perfect["span_agreement"]["passed"] == perfect["msgfmt"]["passed"] == 3 and perfect["bleu"] == 100.0
    assert perfect["translations"] == [t for _, t in PAIRS] and len(raw["translations"]) == 3
    assert raw["sentences"] == 3 and {"bleu", "chrf", "seconds", "invented_n"} <= raw.keys()
    assert raw["domains"].keys() == {"coreutils", "gtk"} and raw["domains"]["coreutils"]["sentences"] == 2
    for f in raw["failures"]:
        assert f["reference"] == PAIRS[f["index"]][1] and f["domain"] in ("coreutils", "gtk")
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("translator/3 on") and [line.split()[0] for line in table[2:5]] == [
        "reference",
        "raw",
        "protected",
    ]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--beam", "0"], "--beam must be at least 1"),
        (["--max-test", "0"], "holds no sentence pairs"),
    ],
)
def test_errors_are_one_line(data, extra, message):
    with pytest.raises(CliError, match=message):
        evaluate_placeholders.main(["--entry", str(ENTRY), "--data", str(data), "--mode", "raw", *extra])
