"""The service at a git revision against this checkout, interleaved: ``python -m benchmarks.bench_versions --base REV``.

A change to the request path or the engines must not cost speed. Both versions serve the same model
repository side by side (the revision from a temporary ``git worktree``), and each load runs against
one then the other, their order alternating from round to round (on these machines the second of two
back-to-back runs is faster). The loads: ``POST /classify`` with one image per request at 1 and 64
clients and 16 images per request at 32 clients (wrk, real Fashion-MNIST PNGs as JSON), and
``POST /translate`` of one real sentence per request, greedy at 1, 8 and 32 clients and beam 4 at 4 clients;
and a mixed load, /classify at 32 clients (one image) and /translate at 8 (greedy) at the same time
through the same service, which shows how the batcher's instances and the decoding lanes share the cores.
It prints, for each load, the median requests/s and p99 of each version over the rounds, the ratio
of the medians (this checkout / the revision) and the lowest and highest ratio of a single round;
the A/A run (``--base HEAD`` on a clean checkout) shows how far apart two identical versions land.
With ``--base-models`` the revision serves the models it shipped (its own ``models/``) instead of
``--repository``: a change to the shipped models, or to which of them the defaults serve, is measured
against what a user of the revision got.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.bench_classify import ROOT, Service, load_test_images, make_bodies, pick_model, run_wrk, write_script

SENTENCES = ROOT / "benchmarks" / "translate_sentences.txt"


@dataclass
class Load:
    name: str
    path: str
    clients: int
    script: Path
    results: dict[str, list[dict]] = field(default_factory=lambda: {"base": [], "head": []})
    beside: Load | None = None  # run at the same time through the same service: a mixed load


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_versions", description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the git revision to compare this checkout with")
    p.add_argument("--repository", type=Path, default=ROOT / "models")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--duration", type=int, default=8, help="seconds of each wrk run")
    p.add_argument("--wrk-threads", type=int, default=1)
    p.add_argument("--skip-translate", action="store_true")
    p.add_argument("--only", help="run only the loads whose name contains this text (e.g. translate)")
    p.add_argument("--base-models", action="store_true", help="the revision serves its own models/, not --repository")
    return p.parse_args(argv)


def translate_bodies(beam: int) -> list[bytes]:
    texts = [t for t in SENTENCES.read_text("utf-8").splitlines() if t.strip()][:32]
    return [json.dumps({"texts": [t], "beam_size": beam}).encode() for t in texts]


def loads(workdir: Path, repository: Path, translate: bool) -> list[Load]:
    _, _, manifest = pick_model(repository, None)
    pngs, _ = load_test_images(manifest)
    single, content_type = make_bodies(pngs, 1, "json")
    multi, _ = make_bodies(pngs, 16, "json")
    out = [
        Load("classify, 1 client x 1 image", "/classify", 1, write_script(workdir, "c1", single, content_type)),
        Load("classify, 64 clients x 1 image", "/classify", 64, write_script(workdir, "c64", single, content_type)),
        Load("classify, 32 clients x 16 images", "/classify", 32, write_script(workdir, "c16", multi, content_type)),
    ]
    if translate:
        for name, beam, clients in (("greedy", 1, 1), ("greedy", 1, 8), ("greedy", 1, 32), ("beam 4", 4, 4)):
            script = write_script(workdir, f"t{beam}", translate_bodies(beam), "application/json", "/translate")
            out.append(Load(f"translate, {clients} clients, {name}", "/translate", clients, script))
        script = write_script(workdir, "t1", translate_bodies(1), "application/json", "/translate")
        beside = Load("mixed: translate, 8 clients, greedy, beside classify", "/translate", 8, script)
        out.append(
            Load(
                "mixed: classify, 32 clients x 1 image, beside translate", "/classify", 32, out[0].script, beside=beside
            )
        )
    return out


def run_load(service: Service, load: Load, duration: int, threads: int) -> list[tuple[Load, dict]]:
    """wrk's figures for the load, and for the one beside it, run at the same time."""
    parts = [load] if load.beside is None else [load, load.beside]
    with ThreadPoolExecutor(len(parts)) as pool:
        outs = list(pool.map(lambda x: run_wrk(service, x.script, x.clients, duration, threads, x.path), parts))
    return list(zip(parts, outs))


@contextlib.contextmanager
def worktree(revision: str):
    """A detached checkout of ``revision`` in a temporary folder, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="bench-base-")) / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), revision], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)], check=False)
        shutil.rmtree(folder.parent, ignore_errors=True)


def report(runs: list[Load], base: str) -> None:
    print(f"\nthis checkout (head) vs {base} (base): medians of {len(runs[0].results['head'])} interleaved rounds")
    runs = [part for load in runs for part in (load, load.beside) if part is not None]
    width = max(len(load.name) for load in runs)
    for load in runs:
        rate = {v: [r["requests"] / (r["duration_us"] / 1e6) for r in rs] for v, rs in load.results.items()}
        p99 = {v: statistics.median(r["p99"] / 1000 for r in rs) for v, rs in load.results.items()}
        per_round = [h / b for h, b in zip(rate["head"], rate["base"])]
        base_rate, head_rate = statistics.median(rate["base"]), statistics.median(rate["head"])
        print(
            f"{load.name:{width}s}  base {base_rate:,.1f} req/s, head {head_rate:,.1f} req/s = "
            f"{head_rate / base_rate:.3f}x (rounds {min(per_round):.3f}x to {max(per_round):.3f}x); "
            f"p99 {p99['base']:.2f} ms vs {p99['head']:.2f} ms"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: install it with 'sudo apt-get install -y wrk'")
    workdir = Path(tempfile.mkdtemp(prefix="bench-versions-"))
    runs = [r for r in loads(workdir, args.repository, not args.skip_translate) if (args.only or "") in r.name]
    if not runs:
        raise SystemExit(f"no load matches --only {args.only!r}")
    model, _, _ = pick_model(args.repository, None)
    with worktree(args.base) as base_tree:
        base_models = base_tree / "models" if args.base_models else args.repository
        settings = {"log_format": "json", "access_log": "false", "max_queue_images": 1024}
        services = {
            "base": Service("base", base_models.resolve(), model, workdir, root=base_tree, **settings),
            "head": Service("head", args.repository.resolve(), model, workdir, **settings),
        }
        try:
            for s in services.values():
                s.wait_ready()
                for load in runs:  # first connections and allocations, not measured
                    run_load(s, load, 1, args.wrk_threads)
            for r in range(args.rounds):
                order = ["base", "head"] if r % 2 == 0 else ["head", "base"]
                for load in runs:
                    for version in order:
                        for part, out in run_load(services[version], load, args.duration, args.wrk_threads):
                            if out["non_2xx"] or out["errors"]:
                                raise SystemExit(
                                    f"{version}, {part.name}: {out['non_2xx']} non-2xx, {out['errors']} errors"
                                )
                            part.results[version].append(out)
                print(f"  round {r + 1}/{args.rounds} done", flush=True)
        finally:
            for s in services.values():
                s.stop()
    report(runs, args.base)
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
