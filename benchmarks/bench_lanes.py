"""Where ``POST /translate``'s time goes inside the service, per load: ``python -m benchmarks.bench_lanes``.

The service runs as ``make serve`` runs it (default settings, gRPC off), started through
:mod:`benchmarks.lane_timing`, which times its decoding lanes from inside; wrk drives it with the
real one-sentence messages of ``translate_messages.txt``, one per request, at each of ``--clients`` and
``--beams``, ``--duration`` seconds a run (bench_classify's Lua script, as ``bench_libretranslate``). Per
load it prints the requests per second and the server's CPU time per request, then what the lanes did
for a request: its decoder steps (how many, of how many rows, each step's wall time split into the
decoder graph's run and the search and cache bookkeeping around it, and how much of the step's time its
thread was off the CPU: waiting for the GIL or for a core) and its encoder runs. Of a step, whatever is
not the decoder run is Python; of a request, whatever the lanes did not spend is the event loop's
(HTTP, JSON, tokenizing, answering) or waiting.

It measures one build of the service, not a comparison: run it on two checkouts, or compare its rows
with ``bench_libretranslate``'s, for a ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.bench_classify import ROOT, run_wrk, write_script
from benchmarks.bench_libretranslate_servers import Server, start_attnserve
from benchmarks.lane_timing import FIGURES, WRITE_EVERY_S, read

MESSAGES = (Path(__file__).parent / "translate_messages.txt").read_text("utf-8").splitlines()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_lanes", description=__doc__.splitlines()[0])
    p.add_argument("--repository", type=Path, default=ROOT / "models")
    p.add_argument("--precision", default="auto", help="ATTNSERVE_PRECISION (default: the service's own default)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    p.add_argument("--duration", type=int, default=8, help="seconds of each wrk run")
    p.add_argument("--messages", type=int, default=len(MESSAGES))
    return p.parse_args(argv)


def start(args: argparse.Namespace, workdir: Path) -> tuple[Server, Path]:
    timing = workdir / "lanes.json"
    server = start_attnserve(
        args.repository, workdir, args.precision, "benchmarks.lane_timing", {"ATTNSERVE_LANE_TIMING": str(timing)}
    )
    server.wait_ready("/v2/health/ready")
    server.post("/translate", {"text": MESSAGES[0]})  # the translator is loaded and answers
    return server, timing


def handler_sums(server: Server) -> dict[str, float]:
    """The app's own time on /translate (from its middleware) and the queue wait of the translator's sentences,
    as sums and counts since the start, from the service's /metrics."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
        text = r.read().decode()

    def metric_value(name: str, **labels: str) -> float:
        wanted = [f'{k}="{v}"' for k, v in labels.items()]
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name + "{") and all(w in line for w in wanted)
        )

    return {
        "app_s": metric_value("attnserve_http_request_duration_seconds_sum", route="/translate"),
        "app_n": metric_value("attnserve_http_request_duration_seconds_count", route="/translate"),
        "queue_s": metric_value("attnserve_queue_wait_seconds_sum", model="translator"),
        "queue_n": metric_value("attnserve_queue_wait_seconds_count", model="translator"),
    }


def stages(wrk: dict, d: dict, h: dict) -> str:
    """One request's time by stage, at one client (each request alone): the wall time per request split into
    the app's part (tokenising and planning, queued, encoder, decoder steps, answering, and the rest: the
    lane's hand-backs, reading the body, JSON) and what is outside the app (HTTP, wrk)."""
    n = max(wrk["requests"], 1)
    wall = wrk["seconds"] / n * 1e3
    app = h["app_s"] / max(h["app_n"], 1) * 1e3
    jobs, answer = d["jobs_s"] / n * 1e3, d["answer_s"] / n * 1e3
    queue = h["queue_s"] / max(h["queue_n"], 1) * 1e3
    encoder, steps, graph = d["encoder_s"] / n * 1e3, d["step_s"] / n * 1e3, d["decoder_s"] / n * 1e3
    rest = app - jobs - queue - encoder - steps - answer
    return (
        f"  one request by stage: {wall:.2f} ms = outside the app {wall - app:.2f} + tokenise and plan {jobs:.2f} + "
        f"queued {queue:.2f} + encoder {encoder:.2f} + decoder steps {steps:.2f} (graph runs {graph:.2f}, search "
        f"and caches {steps - graph:.2f}) + answer {answer:.2f} + the rest of the app {rest:.2f} ms"
    )


def row(label: str, wrk: dict, d: dict) -> str:
    n = max(wrk["requests"], 1)
    steps, runs, encodes = max(d["steps"], 1), max(d["decoder_runs"], 1), max(d["encoder_runs"], 1)
    step_ms, decoder_ms = d["step_s"] / steps * 1e3, d["decoder_s"] / runs * 1e3
    lanes_ms = (d["step_s"] + d["encoder_s"]) / n * 1e3
    off = max(0.0, d["step_s"] - d["step_cpu_s"]) / max(d["step_s"], 1e-9)  # waiting for the GIL or a core
    return (
        f"{label}: {wrk['requests'] / wrk['seconds']:.1f} req/s, server CPU {wrk['server_cpu_us'] / 1e3:.2f} ms "
        f"per request, lanes {lanes_ms:.2f} ms per request\n"
        f"  decoder steps: {d['steps'] / n:.1f} per request answered, {d['decoder_rows'] / runs:.1f} rows each, "
        f"{step_ms:.3f} ms each: the decoder run {decoder_ms:.3f} ms, around it {step_ms - decoder_ms:.3f} ms; "
        f"the step's thread off the CPU {off:.0%} of it\n"
        f"  encoder runs: {d['encoder_runs'] / n:.2f} per request answered, {d['encoder_tokens'] / encodes:.0f} tokens each, "
        f"{d['encoder_s'] / encodes * 1e3:.3f} ms each"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    texts = MESSAGES[: args.messages]
    with tempfile.TemporaryDirectory(prefix="bench-lanes-") as tmp:
        workdir = Path(tmp)
        server, timing = start(args, workdir)
        try:
            print(
                f"{args.repository}, ATTNSERVE_PRECISION={args.precision}, {len(texts)} messages, {os.cpu_count()} cores"
            )
            for beam in args.beams:
                bodies = [json.dumps({"text": t, "beam_size": beam}).encode() for t in texts]
                script = write_script(workdir, f"beam{beam}", bodies, "application/json", "/translate")
                run_wrk(server, script, max(args.clients), 1, 1, "/translate")  # warm-up, untimed
                for clients in args.clients:
                    time.sleep(2 * WRITE_EVERY_S)
                    before, handled = read(timing), handler_sums(server)
                    out = run_wrk(server, script, clients, args.duration, 1, "/translate")
                    time.sleep(2 * WRITE_EVERY_S)
                    after, handled_after = read(timing), handler_sums(server)
                    if out["non_2xx"] or out["errors"]:
                        raise SystemExit(f"{out['non_2xx']} non-2xx answers, {out['errors']} errors; see the log")
                    search = "greedy" if beam == 1 else f"beam {beam}"
                    delta = {k: after[k] - before[k] for k in FIGURES}
                    print(row(f"{search}, {clients} clients", out, delta), flush=True)
                    if clients == 1:
                        print(stages(out, delta, {k: handled_after[k] - handled[k] for k in handled}), flush=True)
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
