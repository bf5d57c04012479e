"""Benchmark ``POST /classify`` against bare onnxruntime on the same model, in one run.

``python -m benchmarks.bench_classify --repository models``

What it does, bounded in time (about 4 minutes with the defaults, 7 with ``--rounds 5``):
1. starts two services with ``python -m service``: batched (``max_batch_size`` 32) and unbatched
   (``max_batch_size`` 1), both idle between runs (onnxruntime threads do not spin);
2. checks that the batched service answers real Fashion-MNIST test images like offline inference;
3. drives them with wrk (C, epoll; ``apt-get install wrk``) at 1, 8, 32 and 64 clients with one
   image per request, and the batched one at 1, 8 and 32 clients with 16 images per request,
   interleaving the configurations and repeating each ``--rounds`` times (median kept) so that
   background noise hits them alike; the batch sizes formed are read from ``/metrics``;
4. measures bare onnxruntime's best candidates after every round, and at the end, with both
   services stopped, bare onnxruntime on the same graph at the batch sizes formed (and the powers
   of two up to 32): with the service's session options, one run at a time and as many at once as
   the service has model instances (the ``bare@batch`` column), and with onnxruntime's defaults;
5. prints one table with the ratios, then (1) to (4): the service against bare onnxruntime's best
   (a reference: on two vCPUs onnxruntime alone has both, the service shares them with its HTTP
   side), and whether batching ever costs throughput or tail latency, or one client's latency more
   than 1 ms over bare onnxruntime at batch 1.

The load generator must not be the bottleneck: wrk's own CPU per request is measured and printed
beside the server's. A Python load generator on 2 cores caps near 1.7k req/s; do not swap one in.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from contract.manifest import latest_versions, parse_manifest, read_manifest
from service.classifier import Preprocessing
from service.images import ImageLimits, decode
from service.runtime import create_session
from service.settings import DEFAULT_IMAGE_FORMATS, Settings

ROOT = Path(__file__).resolve().parents[1]
LUA = r"""
local files = {%(files)s}
local content_type = "%(content_type)s"
local requests = {}
local counter = 0

init = function(args)
  for i, path in ipairs(files) do
    local f = assert(io.open(path, "rb"))
    local body = f:read("*a")
    f:close()
    requests[i] = wrk.format("POST", "%(route)s", {["Content-Type"] = content_type}, body)
  end
end

request = function()
  counter = counter + 1
  return requests[(counter %% #requests) + 1]
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests": %%d, "duration_us": %%d, "non_2xx": %%d, "errors": %%d, "p50": %%d, "p95": %%d, "p99": %%d}\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(95), latency:percentile(99)))
end
"""


@dataclass
class Run:
    service: str  # "batched" or "unbatched"
    clients: int
    images_per_request: int
    requests_per_s: float = 0.0
    images_per_s: float = 0.0
    p50_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0
    mean_batch: float = 0.0
    non_2xx: int = 0
    errors: int = 0
    client_cpu_us_per_request: float = 0.0
    server_cpu_us_per_request: float = 0.0
    rounds: list[dict] = field(default_factory=list)


# ---- the services under test -----------------------------------------------------------------
class Service:
    """``python -m service`` from the source tree ``root`` (this checkout unless another is given)."""

    def __init__(
        self, name: str, repository: Path, model: str, log_dir: Path, root: Path = ROOT, path: tuple = (), **settings
    ) -> None:
        self.name = name
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = model
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(map(str, (*path, root))),  # ``path``: modules imported before the tree's
            "ATTNSERVE_MODEL_REPOSITORY": str(repository),
            "ATTNSERVE_PORT": str(self.port),
            "ATTNSERVE_GRPC_PORT": "0",  # HTTP is measured; a gRPC server on the shared 8001 would clash
            "ATTNSERVE_DRAIN_DELAY_S": "0",  # no load balancer in front: stop at once
            "ATTNSERVE_DEFAULT_MODEL": model,
            **{f"ATTNSERVE_{k.upper()}": str(v) for k, v in settings.items()},
        }
        self.log_path = log_dir / f"service-{name}.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "service"], cwd=root, env=env, stdout=log, stderr=log)

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"service {self.name} exited; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise SystemExit(f"service {self.name} not ready after {timeout:.0f} s; see {self.log_path}")

    def batch_histogram(self) -> tuple[float, float]:
        """(sum, count) of the batch-size histogram of the benchmarked model."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        total = count = 0.0
        label = f'model="{self.model}"'
        for line in text.splitlines():
            if line.startswith("attnserve_batch_size_sum{") and label in line:
                total = float(line.rsplit(" ", 1)[1])
            elif line.startswith("attnserve_batch_size_count{") and label in line:
                count = float(line.rsplit(" ", 1)[1])
        return total, count

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def classify(self, body: bytes, content_type: str) -> dict:
        req = urllib.request.Request(self.url + "/classify", body, {"Content-Type": content_type})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- request bodies ------------------------------------------------------------------------
def encode_png(pixels: np.ndarray) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def make_bodies(pngs: list[bytes], per_request: int, encoding: str, count: int = 64) -> tuple[list[bytes], str]:
    """``count`` distinct request bodies of ``per_request`` real test images each."""
    bodies = []
    for i in range(count):
        chosen = [pngs[(i * per_request + j) % len(pngs)] for j in range(per_request)]
        if encoding == "json":
            bodies.append(json.dumps({"images": [base64.b64encode(p).decode() for p in chosen]}).encode())
        else:
            boundary = "attnservebenchboundary"
            parts = b"".join(
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{j}.png"\r\n'
                f"Content-Type: image/png\r\n\r\n".encode()
                + p
                + b"\r\n"
                for j, p in enumerate(chosen)
            )
            bodies.append(parts + f"--{boundary}--\r\n".encode())
    content_type = "application/json" if encoding == "json" else "multipart/form-data; boundary=attnservebenchboundary"
    return bodies, content_type


def write_script(workdir: Path, name: str, bodies: list[bytes], content_type: str, route: str = "/classify") -> Path:
    """A wrk script that POSTs ``bodies`` to ``route`` in turn (each body in a file of its own)."""
    files = []
    for i, body in enumerate(bodies):
        file = workdir / f"{name}-{i}.body"
        file.write_bytes(body)
        files.append(file)
    script = workdir / f"{name}.lua"
    listed = ", ".join(f'"{f}"' for f in files)
    script.write_text(LUA % {"files": listed, "content_type": content_type, "route": route})
    return script


# ---- measuring -------------------------------------------------------------------------------
def run_wrk(service: Service, script: Path, clients: int, duration: int, threads: int, path: str = "/classify") -> dict:
    before_batches, before_cpu = service.batch_histogram(), service.cpu_seconds()
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cmd = [
        "wrk",
        f"-t{min(threads, clients)}",
        f"-c{clients}",
        f"-d{duration}s",
        "--timeout",
        "10s",
        "-s",
        str(script),
        service.url + path,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60, check=False)
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    after_batches, after_cpu = service.batch_histogram(), service.cpu_seconds()
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("WRKJSON ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"wrk failed ({proc.returncode}): {proc.stdout}\n{proc.stderr}")
    out = json.loads(line.removeprefix("WRKJSON "))
    n = max(out["requests"], 1)
    client_cpu = (children_after.ru_utime + children_after.ru_stime) - (
        children_before.ru_utime + children_before.ru_stime
    )
    batches = after_batches[1] - before_batches[1]
    out.update(
        seconds=out["duration_us"] / 1e6,
        mean_batch=(after_batches[0] - before_batches[0]) / batches if batches else 0.0,
        client_cpu_us=client_cpu / n * 1e6,
        server_cpu_us=(after_cpu - before_cpu) / n * 1e6,
    )
    return out


def in_round_order(runs: list[Run], round_index: int) -> list[Run]:
    """``runs`` with the batched and unbatched run of each client count swapped in odd rounds.

    Of two back-to-back wrk runs here, the second is faster: at one client, six alternating pairs
    of the same two services favoured whichever ran second, 6 times out of 6, by up to 14%. A fixed
    order gave that edge to the unbatched service in every round.
    """
    ordered: list[Run] = []
    for run in runs:
        if (
            round_index % 2
            and ordered
            and ordered[-1].clients == run.clients
            and ordered[-1].images_per_request == run.images_per_request
        ):
            ordered.insert(len(ordered) - 1, run)
        else:
            ordered.append(run)
    return ordered


def summarise(run: Run) -> None:
    """Median over rounds of each figure (rounds are interleaved, so noise hits all configurations alike)."""
    med = lambda key: statistics.median(r[key] for r in run.rounds)
    rps = statistics.median(r["requests"] / r["seconds"] for r in run.rounds)
    run.requests_per_s, run.images_per_s = rps, rps * run.images_per_request
    run.p50_ms, run.p95_ms, run.p99_ms = med("p50") / 1e3, med("p95") / 1e3, med("p99") / 1e3
    run.mean_batch = med("mean_batch")
    run.non_2xx = sum(r["non_2xx"] for r in run.rounds)
    run.errors = sum(r["errors"] for r in run.rounds)
    run.client_cpu_us_per_request, run.server_cpu_us_per_request = med("client_cpu_us"), med("server_cpu_us")


def _run_for(
    session: ort.InferenceSession, feeds: dict, output: str, seconds: float, concurrent: int = 1
) -> tuple[float, list[float]]:
    """(runs per second, each run's seconds) of ``concurrent`` threads running ``session`` back to back
    (onnxruntime releases the GIL: the runs are truly concurrent, like the service's instances)."""
    for _ in range(3):
        session.run([output], feeds)
    times: list[list[float]] = [[] for _ in range(concurrent)]
    start = time.perf_counter()

    def loop(mine: list[float]) -> None:
        while time.perf_counter() - start < seconds:
            t = time.perf_counter()
            session.run([output], feeds)
            mine.append(time.perf_counter() - t)

    threads = [threading.Thread(target=loop, args=(mine,)) for mine in times[1:]]
    for t in threads:
        t.start()
    loop(times[0])
    for t in threads:
        t.join()
    flat = [t for mine in times for t in mine]
    return len(flat) / (time.perf_counter() - start), flat


def bare_onnxruntime(
    graph: Path, x: np.ndarray, batch_sizes: list[int], seconds: float, settings: Settings, repeats: int = 3
) -> dict:
    """img/s per batch size with the service's session options, with as many of those runs at once
    as the service has model instances, and with onnxruntime's defaults (median of ``repeats``
    interleaved measurements: multi-threaded runs on a small VM are noisy), plus batch-1 latency
    percentiles of single runs."""
    service = create_session(graph, settings).session
    instances = settings.model_instances
    sessions = {
        "service options": (service, 1),
        f"service options x{instances}": (service, instances),
        "onnxruntime defaults": (ort.InferenceSession(str(graph), providers=_cuda_first()), 1),
    }
    if instances == 1:
        sessions.pop(f"service options x{instances}")
    inp, logits = service.get_inputs()[0].name, service.get_outputs()[0].name
    samples: dict = {name: {b: [] for b in batch_sizes} for name in sessions}
    latencies: dict = {name: [] for name, (_, concurrent) in sessions.items() if concurrent == 1}
    for _ in range(repeats):
        for name, (session, concurrent) in sessions.items():
            for b in batch_sizes:
                xb = np.ascontiguousarray(np.resize(x, (b, *x.shape[1:])))
                rate, times = _run_for(session, {inp: xb}, logits, seconds, concurrent)
                samples[name][b].append(b * rate)
                if b == 1 and name in latencies:
                    latencies[name] += times
    results = {name: {b: statistics.median(v) for b, v in per_b.items()} for name, per_b in samples.items()}
    latency_b1 = {
        name: {"p50_ms": float(np.percentile(t, 50) * 1e3), "p99_ms": float(np.percentile(t, 99) * 1e3)}
        for name, t in latencies.items()
    }
    return {"img_per_s": results, "latency_b1": latency_b1, "samples": samples}


class BareBest:
    """Bare onnxruntime's best candidates (its defaults at batch 16 and 32; the service's options at
    batch 8, and at batch 16 with one run per model instance at once), measured again after every
    round: on a shared VM the machine's speed drifts by 20% within a minute, and a best measured
    only at the end, in a slow phase, would flatter the service."""

    def __init__(self, graph: Path, x: np.ndarray, settings: Settings) -> None:
        defaults = ort.InferenceSession(str(graph), providers=_cuda_first())
        service = create_session(graph, settings).session
        self.candidates = [
            (defaults, 16, 1),
            (defaults, 32, 1),
            (service, 8, 1),
            (service, 16, settings.model_instances),
        ]
        self.inp, self.logits = defaults.get_inputs()[0].name, defaults.get_outputs()[0].name
        self.x = x
        self.per_round: list[float] = []

    def measure(self, seconds: float) -> float:
        best = 0.0
        for session, b, concurrent in self.candidates:
            xb = np.ascontiguousarray(np.resize(self.x, (b, *self.x.shape[1:])))
            rate, _ = _run_for(session, {self.inp: xb}, self.logits, seconds, concurrent)
            best = max(best, b * rate)
        self.per_round.append(best)
        return best


def _cuda_first() -> list[str]:
    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


# ---- main ------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_classify", description=__doc__.splitlines()[0])
    p.add_argument("--repository", type=Path, default=Path("models"), help="model repository (default: models/)")
    p.add_argument("--model", help="model name (default: the first image-classification model)")
    p.add_argument(
        "--duration", type=int, default=4, help="seconds per wrk run (whole seconds: wrk takes no fractions)"
    )
    p.add_argument("--rounds", type=int, default=3, help="interleaved repetitions of every run (median kept)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--multi-images", type=int, default=16, help="images per request in the multi-image runs")
    p.add_argument("--multi-clients", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--encoding", choices=["json", "multipart"], default="json")
    p.add_argument("--wrk-threads", type=int, default=1)
    p.add_argument("--bare-seconds", type=float, default=1.0, help="seconds per bare onnxruntime measurement")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra service setting for both services, e.g. --set intra_op_threads=1",
    )
    p.add_argument("--skip-unbatched", action="store_true", help="only the batched service ((3) not judged)")
    p.add_argument("--skip-multi", action="store_true", help="no multi-image runs ((2) not measured)")
    p.add_argument("--json-out", type=Path, help="also write every figure here")
    return p.parse_args(argv)


def pick_model(repository: Path, name: str | None) -> tuple[str, Path, dict]:
    for entry in latest_versions(repository):
        manifest = read_manifest(entry)
        if manifest["task"] == "image-classification" and (name is None or manifest["name"] == name):
            return manifest["name"], entry, manifest
    raise SystemExit(f"no image-classification model {name or ''} in {repository}")


def load_test_images(manifest: dict) -> tuple[list[bytes], np.ndarray]:
    """Real Fashion-MNIST test images as PNG, and the same images preprocessed as the service does."""
    from model.data import load_image_dataset  # numpy + Pillow only; no torch

    images = load_image_dataset("fashion-mnist").test_images[:256]
    pngs = [encode_png(img[..., 0]) for img in images]
    prep = Preprocessing.from_manifest(parse_manifest(manifest))
    limits = ImageLimits(1 << 20, 1 << 24, DEFAULT_IMAGE_FORMATS)
    x = prep.normalize(prep.stack([decode(p, limits, prep.image_size, prep.color_mode) for p in pngs]))
    return pngs, x


def check_answers(service: Service, graph: Path, pngs: list[bytes], x: np.ndarray, encoding: str) -> None:
    """The service must agree with offline inference before its speed means anything."""
    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    expected = session.run([session.get_outputs()[0].name], {session.get_inputs()[0].name: x[:32]})[0].argmax(1)
    bodies, content_type = make_bodies(pngs[:32], 1, encoding, count=32)
    got = [service.classify(b, content_type)["results"][0]["top_k"][0]["index"] for b in bodies]
    if list(expected) != got:
        raise SystemExit(f"service answers differ from offline onnxruntime: {got} vs {list(expected)}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: install it with 'sudo apt-get install -y wrk'")
    name, entry, manifest = pick_model(args.repository, args.model)
    graph = entry / manifest["graphs"]["model"]["file"]
    pngs, x = load_test_images(manifest)
    load1 = os.getloadavg()[0]
    print(
        f"model {name}/{manifest['version']} ({manifest['model'].get('parameters', '?')} parameters), "
        f"onnxruntime {ort.__version__}, {os.cpu_count()} CPUs, load average {load1:.2f}",
        flush=True,
    )
    if load1 > 0.7:
        print("warning: the machine is busy; figures will be noisy", flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="bench-classify-"))
    single_bodies, content_type = make_bodies(pngs, 1, args.encoding)
    multi_bodies, _ = make_bodies(pngs, args.multi_images, args.encoding)
    single = write_script(workdir, "single", single_bodies, content_type)
    multi = write_script(workdir, "multi", multi_bodies, content_type)
    common = {"log_format": "json", "max_queue_images": max(512, args.multi_images * max(args.multi_clients))}
    common.update(kv.split("=", 1) for kv in args.set)
    services = {
        "batched": Service(
            "batched",
            args.repository,
            name,
            workdir,
            max_batch_size=args.max_batch_size,
            max_images_per_request=min(args.multi_images, args.max_batch_size),
            **common,
        ),
        "unbatched": Service(
            "unbatched", args.repository, name, workdir, max_batch_size=1, max_images_per_request=1, **common
        ),
    }
    if args.skip_unbatched:
        services.pop("unbatched").stop()
    # batched and unbatched side by side at each client count: (3) compares them, and the
    # VM's speed drifts over minutes (which of the two goes first alternates: see in_round_order)
    runs = [Run(name, c, 1) for c in args.clients for name in services]
    if not args.skip_multi:
        runs += [Run("batched", c, args.multi_images) for c in args.multi_clients]
    try:
        for s in services.values():
            s.wait_ready()
        check_answers(services["batched"], graph, pngs, x, args.encoding)
        for s in services.values():  # first-connection and allocator warm-up, not measured
            run_wrk(s, single, 8, 1, args.wrk_threads)
        service_settings = Settings(**{k: v for k, v in common.items() if k != "log_format"})
        round_best = BareBest(graph, x, service_settings)
        for r in range(args.rounds):
            for run in in_round_order(runs, r):
                script = single if run.images_per_request == 1 else multi
                run.rounds.append(run_wrk(services[run.service], script, run.clients, args.duration, args.wrk_threads))
                print(
                    f"  round {r + 1}/{args.rounds}: {run.service:9s} {run.clients:3d} clients x "
                    f"{run.images_per_request:2d} img: {run.rounds[-1]['requests'] / run.rounds[-1]['seconds']:8.1f} req/s",
                    flush=True,
                )
            print(
                f"  round {r + 1}/{args.rounds}: bare onnxruntime best {round_best.measure(args.bare_seconds):.0f} img/s",
                flush=True,
            )
    finally:
        for s in services.values():
            s.stop()
    for run in runs:
        summarise(run)

    formed = {max(1, round(r.mean_batch)) for r in runs if r.mean_batch}
    sizes = sorted({1, 2, 4, 8, 16, 32} | formed)
    print(f"bare onnxruntime at batch sizes {sizes} ...", flush=True)
    bare = bare_onnxruntime(graph, x, sizes, args.bare_seconds, service_settings)
    bare["best_per_round"] = round_best.per_round
    report(args, name, manifest, runs, bare)
    if args.json_out:
        args.json_out.write_text(json.dumps({"runs": [asdict(r) for r in runs], "bare": bare}, indent=2, default=str))
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


def report(args: argparse.Namespace, name: str, manifest: dict, runs: list[Run], bare: dict) -> None:
    # the service runs its instances' batches at once: compare it with bare runs done the same way
    concurrent = [name for name in bare["img_per_s"] if name.startswith("service options x")]
    svc_opts = bare["img_per_s"][concurrent[0] if concurrent else "service options"]
    best_name, best_batch, final_best = max(
        ((opt, b, v) for opt, per_batch in bare["img_per_s"].items() for b, v in per_batch.items()), key=lambda t: t[2]
    )
    rounds_best = statistics.median(bare["best_per_round"]) if bare["best_per_round"] else 0.0
    best = max(final_best, rounds_best)  # (1) and (2) are measured against the higher of the two

    def bare_at(batch: float) -> float:
        return svc_opts[max(1, round(batch))] if batch else svc_opts[1]

    print()
    print(
        f"POST /classify, {args.encoding} bodies of real Fashion-MNIST test images (PNG), wrk {args.wrk_threads} "
        f"thread(s), {args.duration:g} s x {args.rounds} interleaved rounds (median)"
    )
    header = (
        f"{'service':10s} {'clients':>7s} {'img/req':>7s} {'req/s':>8s} {'img/s':>8s} {'p50 ms':>7s} {'p95 ms':>7s} "
        f"{'p99 ms':>7s} {'batch':>6s} {'bare@batch':>10s} {'ratio':>6s} {'vs best':>7s} {'non2xx':>6s} "
        f"{'wrk us/req':>10s} {'srv us/req':>10s}"
    )
    print(header)
    print("-" * len(header))
    for r in sorted(runs, key=lambda r: (r.images_per_request, r.service != "batched", r.clients)):
        at = bare_at(r.mean_batch)
        print(
            f"{r.service:10s} {r.clients:7d} {r.images_per_request:7d} {r.requests_per_s:8.1f} {r.images_per_s:8.1f} "
            f"{r.p50_ms:7.2f} {r.p95_ms:7.2f} {r.p99_ms:7.2f} {r.mean_batch:6.1f} {at:10.1f} "
            f"{r.images_per_s / at:6.2f} {r.images_per_s / best:7.2f} {r.non_2xx + r.errors:6d} "
            f"{r.client_cpu_us_per_request:10.1f} {r.server_cpu_us_per_request:10.1f}"
        )
    print()
    print("bare onnxruntime img/s by batch size:")
    for opt, per_batch in bare["img_per_s"].items():
        print(f"  {opt:22s} " + "  ".join(f"b{b}={v:.0f}" for b, v in per_batch.items()))
    for opt, lat in bare["latency_b1"].items():
        print(f"  {opt:22s} batch-1 latency p50 {lat['p50_ms']:.3f} ms, p99 {lat['p99_ms']:.3f} ms")
    print(f"  best: {final_best:.0f} img/s ({best_name}, batch {best_batch}); medians of 3 interleaved measurements")
    print(
        f"  best measured after each round: {', '.join(f'{v:.0f}' for v in bare['best_per_round'])} img/s "
        f"(median {rounds_best:.0f})"
    )
    print(f"  (1) and (2) are measured against the higher: {best:.0f} img/s")
    print()

    by = {(r.service, r.clients, r.images_per_request): r for r in runs}
    verdict = lambda ok: "MET" if ok else "NOT MET"
    top = max(args.clients)
    t1 = by.get(("batched", top, 1))
    if t1:
        print(f"(1) {top} single-image clients: {t1.images_per_s:.0f} img/s = {t1.images_per_s / best:.2f}x bare best")
    multi = [r for r in runs if r.images_per_request > 1]
    if multi:
        m = max(multi, key=lambda r: r.images_per_s)
        print(
            f"(2) {m.images_per_request} images/request (best at {m.clients} clients): {m.images_per_s:.0f} img/s = "
            f"{m.images_per_s / best:.2f}x bare best"
        )
    pairs = [
        (by[("batched", c, 1)], by[("unbatched", c, 1)])
        for c in args.clients
        if ("batched", c, 1) in by and ("unbatched", c, 1) in by
    ]
    if pairs:
        thr = all(b.images_per_s >= u.images_per_s for b, u in pairs)
        p99 = all(b.p99_ms <= u.p99_ms for b, u in pairs if b.clients >= 8)
        detail = ", ".join(
            f"{b.clients}: {b.images_per_s / u.images_per_s:.2f}x thr, p99 {b.p99_ms:.2f}/{u.p99_ms:.2f} ms"
            for b, u in pairs
        )
        print(
            f"(3) batched vs unbatched by clients ({detail}): throughput never lower: {verdict(thr)}; "
            f"p99 never higher at >= 8 clients: {verdict(p99)}"
        )
    one = by.get(("batched", 1, 1))
    if one:
        b1 = bare["latency_b1"]["service options"]["p50_ms"]
        print(
            f"(4) 1 client p50 {one.p50_ms:.3f} ms vs bare batch-1 p50 {b1:.3f} ms + 1 ms: "
            f"{verdict(one.p50_ms <= b1 + 1.0)} (overhead {one.p50_ms - b1:.3f} ms)"
        )


if __name__ == "__main__":
    sys.exit(main())
