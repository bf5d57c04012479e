"""What attention costs: the service as shipped vs a build whose graphs have no attention outputs.

``python -m benchmarks.bench_attention --repository models``

1. builds a copy of the repository without attention: ``onnx.utils.extract_model`` cuts every graph
   down to the outputs decoding needs (ViT: logits; encoder: cross keys/values; decoder: log-probs
   and the cache), ``decoder_prefix.onnx`` is dropped and the manifests are rewritten to match;
2. starts both services side by side (idle between measurements: onnxruntime threads do not spin);
3. per round, in alternating order: ``/classify`` throughput with wrk (one image per request,
   ``--clients`` connections) and ``/translate`` throughput (``--clients`` concurrent real test
   sentences, greedy), on each service without attention, then on the shipped one with
   ``return_attention: true`` (maps computed, summarised and stored);
4. prints medians over ``--rounds`` and the ratios. Target (issue 6): without attention, the shipped
   service does >= 97% of the attention-free build's throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import onnx
import onnx.utils

from benchmarks.bench_classify import Service, load_test_images, make_bodies, run_wrk, write_script
from contract.decoding import decoding_outputs
from contract.manifest import describe_files, read_manifest, write_manifest

ROOT = Path(__file__).resolve().parents[1]
KEEP = ("model", "encoder", "decoder")  # the serving graphs; decoder_prefix runs only for attention


def kept_outputs(role: str, manifest: dict) -> list[str]:
    """What serving without attention fetches from the graph of ``role``."""
    return ["logits"] if role == "model" else list(decoding_outputs(int(manifest["decoding"]["layers"]))[role])


def strip_entry(src: Path, dst: Path) -> None:
    """Copy an entry with its serving graphs cut to the outputs serving fetches (and no decoder_prefix)."""
    manifest = read_manifest(src)
    dst.mkdir(parents=True)
    graphs = {}
    for role, graph in manifest["graphs"].items():
        if role not in KEEP:
            continue  # decoder_prefix: only the attention pass uses it
        model = onnx.load(str(src / graph["file"]))
        keep = kept_outputs(role, manifest)
        cut = onnx.utils.Extractor(model).extract_model([i.name for i in model.graph.input], keep)
        onnx.save(cut, str(dst / graph["file"]))
        # saved with its weights inside (onnx.load read any weights.bin): the copy names no weights file
        kept = {k: v for k, v in graph.items() if k != "weights"}
        graphs[role] = {**kept, "outputs": [o for o in graph["outputs"] if o["name"] in keep]}
    for name in manifest["files"]:
        if name.endswith((".model", ".png")):
            shutil.copy(src / name, dst / name)
    files = [p.name for p in dst.iterdir()]
    manifest = {k: v for k, v in manifest.items() if k != "attention"} | {
        "graphs": graphs,
        "files": describe_files(dst, files),
    }
    write_manifest(dst, manifest)


def serving_nodes(repository: Path) -> dict[str, int]:
    """Node count of each serving graph (what runs when no attention is asked for), by entry and role."""
    out = {}
    for manifest_path in sorted(repository.glob("*/*/manifest.json")):
        graphs = read_manifest(manifest_path.parent)["graphs"]
        for role in KEEP:
            if role in graphs:
                model = onnx.load(str(manifest_path.parent / graphs[role]["file"]), load_external_data=False)
                out[f"{manifest_path.parent.parent.name}/{role}"] = len(model.graph.node)
    return out


def stripped_repository(repository: Path, workdir: Path) -> Path:
    out = workdir / "no-attention"
    for entry in sorted(p.parent for p in repository.glob("*/*/manifest.json")):
        strip_entry(entry, out / entry.parent.name / entry.name)
    return out


async def translate_all(url: str, texts: list[str], attention: bool) -> float:
    """Generated tokens per second with every text in flight at once."""
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=httpx.Limits(max_connections=len(texts))) as c:
        start = time.perf_counter()
        answers = await asyncio.gather(
            *(c.post("/translate", json={"text": t, "beam_size": 1, "return_attention": attention}) for t in texts)
        )
        seconds = time.perf_counter() - start
    if any(a.status_code != 200 for a in answers):
        raise SystemExit(f"translate failed: {next(a.text for a in answers if a.status_code != 200)}")
    results = [a.json()["results"][0] for a in answers]
    if attention and any(r.get("attention_id") is None for r in results):
        raise SystemExit("attention was asked for but not stored")
    return sum(len(r["target_tokens"]) + 1 for r in results) / seconds


def classify_rate(service: Service, script: Path, args: argparse.Namespace) -> float:
    out = run_wrk(service, script, args.clients, args.seconds, threads=2)
    if out["non_2xx"] or out["errors"]:
        raise SystemExit(
            f"{service.name}: {out['non_2xx']} non-2xx answers, {out['errors']} errors; see {service.log_path}"
        )
    return out["requests"] / out["seconds"]


def check_attention(service: Service, body: bytes) -> None:
    """The attention bodies really ask for (and get) attention: the figure is not of refused requests."""
    result = service.classify(body, "application/json")["results"][0]
    if not result.get("attention_id") or "rollout" not in result.get("attention", {}):
        raise SystemExit(f"return_attention gave no attention: {result}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_attention", description=__doc__.split("\n\n")[0])
    p.add_argument("--repository", type=Path, default=ROOT / "models")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=int, default=5, help="wrk duration of each /classify measurement")
    p.add_argument(
        "--bursts", type=int, default=4, help="/translate bursts of --clients requests per service and round"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    texts = (ROOT / "benchmarks" / "translate_sentences.txt").read_text().splitlines()[: args.clients]
    with tempfile.TemporaryDirectory(prefix="bench-attention-") as tmp:
        workdir = Path(tmp)
        bare = stripped_repository(args.repository, workdir)
        shipped_nodes, stripped_nodes = serving_nodes(args.repository), serving_nodes(bare)
        vit_manifest = read_manifest(next(args.repository.glob("vit/*")))
        pngs, _ = load_test_images(vit_manifest)
        plain = write_script(workdir, "plain", *make_bodies(pngs, 1, "json"))
        bodies, ctype = make_bodies(pngs, 1, "json")
        attention_bodies = [json.dumps({**json.loads(b), "return_attention": True}).encode() for b in bodies]
        with_attention = write_script(workdir, "attention", attention_bodies, ctype)
        services = {
            "shipped": Service("shipped", args.repository, "vit", workdir, access_log="false"),
            "no-attention": Service("no-attention", bare, "vit", workdir, access_log="false"),
        }
        figures: dict[str, list[float]] = {}
        try:
            for s in services.values():
                s.wait_ready()
            check_attention(services["shipped"], attention_bodies[0])
            for r in range(args.rounds):
                order = list(services) if r % 2 == 0 else list(services)[::-1]
                for name in order:
                    figures.setdefault(f"classify {name}", []).append(classify_rate(services[name], plain, args))
                rate = classify_rate(services["shipped"], with_attention, args)
                figures.setdefault("classify shipped, return_attention", []).append(rate)
                for _ in range(args.bursts):  # one burst lasts ~0.35 s: alternate several, or noise decides
                    for name in order:
                        tok = asyncio.run(translate_all(services[name].url, texts, attention=False))
                        figures.setdefault(f"translate {name}", []).append(tok)
                    tok = asyncio.run(translate_all(services["shipped"].url, texts, attention=True))
                    figures.setdefault("translate shipped, return_attention", []).append(tok)
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            for s in services.values():
                s.stop()
    report(args, {k: statistics.median(v) for k, v in figures.items()})
    same = all(shipped_nodes[k] == stripped_nodes[k] for k in stripped_nodes)
    print(
        "serving graphs, nodes shipped vs attention-free: "
        + ", ".join(f"{k} {shipped_nodes[k]}/{stripped_nodes[k]}" for k in stripped_nodes)
        + (
            " (the same graphs: without attention the shipped service runs exactly the attention-free graphs)"
            if same
            else ""
        )
    )
    return 0


def report(args: argparse.Namespace, m: dict[str, float]) -> None:
    print(
        f"\nattention costs: medians of {args.rounds} interleaved rounds ({args.bursts} /translate bursts each), "
        f"{args.clients} clients"
    )
    print(f"{'measurement':48} {'median':>10}  ratio")
    for task, unit in (("classify", "img/s"), ("translate", "tok/s")):
        base = m[f"{task} no-attention"]
        for row in (f"{task} no-attention", f"{task} shipped", f"{task} shipped, return_attention"):
            print(f"{row:48} {m[row]:>8.0f} {unit}  {m[row] / base:.3f}")
    for task in ("classify", "translate"):
        ratio = m[f"{task} shipped"] / m[f"{task} no-attention"]
        print(
            f"target: {task} without attention >= 0.97 x attention-free build: {ratio:.3f} "
            f"{'MET' if ratio >= 0.97 else 'MISSED'}"
        )


if __name__ == "__main__":
    sys.exit(main())
