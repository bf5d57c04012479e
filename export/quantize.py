"""int8 variants of exported entries: every product by a constant matrix in int8 (:mod:`export.int8_rows`).

``python -m export.quantize --entry models/translator/3 [--data data/translation]`` (or a ViT entry,
with ``--data`` the Fashion-MNIST folder) writes ``models/translator/3/int8/``: every graph of the fp32
entry quantised (weights int8 per output column, activations int8 per row at run time, so an answer
does not depend on its batch-mates; attention and the key/value cache stay fp32), its quality measured on the same test split as fp32 in the same run, and its agreement
with fp32. The service serves it in the version's place on the CPU (``ATTNSERVE_PRECISION``,
``contract/precision.py``); ``--name`` writes it as an entry of its own instead, ``<name>/<version>``,
to serve both side by side. A variant that loses more than ``MAX_BLEU_LOSS`` BLEU (beam search) or
``MAX_ACCURACY_LOSS`` accuracy points is refused: nobody ships it without seeing what it costs.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from contract.decoding import DecoderSpec, session_fn
from contract.manifest import IMAGE_CLASSIFICATION, TRANSLATION, Manifest, load_entry, read_manifest
from contract.precision import BATCH_INVARIANCE, INT8, MAX_ACCURACY_LOSS, MAX_BLEU_LOSS, variant_folder
from contract.tokenizer import Tokenizer
from export.common import StagedEntry, cpu_session, max_abs_diff, now_iso
from export.int8_rows import METHOD, quantize_graph
from export.shared_weights import WEIGHTS, record_weights, share_weights
from model.cli import CliError, run_cli

INPUT, LOGITS = "pixel_values", "logits"


INVARIANCE_SAMPLE = 500  # test sentences (images) decoded alone and in batches
INVARIANCE_BATCH = 32


class VariantRefused(CliError):
    """The int8 variant costs more quality than allowed."""


def quantize_graphs(fp32_entry: Path, manifest: dict, out: Path) -> None:
    graphs = list(dict.fromkeys(g["file"] for g in manifest["graphs"].values()))
    for graph in graphs:
        quantize_graph(fp32_entry / graph, out / graph)
    if len(graphs) > 1:  # as in the fp32 entry: a parameter several graphs hold is stored once
        share_weights(out, graphs)
    for file in manifest["files"]:  # tokenizer, samples: copied as they are
        if file not in {*graphs, WEIGHTS}:
            shutil.copy(fp32_entry / file, out / file)


def write_variant(
    fp32_entry: Path, final: Path, force: bool, evaluate: Callable[[Path, dict], dict]
) -> tuple[Path, dict]:
    """Quantise an entry into ``final`` (its ``int8/`` folder, or ``<repository>/<name>/<version>``), its
    manifest's evaluation from ``evaluate(int8_folder, fp32_manifest)``; an exception there refuses the
    variant and leaves nothing."""
    manifest = read_manifest(fp32_entry)
    inside = final == variant_folder(fp32_entry)  # the version's own variant keeps its name and version
    name, version = (manifest["name"], manifest["version"]) if inside else (final.parent.name, final.name)
    with StagedEntry(final.parent.parent, final.parent.name, final.name, force) as stage:
        quantize_graphs(fp32_entry, manifest, stage.dir)
        evaluation = evaluate(stage.dir, manifest)
        variant = variant_manifest(manifest, name, version, evaluation)
        record_weights(variant, stage.dir)
        return stage.commit(variant), evaluation


def variant_manifest(manifest: dict, name: str, version: str, evaluation: dict) -> dict:
    new = {k: v for k, v in manifest.items() if k not in ("schema_version", "files")}
    new.update(
        name=name,
        version=version,
        created_at=now_iso(),
        evaluation=evaluation,
        variant={"precision": "int8", "method": METHOD, "from": f"{manifest['name']}/{manifest['version']}"},
    )
    return new


# ---- classifiers ---------------------------------------------------------------------------------


def classifier_logits(path: Path, x: np.ndarray) -> np.ndarray:
    s = cpu_session(path)
    return np.concatenate([s.run([LOGITS], {INPUT: x[i : i + 500]})[0] for i in range(0, len(x), 500)])


def classes_alone_and_batched(path: Path, x: np.ndarray) -> int:
    """How many images of ``x`` get the same class alone as in batches of ``INVARIANCE_BATCH``."""
    s = cpu_session(path)
    alone = np.array([s.run([LOGITS], {INPUT: x[i : i + 1]})[0].argmax(-1)[0] for i in range(len(x))])
    batched = np.concatenate(
        [
            s.run([LOGITS], {INPUT: x[i : i + INVARIANCE_BATCH]})[0].argmax(-1)
            for i in range(0, len(x), INVARIANCE_BATCH)
        ]
    )
    return int((alone == batched).sum())


def classifier_evaluation(
    fp32_entry: Path,
    int8_entry: Path,
    manifest: dict,
    x: np.ndarray,
    y: np.ndarray,
    max_loss: float = MAX_ACCURACY_LOSS,
) -> dict:
    ref, got = classifier_logits(fp32_entry / "model.onnx", x), classifier_logits(int8_entry / "model.onnx", x)
    accuracy, fp32_accuracy = float((got.argmax(-1) == y).mean()), float((ref.argmax(-1) == y).mean())
    if fp32_accuracy - accuracy > max_loss:
        raise VariantRefused(
            f"int8 test accuracy {accuracy:.4f} is more than {max_loss:.3f} below fp32's {fp32_accuracy:.4f}"
        )
    sample = x[:INVARIANCE_SAMPLE]
    same_alone = {
        label: classes_alone_and_batched(folder / "model.onnx", sample)
        for label, folder in (("fp32", fp32_entry), ("int8", int8_entry))
    }
    evaluation = {
        **manifest["evaluation"],
        BATCH_INVARIANCE: {"images": len(sample), "batch": INVARIANCE_BATCH, **same_alone},
        "test_examples": len(x),
        "test_accuracy": accuracy,
        "fp32_test_accuracy": fp32_accuracy,
        "vs_fp32": {
            "max_abs_logits": max_abs_diff(got, ref),
            "top1_agreement": float((got.argmax(-1) == ref.argmax(-1)).mean()),
        },
    }
    evaluation.pop("parity", None)
    return evaluation


def export_int8(
    fp32_entry: Path,
    final: Path,
    force: bool,
    x_test: np.ndarray,
    y_test: np.ndarray,
    max_loss: float = MAX_ACCURACY_LOSS,
) -> Path:
    """The int8 variant of a classifier entry, scored on ``x_test`` (preprocessed) and ``y_test``; refused
    when its accuracy is more than ``max_loss`` below fp32's."""
    final, evaluation = write_variant(
        fp32_entry,
        final,
        force,
        lambda folder, manifest: classifier_evaluation(fp32_entry, folder, manifest, x_test, y_test, max_loss),
    )
    print(
        f"wrote {final}: int8 test accuracy {evaluation['test_accuracy']:.4f} (fp32 "
        f"{evaluation['fp32_test_accuracy']:.4f}), top-1 agreement {evaluation['vs_fp32']['top1_agreement']:.4f}, "
        f"{(final / 'model.onnx').stat().st_size:,} bytes",
        file=sys.stderr,
    )
    return final


def classifier_test_data(m: Manifest, data: Path | None) -> tuple[np.ndarray, np.ndarray]:
    from model.data import load_image_dataset  # numpy-only readers of the datasets the ViT trains on

    dataset = load_image_dataset(m.evaluation.get("dataset", "fashion-mnist"), data)
    return m.preprocessing.apply(dataset.test_images), dataset.test_labels


# ---- translators ---------------------------------------------------------------------------------


def translator_evaluation(fp32_entry: Path, int8_dir: Path, m: Manifest, data: Path, max_test: int | None) -> dict:
    """int8 and fp32 scored on the same test pairs in one run; refused beyond ``MAX_BLEU_LOSS``."""
    from export.scoring import evaluate, read_domains
    from export.translator import BEAM, translate_all
    from model.translation.textio import read_tsv

    pairs, _ = read_tsv(data / "test.tsv")
    domains = read_domains(data, "test", len(pairs))
    pairs, domains = (pairs[:max_test], domains[:max_test]) if max_test else (pairs, domains)
    tok, spec = Tokenizer.load(fp32_entry / m.tokenizer.file), DecoderSpec.from_manifest(m)
    runs, greedy = {}, {}
    for label, folder in (("fp32", fp32_entry), ("int8", int8_dir)):
        enc, dec = (session_fn(cpu_session(folder / m.graph(g).file)) for g in ("encoder", "decoder"))

        def translate(texts: list[str], beam: int, enc=enc, dec=dec, label=label) -> tuple[list[str], float]:
            out, seconds = translate_all(enc, dec, tok.encode_batch(texts, add_eos=True), spec, tok, beam, False)
            if beam == 1:
                greedy[label] = out
            return out, seconds

        runs[label] = evaluate(translate, pairs, domains, BEAM)
    best = f"beam{BEAM}"
    sources = tok.encode_batch([src for src, _ in pairs[:INVARIANCE_SAMPLE]], add_eos=True)
    same_alone = {
        label: translations_alone_and_batched(folder, m, spec, sources)
        for label, folder in (("fp32", fp32_entry), ("int8", int8_dir))
    }
    if runs["fp32"][best]["bleu"] - runs["int8"][best]["bleu"] > MAX_BLEU_LOSS:
        raise VariantRefused(
            f"int8 beam-{BEAM} test BLEU {runs['int8'][best]['bleu']} is more than {MAX_BLEU_LOSS} below fp32's "
            f"{runs['fp32'][best]['bleu']}"
        )
    same = sum(a == b for a, b in zip(greedy["fp32"], greedy["int8"]))
    return {
        **runs["int8"],
        "fp32": {k: runs["fp32"][k] for k in ("greedy", best, "domains") if k in runs["fp32"]},
        "vs_fp32": {"identical_greedy": same / len(pairs), "identical_greedy_sentences": same, "sentences": len(pairs)},
        BATCH_INVARIANCE: {"sentences": len(sources), "batch": INVARIANCE_BATCH, **same_alone},
    }


def translations_alone_and_batched(folder: Path, m: Manifest, spec: DecoderSpec, sources: list[list[int]]) -> int:
    """How many of ``sources`` get the same greedy tokens decoded alone as in batches of ``INVARIANCE_BATCH``:
    an answer must not depend on the requests it happens to share a batch with."""
    from contract.decoding import greedy

    enc, dec = (session_fn(cpu_session(folder / m.graph(g).file)) for g in ("encoder", "decoder"))
    alone = [greedy(enc, dec, [s], spec)[0].tokens for s in sources]
    batched = [
        h.tokens
        for i in range(0, len(sources), INVARIANCE_BATCH)
        for h in greedy(enc, dec, sources[i : i + INVARIANCE_BATCH], spec)
    ]
    return sum(a == b for a, b in zip(alone, batched))


def export_int8_translator(fp32_entry: Path, final: Path, force: bool, data: Path, max_test: int | None = None) -> Path:
    """The int8 variant of a translator entry, scored per domain on ``data``'s test split."""
    m = load_entry(fp32_entry).manifest
    final, e = write_variant(
        fp32_entry,
        final,
        force,
        lambda folder, _: translator_evaluation(fp32_entry, folder, m, data, max_test),
    )
    print(
        f"wrote {final}: int8 test BLEU greedy {e['greedy']['bleu']} beam {e['beam4']['bleu']} (fp32 "
        f"{e['fp32']['greedy']['bleu']} / {e['fp32']['beam4']['bleu']}); identical greedy output "
        f"{e['vs_fp32']['identical_greedy']:.1%}",
        file=sys.stderr,
    )
    return final


# ---- command line --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m export.quantize", description=__doc__.splitlines()[0])
    p.add_argument("--entry", type=Path, required=True, help="the fp32 entry, e.g. models/translator/3")
    p.add_argument("--data", type=Path, help="test data: the translation corpus folder, or the image dataset folder")
    p.add_argument(
        "--name", help="an entry of its own, <repository>/<name>/<version>; default: the entry's int8/ folder"
    )
    p.add_argument("--repository", type=Path, help="with --name; default: the entry's repository")
    p.add_argument("--version", help="with --name; default: the fp32 entry's version")
    p.add_argument("--force", action="store_true", help="replace an existing variant")
    p.add_argument("--max-test", type=int, help="score on only the first N test pairs (smoke tests)")
    args = p.parse_args(argv)
    m = load_entry(args.entry).manifest
    repository = args.repository or args.entry.parent.parent
    final = repository / args.name / (args.version or m.version) if args.name else variant_folder(args.entry, INT8)
    if m.task == TRANSLATION:
        data = args.data or Path(m.model_extra.get("data", {}).get("folder", "data/translation"))
        if not (data / "test.tsv").is_file():
            raise CliError(f"{data / 'test.tsv'} does not exist: pass --data with the corpus folder (make corpus)")
        export_int8_translator(args.entry, final, args.force, data, args.max_test)
    elif m.task == IMAGE_CLASSIFICATION:
        x, y = classifier_test_data(m, args.data)
        x, y = (x[: args.max_test], y[: args.max_test]) if args.max_test else (x, y)
        export_int8(args.entry, final, args.force, x, y)
    else:
        raise CliError(f"no int8 variant for task {m.task!r}")
    return 0


if __name__ == "__main__":
    run_cli(main)
