"""What traces cost: the same service with traces off and on, interleaved.

``python -m benchmarks.bench_tracing [--rounds 3] [--duration 8]``

Two services on the shipped models (``python -m service`` as ``make serve`` runs it): ``off``, without
``OTEL_*`` variables, and ``on``, exporting every span over OTLP/HTTP (the default protocol, every request
sampled) to a receiver in this process (``benchmarks/otlp_receiver.py``, counting the spans it is sent).
wrk drives each in turn with ``bench_classify``'s script: ``/translate`` with one of 200 real messages
per request (greedy) at 1 and 8 clients, ``/classify`` with one image per request at 32 clients; the
service order alternates from round to round. Printed: each load's median req/s and p50 of both, and on ÷
off with its lowest and highest single round; and the spans received per request (the SDK's batch processor
drops what its queue, ``OTEL_BSP_MAX_QUEUE_SIZE``, cannot hold). That traces off cost nothing next to the code
before them is ``bench_versions``' question (``--base`` a revision without them).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

from benchmarks.bench_classify import ROOT, Service, run_wrk, write_script
from benchmarks.otlp_receiver import Receiver

MESSAGES = [t for t in (ROOT / "benchmarks" / "translate_messages.txt").read_text("utf-8").splitlines() if t.strip()]
LOADS = (("translate", 1), ("translate", 8), ("classify", 32))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_tracing", description=__doc__.splitlines()[0])
    p.add_argument("--repository", type=Path, default=ROOT / "models")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=int, default=8, help="seconds of each wrk run")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-tracing-"))
    receiver = Receiver(keep=False)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    services: dict[str, Service] = {}
    with mock.patch.dict(os.environ, clean, clear=True):
        services["off"] = Service("off", args.repository, "vit", work)
    on = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"}
    with mock.patch.dict(os.environ, {**clean, **on}, clear=True):
        services["on"] = Service("on", args.repository, "vit", work)
    image = min((ROOT / "models" / "vit" / "1").glob("sample-*.png")).read_bytes()  # a shipped Fashion-MNIST image
    scripts = {
        "translate": write_script(
            work,
            "translate",
            [json.dumps({"text": t, "beam_size": 1}).encode() for t in MESSAGES],
            "application/json",
            "/translate",
        ),
        "classify": write_script(
            work, "classify", [json.dumps({"images": [base64.b64encode(image).decode()]}).encode()], "application/json"
        ),
    }
    figures: dict[tuple[str, int, str], list[dict]] = {}
    try:
        for s in services.values():
            s.wait_ready()
        print(f"traces off and on, {args.rounds} rounds of {args.duration} s per load, order alternating", flush=True)
        for r in range(args.rounds):
            for route, clients in LOADS:
                for name in ("off", "on") if r % 2 == 0 else ("on", "off"):
                    out = run_wrk(services[name], scripts[route], clients, args.duration, min(clients, 2), f"/{route}")
                    if out["non_2xx"] or out["errors"]:
                        raise SystemExit(
                            f"{name}: {out['non_2xx']} answers not 2xx, {out['errors']} errors on /{route}"
                        )
                    figures.setdefault((route, clients, name), []).append(out)
                    print(
                        f"  round {r + 1}: {route} x{clients:<2d} {name:3s} "
                        f"{out['requests'] / out['seconds']:8.1f} req/s  p50 {out['p50'] / 1000:7.2f} ms",
                        flush=True,
                    )
        time.sleep(1.0)  # the batch processor's last export
        traced = sum(o["requests"] for (_, _, name), outs in figures.items() if name == "on" for o in outs)
        spans = receiver.received
    finally:
        for s in services.values():
            s.stop()
        receiver.stop()
    print(
        f"\n{'load':16s} {'off req/s':>10s} {'on req/s':>10s} {'on/off (rounds)':>22s} {'p50 off':>9s} {'p50 on':>9s}"
    )
    for route, clients in LOADS:
        rates = {n: [o["requests"] / o["seconds"] for o in figures[(route, clients, n)]] for n in ("off", "on")}
        ratios = [on_ / off_ for on_, off_ in zip(rates["on"], rates["off"])]
        p50 = {n: statistics.median(o["p50"] / 1000 for o in figures[(route, clients, n)]) for n in ("off", "on")}
        print(
            f"{route + ' x' + str(clients):16s} {statistics.median(rates['off']):10.1f} {statistics.median(rates['on']):10.1f} "
            f"{statistics.median(ratios):8.3f}x ({min(ratios):.3f}-{max(ratios):.3f}) "
            f"{p50['off']:7.2f} ms {p50['on']:7.2f} ms"
        )
    print(f"spans received per traced request: {spans / max(1, traced):.1f} ({spans} for {traced} requests)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
