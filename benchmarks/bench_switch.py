"""A version switch under load: ``python -m benchmarks.bench_switch``.

Serves a copy of the repository's ``vit`` and ``translator`` (version 1), keeps ``--clients``
clients sending ``POST /classify`` (one real test image) and one client sending ``POST /translate``
(a real sentence) back to back, and, after ``--before`` seconds, copies each model's version 1 into
place as version 2 and loads it through ``POST /v2/repository/models/{name}/load``. It prints, for
the phases before, during (from the first load call to the end of the last) and after the switch:
requests answered, failed requests (anything but 200: must be 0) and the p50/p99 latency of each
route, and which version answered each phase.
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from benchmarks.bench_classify import ROOT, Service, load_test_images, pick_model
from contract.manifest import latest_versions

SENTENCE = (ROOT / "benchmarks" / "translate_sentences.txt").read_text().splitlines()[0]


def new_version(src: Path, dst: Path, version: str) -> None:
    staging = dst.parent / f".staging-{version}"
    shutil.copytree(src, staging)
    manifest = json.loads((staging / "manifest.json").read_text())
    manifest["version"] = version
    (staging / "manifest.json").write_text(json.dumps(manifest))
    staging.rename(dst)  # appears complete, as a deploy should make it appear


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) >= 2 else (values[0] if values else 0.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repository", type=Path, default=ROOT / "models")
    p.add_argument("--clients", type=int, default=8, help="concurrent /classify clients")
    p.add_argument("--before", type=float, default=8.0, help="seconds of load before the switch")
    p.add_argument("--after", type=float, default=8.0, help="seconds of load after it")
    args = p.parse_args()
    _, vit_entry, vit_manifest = pick_model(args.repository, "vit")
    pngs, _ = load_test_images(vit_manifest)
    image = base64.b64encode(pngs[0]).decode()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        shutil.copytree(vit_entry, repo / "vit" / "1")
        translator = next(e for e in latest_versions(args.repository) if e.parent.name == "translator")
        shutil.copytree(translator, repo / "translator" / "1")
        service = Service("switch", repo, "vit", Path(tmp))
        try:
            service.wait_ready()
            answers: list[tuple[str, float, float, int, str | None]] = []  # route, start, seconds, status, version
            stop = threading.Event()

            def client(route: str, body: dict) -> None:
                with httpx.Client(timeout=60) as http:
                    while not stop.is_set():
                        started = time.monotonic()
                        r = http.post(f"{service.url}/{route}", json=body)
                        version = r.json().get("version") if r.status_code == 200 else None
                        answers.append((route, started, time.monotonic() - started, r.status_code, version))

            threads = [
                threading.Thread(target=client, args=("classify", {"images": [image]})) for _ in range(args.clients)
            ]
            threads.append(threading.Thread(target=client, args=("translate", {"text": SENTENCE})))
            for t in threads:
                t.start()
            time.sleep(args.before)
            switch_start = time.monotonic()
            for name in ("vit", "translator"):
                new_version(repo / name / "1", repo / name / "2", "2")
                r = httpx.post(f"{service.url}/v2/repository/models/{name}/load", timeout=300)
                if r.status_code != 200:
                    raise SystemExit(f"loading {name} failed: {r.status_code} {r.text}")
            switch_end = time.monotonic()
            time.sleep(args.after)
            stop.set()
            for t in threads:
                t.join(60)
        finally:
            service.stop()
    phases = {
        "before": lambda s: s < switch_start,
        "during": lambda s: switch_start <= s < switch_end,
        "after": lambda s: s >= switch_end,
    }
    print(f"switch: both models loaded as version 2 in {switch_end - switch_start:.1f} s, under load")
    print(f"{'phase':8} {'route':10} {'answered':>9} {'failed':>7} {'p50 ms':>8} {'p99 ms':>8}  versions")
    for phase, inside in phases.items():
        for route in ("classify", "translate"):
            rows = [a for a in answers if a[0] == route and inside(a[1])]
            ok = [a[2] * 1000 for a in rows if a[3] == 200]
            versions = sorted({str(a[4]) for a in rows if a[3] == 200})
            print(
                f"{phase:8} {route:10} {len(rows):>9} {len(rows) - len(ok):>7} "
                f"{percentile(ok, 50):>8.1f} {percentile(ok, 99):>8.1f}  {','.join(versions)}"
            )


if __name__ == "__main__":
    main()
