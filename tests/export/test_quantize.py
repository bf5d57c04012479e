"""int8 variants made from the shipped entries: their measured quality, their refusal, and serving them in
fp32's place (``ATTNSERVE_PRECISION``) or beside it (an entry of their own)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from contract.manifest import load_entry, read_manifest
from export import quantize
from service.precision import choose
from tests.conftest import ROOT, SHIPPED_TRANSLATOR, run_module
from tests.service.service_testing import start_subprocess_server

SHIPPED = ROOT / "models"
TRANSLATOR, VIT = SHIPPED_TRANSLATOR, SHIPPED / "vit" / "1"


@pytest.fixture(scope="module")
def int8_repository(tiny_translation_data, tmp_path_factory):
    """The shipped fp32 entries, each with the int8 variant made here in its folder (scored on small real
    test splits), and the translator's variant again as an entry of its own, ``translator-int8``."""
    repo = tmp_path_factory.mktemp("int8") / "models"
    for entry in (TRANSLATOR, VIT):
        shutil.copytree(entry, repo / entry.parent.name / entry.name, ignore=shutil.ignore_patterns("int8"))
    runs = [
        (TRANSLATOR, tiny_translation_data, "30", []),
        (VIT, None, "2000", []),
        (TRANSLATOR, tiny_translation_data, "30", ["--name", "translator-int8"]),
    ]
    for entry, data, n, more in runs:
        args = ["--entry", str(repo / entry.parent.name / entry.name), "--max-test", n, *more]
        proc = run_module("export.quantize", *args, *(["--data", str(data)] if data else []))
        assert proc.returncode == 0, proc.stderr
        assert "wrote" in proc.stderr
    return repo


@pytest.mark.parametrize("where", ["translator/{v}/int8", "translator-int8/{v}"])
def test_the_int8_translator_records_its_quality_per_domain_and_its_agreement(int8_repository, where):
    folder = int8_repository / where.format(v=TRANSLATOR.name)
    m = read_manifest(folder)
    assert m["variant"] == {"precision": "int8", "method": quantize.METHOD, "from": f"translator/{TRANSLATOR.name}"}
    name = "translator-int8" if where.startswith("translator-int8") else "translator"  # in its folder: the version's
    assert (m["name"], m["version"]) == (name, TRANSLATOR.name)
    e = m["evaluation"]
    n = e["sentences"]
    assert 0 < n <= 30 and e["domains"] and e["signatures"]
    for run in ("greedy", "beam4"):
        assert 0 <= e[run]["bleu"] <= 100 and 0 <= e["fp32"][run]["bleu"] <= 100
        assert e["fp32"]["beam4"]["bleu"] - e["beam4"]["bleu"] <= quantize.MAX_BLEU_LOSS
    agreement = e["vs_fp32"]
    assert agreement["sentences"] == n and agreement["identical_greedy"] == agreement["identical_greedy_sentences"] / n
    assert e["fp32"]["domains"].keys() == e["domains"].keys()  # per domain, both precisions
    alone = e["batch_invariance"]  # the same greedy tokens alone as in a batch of 32: rows are quantised alone
    assert alone == {"sentences": n, "batch": 32, "fp32": n, "int8": n}
    # sha256s verify; the tokenizer came along
    entry = load_entry(folder)
    assert entry.manifest.variant.precision == "int8" and (entry.path / "tokenizer.model").is_file()

    def size(folder: Path) -> int:  # graphs and shared weights
        return sum(p.stat().st_size for p in folder.iterdir() if p.suffix in (".onnx", ".bin"))

    assert size(entry.path) < 0.7 * size(TRANSLATOR)  # int8 against fp32
    assert set(entry.manifest.files) >= {"weights.bin", "tokenizer.model"}


def test_the_int8_vit_records_its_accuracy_and_top1_agreement(int8_repository):
    m = read_manifest(int8_repository / "vit" / "1" / "int8")
    e = m["evaluation"]
    assert m["variant"]["from"] == "vit/1" and e["test_examples"] == 2000 and e["dataset"] == "fashion-mnist"
    assert 0.8 < e["test_accuracy"] <= 1 and e["fp32_test_accuracy"] - e["test_accuracy"] <= quantize.MAX_ACCURACY_LOSS
    assert 0.98 <= e["vs_fp32"]["top1_agreement"] <= 1.0 and "parity" not in e
    alone = e["batch_invariance"]
    assert alone == {"images": 500, "batch": 32, "fp32": 500, "int8": 500}
    assert [s["file"] for s in m["samples"]] == [s["file"] for s in read_manifest(VIT)["samples"]]


def test_a_variant_that_costs_too_much_quality_is_refused_and_leaves_nothing(
    tiny_translation_data, tmp_path, monkeypatch
):
    monkeypatch.setattr(quantize, "MAX_BLEU_LOSS", -101.0)  # no variant can pass
    with pytest.raises(quantize.VariantRefused, match="more than -101.0 below fp32"):
        quantize.export_int8_translator(TRANSLATOR, tmp_path / "t-int8" / "2", False, tiny_translation_data, max_test=5)
    assert list((tmp_path / "t-int8").iterdir()) == []  # the staging folder is gone


def test_a_missing_test_split_is_one_clear_error(tmp_path):
    proc = run_module(
        "export.quantize", "--entry", str(TRANSLATOR), "--data", str(tmp_path), "--repository", str(tmp_path)
    )
    assert proc.returncode == 2 and "test.tsv does not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_the_service_serves_int8_in_fp32s_place_or_beside_it_and_says_which_is_which(int8_repository, tmp_path):
    srv = start_subprocess_server(tmp_path, int8_repository, precision="int8")
    try:
        srv.wait_ready()
        with srv.client() as c:
            models = {(m["name"], m["version"]): m for m in c.get("/models").json()["models"]}
            assert {k: (m["precision"], m["variant_of"], m["default"]) for k, m in models.items()} == {
                ("translator", TRANSLATOR.name): ("int8", f"translator/{TRANSLATOR.name}", True),
                ("translator-int8", TRANSLATOR.name): ("int8", f"translator/{TRANSLATOR.name}", False),
                ("vit", "1"): ("int8", "vit/1", True),
            }
            assert models["vit", "1"]["precision_reason"] == "precision int8 is set"
            for model in ("translator", "translator-int8"):
                body = {"text": "Saves the current document.", "model": model, "return_attention": True}
                answer = c.post("/translate", json=body).json()
                assert answer["model"] == model and answer["results"][0]["translation"]
                stored = c.get(f"/attention/{answer['results'][0]['attention_id']}").json()
                assert (stored["model"], stored["version"]) == (model, TRANSLATOR.name)  # the variant's own maps
            png = (VIT / "sample-9-ankle-boot.png").read_bytes()
            r = c.post("/classify", files={"file": ("a.png", png, "image/png")})
            assert r.status_code == 200 and r.json()["results"][0]["top_k"][0]["label"] == "Ankle boot"
    finally:
        srv.stop()


def test_auto_serves_what_the_variants_measured(int8_repository, tmp_path):
    srv = start_subprocess_server(tmp_path, int8_repository)
    try:
        srv.wait_ready()
        with srv.client() as c:
            models = {m["name"]: m for m in c.get("/models").json()["models"] if m["name"] != "translator-int8"}
    finally:
        srv.stop()
    for name, version in (("translator", TRANSLATOR.name), ("vit", "1")):
        _, precision, why = choose(int8_repository / name / version, "auto", on_cpu=True)
        assert (models[name]["precision"], models[name]["precision_reason"]) == (precision, why)
        if precision == "fp32":  # the one reason the measured variants can fail: answers that depend on the batch
            assert "its answers would change with the load" in why


def test_precision_fp32_serves_the_versions_as_trained(int8_repository, tmp_path):
    srv = start_subprocess_server(tmp_path, int8_repository, precision="fp32")
    try:
        srv.wait_ready()
        with srv.client() as c:
            models = {m["name"]: m for m in c.get("/models").json()["models"]}
        assert {name: (m["precision"], m["precision_reason"]) for name, m in models.items()} == {
            "translator": ("fp32", "precision fp32 is set"),
            "translator-int8": ("int8", f"a variant of translator/{TRANSLATOR.name}, an entry of its own"),
            "vit": ("fp32", "precision fp32 is set"),
        }
    finally:
        srv.stop()
