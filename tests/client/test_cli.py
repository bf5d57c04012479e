"""``attnserve-client`` against the real service: readable output, ``--json`` for scripts, exit statuses."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from attnserve_client import ClassifyResponse, Client, TranslateResponse
from attnserve_client.cli import main
from attnserve_client.types import DoneEvent, TokenEvent

from tests.service.service_testing import free_port


@pytest.fixture
def cli(server, capsys, monkeypatch):
    """Run the command line in-process against the server: (exit status, stdout, stderr)."""
    monkeypatch.setenv("ATTNSERVE_BASE_URL", server.url)

    def run(*argv: str) -> tuple[int, str, str]:
        status = main(list(argv))
        out, err = capsys.readouterr()
        return status, out, err

    return run


@pytest.fixture
def client(server):
    with Client(base_url=server.url) as c:
        yield c


def test_classify_prints_each_images_labels_with_percentages(cli, client, shoe):
    status, out, _ = cli("classify", str(shoe), str(shoe), "--top-k", "2")
    best = client.classify(shoe, top_k=2).results[0].top_k
    block = [str(shoe)] + [f"  {s.label:<{max(len(t.label) for t in best)}}  {s.score:6.1%}" for s in best]
    assert status == 0 and out.splitlines() == block * 2


def test_translate_prints_one_line_per_text_and_the_nbest(cli, client):
    status, out, _ = cli("translate", "Open the file.", "Saves the current document.")
    answer = client.translate(["Open the file.", "Saves the current document."])
    assert status == 0 and out.splitlines() == [r.translation for r in answer.results]
    status, out, _ = cli("translate", "Opens a dialog.", "--beam-size", "4", "--num-return-sequences", "2")
    lines = out.splitlines()
    assert status == 0 and len(lines) == 3 and lines[1].split(None, 1)[1] == lines[0]


def test_translate_reads_stdin(cli, client, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("Open the file.\n\nSaves the current document.\n"))
    status, out, _ = cli("translate", "-")
    assert status == 0 and len(out.splitlines()) == 2


@pytest.mark.parametrize("beam", ["1", "3"])
def test_stream_prints_the_same_translation(cli, client, beam):
    status, out, _ = cli("translate", "Select the cells you want to format.", "--stream", "--beam-size", beam)
    expected = client.translate("Select the cells you want to format.", beam_size=int(beam)).results[0].translation
    assert status == 0 and out == expected + "\n"


def test_json_output_is_the_typed_answer(cli, shoe):
    status, out, _ = cli("classify", str(shoe), "--json")
    assert status == 0 and len(ClassifyResponse.model_validate_json(out).results) == 1
    status, out, _ = cli("translate", "Open the file.", "--json")
    assert status == 0 and TranslateResponse.model_validate_json(out).results[0].translation
    status, out, _ = cli("translate", "Open the file.", "--stream", "--json")
    *tokens, done = (json.loads(line) for line in out.splitlines())
    assert status == 0 and all(TokenEvent.model_validate(t).type == "token" for t in tokens)
    assert DoneEvent.model_validate(done).response.results[0].translation == tokens[-1]["text"]


def test_models_health_ready_and_attention(cli, client, shoe, tmp_path):
    status, out, _ = cli("models")
    rows = [line.split() for line in out.splitlines()]
    assert status == 0 and len(rows) == len(client.models())
    assert ["translator", "3", "translation", "ready", "CPUExecutionProvider", "default"] in rows
    assert cli("health") == (0, "ok\n", "") and cli("ready") == (0, "ready\n", "")
    attention_id = client.classify(shoe, return_attention=True).results[0].attention_id
    status, out, _ = cli("attention", attention_id)
    assert status == 0 and out.startswith(f"{attention_id}: image-classification, vit/1") and "layer 6 x head 4" in out
    status, out, _ = cli("attention", attention_id, "--png", str(tmp_path / "map.png"))
    assert status == 0 and (tmp_path / "map.png").read_bytes().startswith(b"\x89PNG")


def test_failures_exit_1_with_code_and_request_id_on_stderr(cli, monkeypatch):
    status, out, err = cli("translate", " ")
    assert status == 1 and out == "" and "422 invalid_field" in err and "request id" in err
    status, _, err = cli(
        "translate", "Open the file.", "--base-url", f"http://127.0.0.1:{free_port()}", "--max-retries", "0"
    )
    assert status == 1 and "connection failed" in err


def test_usage_mistakes_exit_2(cli, tmp_path):
    status, _, err = cli("classify", str(tmp_path / "missing.png"))
    assert status == 2 and "missing.png" in err
    assert cli("translate", "One.", "Two.", "--stream")[0] == 2
    with pytest.raises(SystemExit) as caught:
        main(["translate"])
    assert caught.value.code == 2


def test_python_m_runs_the_same_command(server):
    proc = subprocess.run(
        [sys.executable, "-m", "attnserve_client", "health", "--base-url", server.url],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (proc.returncode, proc.stdout) == (0, "ok\n"), proc.stderr
