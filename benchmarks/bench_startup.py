"""How long the service takes to become ready, how much memory it then holds, and what the first
requests cost: ``python -m benchmarks.bench_startup --repository models``.

For each round it starts ``python -m service`` on the repository (from this checkout, or from the
source tree ``--root``), and measures:

- the seconds from the start of the process to the first ``GET /readyz`` 200;
- its memory once ready: ``VmRSS`` of ``/proc/<pid>/status``, split into ``RssAnon`` (memory the
  process allocated) and ``RssFile`` (pages of mapped files such as a weights file), and ``Pss`` of
  ``/proc/<pid>/smaps_rollup``, which counts a page once however many mappings share it (two
  sessions mapping one weights file count its pages twice in ``VmRSS``, once in ``Pss``);
- ``POST /classify`` of the first classifier: the first request at each batch size of ``--batches``
  (random PNGs at the model's size, in that order, right after ready), then a second request of the
  same size: the first pays whatever warm-up left to it.

The bytes on disk of the latest version of every model are printed once. Each figure is the median
over ``--rounds``.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.bench_classify import ROOT, Service, encode_png, pick_model
from contract.manifest import latest_versions


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_startup", description=__doc__.splitlines()[0])
    p.add_argument("--repository", type=Path, default=ROOT / "models")
    p.add_argument("--root", type=Path, default=ROOT, help="the source tree whose service runs (default: this one)")
    p.add_argument("--model", help="the classifier whose first requests are timed (default: the first)")
    p.add_argument("--batches", default="1,3,8,32", help="batch sizes of the first requests, in order")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SETTING=VALUE",
        help="a service setting, e.g. share_classifier_weights=false (ATTNSERVE_SHARE_CLASSIFIER_WEIGHTS)",
    )
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for /readyz")
    return p.parse_args(argv)


def disk_bytes(repository: Path) -> dict[str, int]:
    """Bytes of every file of each model's latest version."""
    return {
        f"{e.parent.name}/{e.name}": sum(f.stat().st_size for f in e.iterdir() if f.is_file())
        for e in latest_versions(repository)
    }


def memory(pid: int) -> dict[str, float]:
    """VmRSS, RssAnon, RssFile and Pss of a process, in MB."""
    fields = {}
    for name, keys in (("status", ("VmRSS", "RssAnon", "RssFile")), ("smaps_rollup", ("Pss",))):
        for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in keys:
                fields[key] = int(value.split()[0]) * 1024 / 1e6
    return fields


def bodies(manifest: dict, batches: list[int]) -> dict[int, bytes]:
    """One JSON body of ``n`` random images at the model's size for each batch size (PNG, base64)."""
    prep = manifest["preprocessing"]
    size, channels = prep["image_size"], prep["channels"]
    rng = np.random.default_rng(0)
    out = {}
    for n in batches:
        images = rng.integers(0, 256, (n, size, size, channels), dtype=np.uint8)
        pngs = [encode_png(im[..., 0] if channels == 1 else im) for im in images]
        out[n] = json.dumps({"images": [base64.b64encode(p).decode() for p in pngs], "top_k": 1}).encode()
    return out


def one_round(args: argparse.Namespace, model: str, requests: dict[int, bytes], log_dir: Path) -> dict:
    started = time.monotonic()
    settings = dict(s.split("=", 1) for s in args.set)
    service = Service("startup", args.repository, model, log_dir, root=args.root, **settings)
    try:
        service.wait_ready(args.timeout)
        result = {"ready_s": time.monotonic() - started, **memory(service.proc.pid)}
        for n, body in requests.items():
            times = []
            for _ in range(2):
                t = time.perf_counter()
                answer = service.classify(body, "application/json")
                times.append((time.perf_counter() - t) * 1000)
                if len(answer["results"]) != n:
                    raise SystemExit(f"asked for {n} images, got {len(answer['results'])} answers")
            result[f"first_{n}"], result[f"second_{n}"] = times
        return result
    finally:
        service.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model, _, manifest = pick_model(args.repository, args.model)
    batches = [int(b) for b in args.batches.split(",")]
    requests = bodies(manifest, batches)
    for entry, size in disk_bytes(args.repository).items():
        print(f"on disk, {entry}: {size / 1e6:.1f} MB")
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        rounds = [one_round(args, model, requests, Path(tmp)) for _ in range(args.rounds)]

    def median(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    print(f"time to ready: {median('ready_s') * 1000:,.0f} ms")
    print(
        f"memory once ready: VmRSS {median('VmRSS'):,.0f} MB (RssAnon {median('RssAnon'):,.0f} MB, "
        f"RssFile {median('RssFile'):,.0f} MB), Pss {median('Pss'):,.0f} MB"
    )
    for n in batches:
        print(
            f"{model}, first request of {n} images: {median(f'first_{n}'):,.1f} ms, the next {median(f'second_{n}'):,.1f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
