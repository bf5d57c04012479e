"""``POST /classify`` vs the Open Inference Protocol over REST and over gRPC, on one service, interleaved.

``python -m benchmarks.bench_oip --repository models``

One service (``python -m service``, gRPC on a free port) answers three forms of the same work, one
real Fashion-MNIST test image per request:

- ``classify``: ``POST /classify``, the image as PNG in JSON (base64), as bench_classify sends it;
- ``rest``: ``POST /v2/models/{model}/infer`` with the binary tensor data extension: a JSON header
  and the image's preprocessed pixels as raw FP32 (``pixels`` [1, C, H, W]), the output
  ``probabilities`` asked back as binary data (what ``tritonclient.http`` sends and asks by default);
- ``grpc``: ``ModelInfer`` with the same FP32 bytes in ``raw_input_contents`` (what
  ``tritonclient.grpc`` sends), the output in ``raw_output_contents``.

The OIP forms skip the PNG decoding and normalisation ``/classify`` does: that is their users' way.

All three are driven by the same load generator, h2load (nghttp2's, C; ``apt-get install
nghttp2-client``), in a process of its own: N connections with one request in flight each (closed
loop), HTTP/1.1 for the two REST forms (uvicorn's protocol) and HTTP/2 for gRPC, each request a
prepared body sent as is. A Python client (httpx, ``grpc.aio``) would spend more CPU per request
than the server on this 2-core machine, and spend it differently per transport, so it, not the
server, would decide the ratios; h2load's own CPU per request is printed beside the server's to
show it does not. h2load reads HTTP status only and a failed gRPC call still answers HTTP 200, so
every run is checked on the server's own count of answers by status (``/metrics``): any answer but
200 stops the benchmark. Before measuring, each form's answers are checked against offline
onnxruntime.

At 1, 8 and 64 clients (``--clients``) the three forms run back to back, in an order rotating from
round to round (the later of back-to-back runs here tends to be faster), for ``--rounds`` rounds.
It prints each form's median requests/s, p50 and p99 over the rounds, then for each client count
the ratios of the medians with the lowest and highest ratio of a single round, the ratio of the
server's CPU time per request (less at the mercy of other work on a shared machine than the
rates), and whether gRPC's rate is at least REST's.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort

from benchmarks.bench_classify import Service, _free_port, load_test_images, make_bodies, pick_model
from service.grpc.generated import grpc_service_pb2 as pb
from service.grpc.generated.grpc_service_pb2_grpc import GRPCInferenceServiceStub

FORMS = ("classify", "rest", "grpc")
GRPC_PATH = "/inference.GRPCInferenceService/ModelInfer"
COUNTED = re.compile(r'^attnserve_http_requests_total\{route="([^"]*)",method="(\w+)",status="(\d+)"\} (\S+)$')


@dataclass
class Load:
    form: str
    clients: int
    rounds: list[dict] = field(default_factory=list)

    def median(self, key: str) -> float:
        return statistics.median(r[key] for r in self.rounds)


@dataclass
class Request:
    """One prepared request of a form: its h2load arguments (body file, headers, URL)."""

    body: Path | None  # None: a GET
    headers: list[str]
    url: str
    http1: bool


# ---- request bodies --------------------------------------------------------------------------
def rest_body(model: str, pixels: np.ndarray) -> tuple[bytes, int]:
    """A binary-tensor OIP request of ``pixels`` (FP32 [1, C, H, W]) and its JSON header's length."""
    data = np.ascontiguousarray(pixels, "<f4").tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "pixels",
                    "datatype": "FP32",
                    "shape": list(pixels.shape),
                    "parameters": {"binary_data_size": len(data)},
                }
            ],
            "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return header + data, len(header)


def grpc_request(model: str, pixels: np.ndarray) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(
        model_name=model,
        inputs=[pb.ModelInferRequest.InferInputTensor(name="pixels", datatype="FP32", shape=list(pixels.shape))],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="probabilities")],
        raw_input_contents=[np.ascontiguousarray(pixels, "<f4").tobytes()],
    )


def grpc_frame(message: pb.ModelInferRequest) -> bytes:
    """The message as gRPC puts it in an HTTP/2 body: uncompressed flag, 4-byte big-endian length, bytes."""
    data = message.SerializeToString()
    return b"\x00" + len(data).to_bytes(4, "big") + data


def prepare(service: Service, grpc_port: int, model: str, png: bytes, pixels: np.ndarray, folder: Path) -> dict:
    """The three forms' requests of one image, their bodies written under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (classify,), content_type = make_bodies([png], 1, "json", count=1)
    rest, header_length = rest_body(model, pixels)
    bodies = {"classify": classify, "rest": rest, "grpc": grpc_frame(grpc_request(model, pixels))}
    for form, body in bodies.items():
        (folder / f"{form}.body").write_bytes(body)
    return {
        "classify": Request(
            folder / "classify.body", [f"content-type: {content_type}"], service.url + "/classify", True
        ),
        "rest": Request(
            folder / "rest.body",
            ["content-type: application/octet-stream", f"inference-header-content-length: {header_length}"],
            f"{service.url}/v2/models/{model}/infer",
            True,
        ),
        "grpc": Request(
            folder / "grpc.body",
            ["content-type: application/grpc", "te: trailers"],
            f"http://127.0.0.1:{grpc_port}{GRPC_PATH}",
            False,
        ),
    }


def floor_requests(service: Service, grpc_port: int, folder: Path) -> dict[str, Request]:
    """The cheapest call of each transport: ``GET /v2/health/live`` and gRPC ``ServerLive``, both answered
    without touching a model, so their cost is the transport's and the service's per-call bookkeeping."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "empty.body").write_bytes(grpc_frame(pb.ServerLiveRequest()))
    return {
        "rest-live": Request(None, [], service.url + "/v2/health/live", True),
        "grpc-live": Request(
            folder / "empty.body",
            ["content-type: application/grpc", "te: trailers"],
            f"http://127.0.0.1:{grpc_port}/inference.GRPCInferenceService/ServerLive",
            False,
        ),
    }


def measure_floor(service: Service, grpc_port: int, args: argparse.Namespace, folder: Path) -> list[str]:
    """Each transport's cheapest call at 1 and 8 clients, interleaved: its table, medians of ``args.rounds`` rounds."""
    requests = floor_requests(service, grpc_port, folder)
    runs: dict[tuple[str, int], list[dict]] = {}
    for r in range(args.rounds):
        for clients in (1, 8):
            for form in list(requests)[r % 2 :] + list(requests)[: r % 2]:
                runs.setdefault((form, clients), []).append(
                    run_h2load(service, requests[form], clients, args.duration, folder)
                )
    table = ["", "the transports' floor: the cheapest call of each (no model), medians"]
    table.append(f"{'call':10s} {'clients':>7s} {'req/s':>9s} {'p50 us':>8s} {'srv us/req':>10s}")
    for (form, clients), rounds in runs.items():
        med = {k: statistics.median(x[k] for x in rounds) for k in ("requests_per_s", "p50_ms", "server_cpu_us")}
        table.append(
            f"{form:10s} {clients:7d} {med['requests_per_s']:9.1f} {med['p50_ms'] * 1000:8.0f} "
            f"{med['server_cpu_us']:10.1f}"
        )
    return table


# ---- checking the answers --------------------------------------------------------------------
def check_answers(service: Service, grpc_port: int, model: str, graph: Path, pngs: list[bytes], x: np.ndarray) -> None:
    """Each form must answer the first 16 test images as offline onnxruntime does."""
    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    expected = list(session.run(None, {session.get_inputs()[0].name: x[:16]})[0].argmax(1))
    (bodies, content_type), got = make_bodies(pngs[:16], 1, "json", count=16), {f: [] for f in FORMS}
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = GRPCInferenceServiceStub(channel)
        for i in range(16):
            got["classify"].append(service.classify(bodies[i], content_type)["results"][0]["top_k"][0]["index"])
            body, header_length = rest_body(model, x[i : i + 1])
            req = urllib.request.Request(
                f"{service.url}/v2/models/{model}/infer",
                body,
                {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(header_length)},
            )
            with urllib.request.urlopen(req, timeout=30) as r:
                split = int(r.headers["Inference-Header-Content-Length"])
                got["rest"].append(int(np.frombuffer(r.read()[split:], "<f8").argmax()))
            answer = stub.ModelInfer(grpc_request(model, x[i : i + 1]), timeout=30)
            got["grpc"].append(int(np.frombuffer(answer.raw_output_contents[0], "<f8").argmax()))
    for form, indices in got.items():
        if indices != expected:
            raise SystemExit(f"{form} answers differ from offline onnxruntime: {indices} vs {expected}")


def answers_by_status(service: Service) -> dict[tuple[str, str, str], float]:
    """The service's count of answered requests and calls by (route, method, status)."""
    with urllib.request.urlopen(service.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {m.group(1, 2, 3): float(m.group(4)) for m in map(COUNTED.match, text.splitlines()) if m}


# ---- measuring -------------------------------------------------------------------------------
def run_h2load(service: Service, request: Request, clients: int, duration: int, folder: Path) -> dict:
    """One closed-loop run: requests/s, latency percentiles and CPU per request of h2load and the server."""
    log = folder / "h2load.log"
    log.unlink(missing_ok=True)  # h2load appends
    cmd = ["h2load", "-c", str(clients), "-m", "1", "-t", "1", "-D", str(duration), "--warm-up-time", "1"]
    cmd += [*(["-d", str(request.body)] if request.body else []), "--log-file", str(log)]
    for header in request.headers:
        cmd += ["-H", header]
    cmd += [*(["--h1"] if request.http1 else []), request.url]
    counted_before, cpu_before = answers_by_status(service), service.cpu_seconds()
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60, check=False)
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_after, counted_after = service.cpu_seconds(), answers_by_status(service)
    finished = re.search(r"finished in ([\d.]+)s, ([\d.]+) req/s", proc.stdout)
    done = re.search(
        r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", proc.stdout
    )
    if proc.returncode != 0 or finished is None or done is None:
        raise SystemExit(f"h2load failed ({proc.returncode}): {proc.stdout}\n{proc.stderr}")
    refused = {k: v - counted_before.get(k, 0.0) for k, v in counted_after.items() if k[2] != "200"}
    refused = {k: v for k, v in refused.items() if v}
    if int(done[3]) or int(done[4]) or refused:
        raise SystemExit(f"{request.url}: {done[3]} failed, {done[4]} errored, answers other than 200: {refused}")
    elapsed_us = np.array([int(line.split("\t")[2]) for line in log.read_text().splitlines() if line])
    n = max(int(done[1]), 1)
    client_cpu = sum(getattr(children_after, f) - getattr(children_before, f) for f in ("ru_utime", "ru_stime"))
    return {
        "requests_per_s": float(finished[2]),
        "p50_ms": float(np.percentile(elapsed_us, 50)) / 1e3,
        "p99_ms": float(np.percentile(elapsed_us, 99)) / 1e3,
        "client_cpu_us": client_cpu / n * 1e6,  # warm-up requests included: an upper bound
        "server_cpu_us": (cpu_after - cpu_before) / n * 1e6,
    }


def round_order(round_index: int) -> tuple[str, ...]:
    """The forms in the order of round ``round_index``: rotated by one each round."""
    k = round_index % len(FORMS)
    return FORMS[k:] + FORMS[:k]


# ---- main ------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_oip", description=__doc__.splitlines()[0])
    p.add_argument("--repository", type=Path, default=Path("models"), help="model repository (default: models/)")
    p.add_argument("--model", help="model name (default: the first image-classification model)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median kept)")
    p.add_argument("--duration", type=int, default=6, help="seconds of each h2load run (after 1 s of warm-up)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--floor", action="store_true", help="also time each transport's cheapest call (no model)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("h2load") is None:
        raise SystemExit("h2load not found: install it with 'sudo apt-get install -y nghttp2-client'")
    name, entry, manifest = pick_model(args.repository, args.model)
    graph = entry / manifest["graphs"]["model"]["file"]
    pngs, x = load_test_images(manifest)
    workdir = Path(tempfile.mkdtemp(prefix="bench-oip-"))
    grpc_port = _free_port()
    settings = {"log_format": "json", "access_log": "false", "max_queue_images": 1024, "grpc_port": grpc_port}
    service = Service("oip", args.repository.resolve(), name, workdir, **settings)
    loads = [Load(form, c) for c in args.clients for form in FORMS]
    by = {(load.form, load.clients): load for load in loads}
    try:
        service.wait_ready()
        check_answers(service, grpc_port, name, graph, pngs, x)
        warm = prepare(service, grpc_port, name, pngs[0], x[:1], workdir / "warm-up")
        for form in FORMS:  # first connections and allocations, not measured
            run_h2load(service, warm[form], max(args.clients), 1, workdir)
        for r in range(args.rounds):
            requests = prepare(service, grpc_port, name, pngs[r], x[r : r + 1], workdir / f"round-{r}")
            for clients in args.clients:
                for form in round_order(r):
                    out = run_h2load(service, requests[form], clients, args.duration, workdir)
                    by[form, clients].rounds.append(out)
                    print(
                        f"  round {r + 1}/{args.rounds}: {form:8s} {clients:3d} clients: "
                        f"{out['requests_per_s']:8.1f} req/s",
                        flush=True,
                    )
        floor = measure_floor(service, grpc_port, args, workdir / "floor") if args.floor else []
    finally:
        service.stop()
    report(args, name, manifest, loads)
    print("\n".join(floor))
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


def report(args: argparse.Namespace, name: str, manifest: dict, loads: list[Load]) -> None:
    print(
        f"\n{name}/{manifest['version']}, one real Fashion-MNIST test image per request, h2load "
        f"(one request in flight per connection), {args.duration} s x {args.rounds} interleaved rounds (median)"
    )
    header = f"{'form':9s} {'clients':>7s} {'req/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} {'h2load us/req':>13s} {'srv us/req':>10s}"
    print(header)
    print("-" * len(header))
    for load in loads:
        print(
            f"{load.form:9s} {load.clients:7d} {load.median('requests_per_s'):9.1f} {load.median('p50_ms'):8.2f} "
            f"{load.median('p99_ms'):8.2f} {load.median('client_cpu_us'):13.1f} {load.median('server_cpu_us'):10.1f}"
        )
    print()
    by = {(load.form, load.clients): load for load in loads}
    for clients in args.clients:
        for a, b in (("grpc", "rest"), ("rest", "classify"), ("grpc", "classify")):
            top, bottom = by[a, clients], by[b, clients]
            per_round = [
                x["requests_per_s"] / y["requests_per_s"] for x, y in zip(top.rounds, bottom.rounds, strict=True)
            ]
            ratio = top.median("requests_per_s") / bottom.median("requests_per_s")
            cpu = top.median("server_cpu_us") / bottom.median("server_cpu_us")
            line = (
                f"{a} vs {b}, {clients} clients: {ratio:.3f}x (rounds {min(per_round):.3f}x to {max(per_round):.3f}x), "
                f"server CPU per request {cpu:.3f}x"
            )
            if (a, b) == ("grpc", "rest"):
                line += f": gRPC not below REST: {'MET' if ratio >= 1.0 else 'NOT MET'}"
            print(line)


if __name__ == "__main__":
    sys.exit(main())
