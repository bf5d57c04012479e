"""GPU check: does the service really run on CUDA, does CUDA agree with the CPU, and how fast is each?

    python -m deploy.gpu_check --repository models                  # NVIDIA GPU + onnxruntime-gpu (`gpu` extra)
    python -m deploy.gpu_check --repository models --provider cpu   # dry run: the same steps, CPU against CPU
    docker compose run --rm api python -m deploy.gpu_check --repository /models   # inside the GPU image

1. onnxruntime: version, providers offered, the CUDA version the wheel was built for.
2. Each image classifier of the repository, straight on onnxruntime: the same random inputs through a
   CPU session and a session of the checked provider, both made by ``service.runtime.create_session``
   as the service makes them: max |delta| of every output and top-1 agreement.
3. Two services (``python -m service``): the checked one (``ATTNSERVE_EXECUTION_PROVIDER=cuda``,
   ``ATTNSERVE_REQUIRE_GPU=true``) and a CPU one. ``GET /models`` must show every model ready on the
   checked provider.
4. From both services: the top-3 of the real test images the classifier's manifest lists
   (``samples``), and greedy translations of the first sentences of ``benchmarks/translate_sentences.txt``.
5. Throughput of ``POST /classify`` and ``POST /translate`` on each service: concurrent clients for a
   fixed time.
6. Decoding with and without the device-resident cache (``ATTNSERVE_DECODER_CACHE``): the bare loop of
   each translator on the checked provider, host cache against device cache, at ``--decoding-batches``
   sentences, greedy and beam 4: tokens/s of each and whether both decoded the same tokens; and, with
   ``--extra-decoder-cache``, a third service whose cache is elsewhere than the checked one's, checked
   and loaded like the others.

Exit status 0 when every check passed, 1 otherwise. Needs only the serving dependencies (numpy,
Pillow, onnxruntime or onnxruntime-gpu): no torch, no httpx.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import io
import json
import os
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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = ROOT / "benchmarks" / "translate_sentences.txt"
CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"
# Settings this check chooses for its own services; inherited values would contradict it (the
# attention store is unused here, and a Redis named by the environment may not be running).
OWN_SETTINGS = {
    "ATTNSERVE_HOST",
    "ATTNSERVE_PORT",
    "ATTNSERVE_GRPC_PORT",
    "ATTNSERVE_MODEL_REPOSITORY",
    "ATTNSERVE_EXECUTION_PROVIDER",
    "ATTNSERVE_REQUIRE_GPU",
    "ATTNSERVE_DECODER_CACHE",
    "ATTNSERVE_ATTENTION_STORE",
    "ATTNSERVE_REDIS_URL",
}


@dataclass
class Report:
    checks: list[dict] = field(default_factory=list)
    data: dict = field(default_factory=dict)

    def check(self, name: str, ok: bool, detail: str) -> bool:
        self.checks.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)
        return ok

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c["ok"] for c in self.checks)


# --- 1. onnxruntime --------------------------------------------------------------------------------
def runtime_info() -> dict:
    import onnxruntime as ort

    info = {"onnxruntime": ort.__version__, "providers": ort.get_available_providers(), "device": ort.get_device()}
    try:
        from onnxruntime.capi import build_and_package_info as build
    except ImportError:
        return info
    return {
        **info,
        "package": getattr(build, "package_name", None),
        "cuda_version": getattr(build, "cuda_version", None),
    }


# --- 2. classifiers straight on onnxruntime ----------------------------------------------------------
def compare_outputs(reference: dict[str, np.ndarray], checked: dict[str, np.ndarray]) -> dict:
    """max |delta| per output, and the share of rows whose top-1 of the first output agrees."""
    diffs = {k: float(np.max(np.abs(reference[k].astype(np.float64) - checked[k]))) for k in reference}
    first = next(iter(reference))
    agree = float(np.mean(reference[first].argmax(-1) == checked[first].argmax(-1)))
    return {"max_abs_diff": diffs, "top1_agreement": agree}


def compare_classifiers(repository: Path, provider: str, batch_sizes=(1, 16), seed: int = 0) -> list[dict]:
    from contract.manifest import latest_versions, load_entry
    from service.runtime import create_session
    from service.settings import Settings

    reference = Settings(execution_provider="cpu")
    checked = Settings(execution_provider="cuda" if provider == CUDA else "cpu", require_gpu=provider == CUDA)
    rng = np.random.default_rng(seed)
    results = []
    for entry_dir in latest_versions(repository):
        entry = load_entry(entry_dir)  # verifies every file's sha256, as the service does
        if entry.manifest.task != "image-classification":
            continue
        graph = entry.manifest.graphs["model"]
        spec = graph.inputs[0]
        ref, chk = (create_session(entry.path / graph.file, s) for s in (reference, checked))
        names = [o.name for o in ref.session.get_outputs()]
        worst: dict = {"max_abs_diff": dict.fromkeys(names, 0.0), "top1_agreement": 1.0}
        for n in batch_sizes:
            x = rng.standard_normal([n if isinstance(d, str) else d for d in spec.shape]).astype(np.float32)
            a, b = (dict(zip(names, h.session.run(names, {spec.name: x}))) for h in (ref, chk))
            r = compare_outputs(a, b)
            worst["max_abs_diff"] = {k: max(worst["max_abs_diff"][k], v) for k, v in r["max_abs_diff"].items()}
            worst["top1_agreement"] = min(worst["top1_agreement"], r["top1_agreement"])
        results.append(
            {
                "model": f"{entry.name}/{entry.version}",
                "provider": chk.provider,
                "inputs": int(sum(batch_sizes)),
                **worst,
            }
        )
    return results


# --- 3. services ----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Service:
    label: str
    url: str
    proc: subprocess.Popen
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def start_service(label: str, repository: Path, provider: str, log_dir: Path, decoder_cache: str = "auto") -> Service:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in OWN_SETTINGS}
    env.update(
        {
            "ATTNSERVE_HOST": "127.0.0.1",
            "ATTNSERVE_PORT": str(port),
            "ATTNSERVE_GRPC_PORT": "0",  # HTTP is what it checks; two services at once would share 8001
            "ATTNSERVE_DRAIN_DELAY_S": "0",  # no load balancer in front: stop at once
            "ATTNSERVE_MODEL_REPOSITORY": str(repository),
            "ATTNSERVE_EXECUTION_PROVIDER": "cuda" if provider == CUDA else "cpu",
            "ATTNSERVE_REQUIRE_GPU": "true" if provider == CUDA else "false",
            "ATTNSERVE_DECODER_CACHE": decoder_cache,
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        }
    )
    log = log_dir / f"service-{label}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "service"], cwd=ROOT, env=env, stdout=out, stderr=out)
    return Service(label, f"http://127.0.0.1:{port}", proc, log)


def call(url: str, method: str = "GET", body: dict | None = None, timeout: float = 120) -> tuple[int, dict | None]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None


def wait_ready(service: Service, timeout: float) -> str | None:
    """None once ``/readyz`` answers 200; otherwise why not (the process died, or the time ran out)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if service.proc.poll() is not None:
            return f"exited with status {service.proc.returncode}:\n{service.log_tail()}"
        try:
            if call(service.url + "/readyz", timeout=5)[0] == 200:
                return None
        except OSError:
            pass
        time.sleep(0.2)
    return f"not ready after {timeout:.0f} s:\n{service.log_tail()}"


def provider_problems(models: list[dict], expected: str) -> list[str]:
    """What keeps ``GET /models`` from showing every served model ready on ``expected``."""
    problems = [] if models else ["no model is loaded"]
    for m in models:
        key = f"{m.get('name')}/{m.get('version')}"
        if m.get("status") == "unsupported":
            continue
        if m.get("status") != "ready":
            problems.append(f"{key} is {m.get('status')} ({m.get('reason')})")
        elif m.get("provider") != expected:
            problems.append(f"{key} runs on {m.get('provider')}, not {expected}")
    return problems


# --- 5. load ---------------------------------------------------------------------------------------
def png_b64(size: int, channels: int, seed: int) -> str:
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size, size, channels) if channels > 1 else (size, size), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def sample_images(repository: Path) -> list[str]:
    """The real test images an image classifier's manifest lists (``samples``), base64-encoded."""
    from contract.manifest import latest_versions, read_manifest

    for entry in latest_versions(repository):
        manifest = read_manifest(entry)
        if manifest.get("task") == "image-classification" and manifest.get("samples"):
            return [base64.b64encode((entry / s["file"]).read_bytes()).decode() for s in manifest["samples"]]
    return []


def load(url: str, path: str, bodies: list[dict], units, concurrency: int, seconds: float) -> dict:
    """``concurrency`` clients, each on its own keep-alive connection, posting for ``seconds``."""
    host, port = url.removeprefix("http://").split(":")
    payloads = [json.dumps(b).encode() for b in bodies]
    latencies: list[float] = []
    totals = {"units": 0, "errors": 0}
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def client(i: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        k = i
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            try:
                conn.request("POST", path, payloads[k % len(payloads)], {"Content-Type": "application/json"})
                resp = conn.getresponse()
                body = resp.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                resp, body = None, b""
            dt = time.perf_counter() - t0
            with lock:
                if resp is not None and resp.status == 200:
                    latencies.append(dt)
                    totals["units"] += units(json.loads(body))
                else:
                    totals["errors"] += 1
            k += concurrency
        conn.close()

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    lat = np.array(latencies) * 1000 if latencies else np.array([np.nan])
    return {
        "requests": len(latencies),
        "errors": totals["errors"],
        "req_per_s": len(latencies) / elapsed,
        "units_per_s": totals["units"] / elapsed,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
    }


# --- the check ------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> Report:
    rep = Report()
    provider = CUDA if args.provider == "cuda" else CPU
    info = rep.data["runtime"] = runtime_info()
    print(
        f"onnxruntime {info['onnxruntime']} ({info.get('package', '?')}, built for CUDA "
        f"{info.get('cuda_version') or '-'}), providers {info['providers']}",
        flush=True,
    )
    if not rep.check("provider offered", provider in info["providers"], f"{provider} in {info['providers']}"):
        return rep

    try:
        classifiers = rep.data["classifiers"] = compare_classifiers(args.repository, provider)
    except Exception as e:  # noqa: BLE001 - a check reports any failure (CPU fallback, bad file, onnxruntime error)
        rep.check(f"classifier sessions on {provider}", False, f"{type(e).__name__}: {e}")
        return rep
    for c in classifiers:
        worst = max(c["max_abs_diff"].values())
        rep.check(f"{c['model']} session provider", c["provider"] == provider, c["provider"])
        rep.check(
            f"{c['model']} {args.provider} vs cpu outputs",
            worst <= args.atol and c["top1_agreement"] == 1.0,
            f"max |delta| {', '.join(f'{k} {v:.2e}' for k, v in c['max_abs_diff'].items())} (atol {args.atol}); "
            f"top-1 agreement {c['top1_agreement']:.0%} on {c['inputs']} random inputs",
        )

    log_dir = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    services = [
        start_service(args.provider, args.repository, provider, log_dir, args.decoder_cache),
        start_service("cpu-reference", args.repository, CPU, log_dir),
    ]
    if args.extra_decoder_cache:
        label = f"{args.provider}-{args.extra_decoder_cache}-cache"
        services.append(start_service(label, args.repository, provider, log_dir, args.extra_decoder_cache))
    try:
        for s in services:
            why = wait_ready(s, args.startup_timeout)
            if not rep.check(f"service {s.label} ready", why is None, why or s.url):
                return rep
        checked, reference, *extra = services
        models = call(checked.url + "/models")[1]["models"]
        rep.data["models"] = [{k: m.get(k) for k in ("name", "version", "task", "status", "provider")} for m in models]
        problems = provider_problems(models, provider)
        rep.check(
            f"GET /models on {provider}",
            not problems,
            "; ".join(problems) or ", ".join(f"{m['name']}/{m['version']} {m['provider']}" for m in rep.data["models"]),
        )
        tasks = {m.get("task"): m for m in models if m.get("status") == "ready"}
        images = sample_images(args.repository)
        if not images and "image-classification" in tasks:
            spec = tasks["image-classification"].get("input") or {"image_size": 28, "channels": 1}
            images = [png_b64(spec["image_size"], spec["channels"], i) for i in range(8)]

        if "image-classification" in tasks:
            got = [
                [call(s.url + "/classify", "POST", {"images": [im], "top_k": 3}) for im in images]
                for s in (checked, reference)
            ]
            ok = all(code == 200 for answers in got for code, _ in answers)
            top = [[body["results"][0]["top_k"] for _, body in answers] if ok else [] for answers in got]
            same = sum(a[0]["index"] == b[0]["index"] for a, b in zip(*top))
            delta = max((abs(x["score"] - y["score"]) for a, b in zip(*top) for x, y in zip(a, b)), default=0.0)
            rep.data["classify"] = {checked.label: top[0], reference.label: top[1]}
            rep.check(
                f"POST /classify {args.provider} vs cpu",
                ok and same == len(images) and delta <= args.atol,
                f"top-1 identical on {same}/{len(images)} images, max |delta score| {delta:.2e}"
                if ok
                else "a request failed",
            )

        if "translation" in tasks:
            texts = [t for t in SENTENCES.read_text().splitlines() if t.strip()][: args.sentences]
            rep.data["translations"] = {"texts": texts}
            for s in (checked, *extra):
                out = [call(x.url + "/translate", "POST", {"texts": texts, "beam_size": 1}) for x in (s, reference)]
                got = [[r["translation"] for r in body["results"]] if code == 200 else None for code, body in out]
                differ = [(t, a, b) for t, a, b in zip(texts, *got)] if None not in got else []
                differ = [d for d in differ if d[1] != d[2]]
                rep.data["translations"] |= {s.label: got[0], reference.label: got[1]}
                rep.check(
                    f"greedy translations {s.label} vs cpu",
                    None not in got and len(differ) <= args.max_translation_mismatches,
                    f"{len(texts) - len(differ)}/{len(texts)} identical" if None not in got else f"HTTP {out}",
                )
                for t, a, b in differ:
                    print(f"    {t!r}\n      {s.label}: {a!r}\n      cpu: {b!r}")

        rep.data["throughput"] = {}
        print(f"throughput: {args.concurrency} concurrent clients, {args.seconds:g} s per endpoint and service")
        print(
            f"  {'service':<14}{'endpoint':<12}{'req/s':>9}{'units/s':>10}  unit   {'p50 ms':>8}{'p99 ms':>8}{'errors':>7}"
        )
        for s in services:
            runs = {}
            if "image-classification" in tasks:
                bodies = [{"images": [im], "top_k": 1} for im in images]
                runs["classify"] = (
                    "image",
                    load(s.url, "/classify", bodies, lambda b: len(b["results"]), args.concurrency, args.seconds),
                )
            if "translation" in tasks:
                texts = [t for t in SENTENCES.read_text().splitlines() if t.strip()]
                bodies = [{"text": t, "beam_size": 1} for t in texts]
                runs["translate"] = (
                    "token",
                    load(
                        s.url,
                        "/translate",
                        bodies,
                        lambda b: sum(len(r["target_tokens"]) for r in b["results"]),
                        args.concurrency,
                        args.seconds,
                    ),
                )
            for name, (unit, r) in runs.items():
                print(
                    f"  {s.label:<14}{name:<12}{r['req_per_s']:>9.1f}{r['units_per_s']:>10.1f}  {unit:<6}"
                    f"{r['p50_ms']:>8.2f}{r['p99_ms']:>8.2f}{r['errors']:>7}",
                    flush=True,
                )
                rep.data["throughput"][f"{s.label}/{name}"] = r
                rep.check(
                    f"load {s.label} {name}",
                    r["requests"] > 0 and r["errors"] == 0,
                    f"{r['requests']} answered, {r['errors']} failed",
                )
    finally:
        for s in services:
            s.stop()
    if args.decoding_batches:
        compare_decoder_caches(rep, args, provider)
    return rep


# --- 6. decoding with and without the device-resident cache ------------------------------------------
def decode_rate(encoder, decoder, spec, sources: list[list[int]], beam: int) -> tuple[float, list[list[int]]]:
    """(generated tokens per second, eos included, the tokens) of decoding ``sources`` to their natural ends."""
    from contract.decoding import DecodeRequest, run_to_end

    reqs = [DecodeRequest(s, spec.max_length(len(s)), beam=beam) for s in sources]
    start = time.perf_counter()
    run_to_end(encoder, decoder, reqs, spec)
    seconds = time.perf_counter() - start
    tokens = [r.results()[0].tokens for r in reqs]
    return sum(len(t) + 1 for t in tokens) / seconds, tokens


def compare_decoder_caches(rep: Report, args: argparse.Namespace, provider: str) -> None:
    """The bare decoding loop of each translator on the checked provider, its cache on the host and on the
    device, the path run first alternating: median tokens/s over the rounds, and the same tokens on both."""
    from contract.decoding import DecoderSpec, decoding_outputs, session_fn
    from contract.manifest import latest_versions, load_entry
    from contract.tokenizer import load_tokenizer
    from service.engine.resident import CacheGraphs, ResidentDecoder, ResidentEncoder
    from service.runtime import create_session
    from service.settings import Settings

    settings = Settings(execution_provider="cuda" if provider == CUDA else "cpu", require_gpu=provider == CUDA)
    texts = [t for t in SENTENCES.read_text().splitlines() if t.strip()]
    rep.data["decoding"] = []
    for entry_dir in latest_versions(args.repository):
        entry = load_entry(entry_dir)
        if entry.manifest.task != "translation":
            continue
        spec, out = DecoderSpec.from_manifest(entry.manifest), decoding_outputs(entry.manifest.decoding.layers)
        enc, dec = (
            create_session(entry.path / entry.manifest.graphs[g].file, settings).session for g in ("encoder", "decoder")
        )
        paths = {
            "host": (session_fn(enc, out["encoder"]), session_fn(dec, out["decoder"])),
            "device": (
                ResidentEncoder(enc, list(out["encoder"]), CacheGraphs(enc, dec, spec.layers)),
                ResidentDecoder(dec, list(out["decoder"])),
            ),
        }
        tokenizer = load_tokenizer(entry.path, entry.manifest.tokenizer)
        print(f"decoding {entry.name}/{entry.version} on {provider}: tok/s, cache on the host vs on the device")
        for batch in args.decoding_batches:
            sources = tokenizer.encode_batch([texts[i % len(texts)] for i in range(batch)], add_eos=True)
            for beam in (1, 4):
                for path in paths.values():  # untimed: onnxruntime's first runs at these shapes
                    decode_rate(*path, spec, sources[:2], beam)
                rates: dict[str, list[float]] = {"host": [], "device": []}
                tokens: dict[str, list] = {}
                for r in range(args.decoding_rounds):
                    for key in sorted(paths, reverse=r % 2 == 1):
                        rate, tokens[key] = decode_rate(*paths[key], spec, sources, beam)
                        rates[key].append(rate)
                host, device = (statistics.median(rates[k]) for k in ("host", "device"))
                row = {"model": f"{entry.name}/{entry.version}", "batch": batch, "beam": beam, "host_tok_s": host}
                row |= {"device_tok_s": device, "device_over_host": device / host, "rounds": rates}
                rep.data["decoding"].append(row)
                print(
                    f"  batch {batch:>3} {'greedy' if beam == 1 else 'beam 4':<7}{host:>10.0f}{device:>10.0f}  {device / host:.2f}x"
                )
                rep.check(
                    f"decoding {entry.name}/{entry.version} batch {batch} beam {beam}: device cache vs host",
                    tokens["device"] == tokens["host"],
                    f"same tokens on {sum(a == b for a, b in zip(tokens['device'], tokens['host']))}/{batch} sentences",
                )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--repository", type=Path, default=Path("models"), help="model repository (default: %(default)s)")
    p.add_argument(
        "--provider",
        choices=["cuda", "cpu"],
        default="cuda",
        help="provider checked against the CPU; `cpu` is a dry run of every step (default: %(default)s)",
    )
    p.add_argument(
        "--atol",
        type=float,
        default=2e-2,
        help="largest |delta| of any classifier output, checked vs CPU (CUDA may use TF32; default %(default)s)",
    )
    p.add_argument(
        "--sentences", type=int, default=8, help="sentences translated by both services (default %(default)s)"
    )
    p.add_argument(
        "--max-translation-mismatches",
        type=int,
        default=0,
        help="greedy translations allowed to differ between the two (default %(default)s)",
    )
    p.add_argument("--concurrency", type=int, default=16, help="load clients (default %(default)s)")
    p.add_argument(
        "--seconds", type=float, default=10.0, help="load time per endpoint and service (default %(default)s)"
    )
    p.add_argument(
        "--decoder-cache",
        choices=["auto", "host", "device"],
        default="auto",
        help="ATTNSERVE_DECODER_CACHE of the checked service (default %(default)s: device on CUDA)",
    )
    p.add_argument(
        "--extra-decoder-cache",
        choices=["host", "device"],
        help="also check and load a third service on the checked provider with this decoder cache",
    )
    p.add_argument(
        "--decoding-batches",
        type=lambda v: [int(x) for x in v.split(",") if x.strip()],
        help="sentences per bare decoding loop, host vs device cache, e.g. 1,16,64 "
        "(default: 1,16,64 on CUDA, none in a CPU dry run; '' for none)",
    )
    p.add_argument("--decoding-rounds", type=int, default=3, help="rounds of each decoding loop (default %(default)s)")
    p.add_argument("--startup-timeout", type=float, default=300.0, help="seconds to wait for /readyz")
    p.add_argument("--json", type=Path, help="also write every check and figure to this file")
    args = p.parse_args(argv)
    args.repository = args.repository.resolve()
    if args.decoding_batches is None:
        args.decoding_batches = [1, 16, 64] if args.provider == "cuda" else []
    rep = run(args)
    failed = [c["check"] for c in rep.checks if not c["ok"]]
    print("GPU check: " + ("every check passed" if rep.ok else f"FAILED: {', '.join(failed) or 'nothing was checked'}"))
    if args.json:
        args.json.write_text(
            json.dumps(
                {"ok": rep.ok, "args": {k: str(v) for k, v in vars(args).items()}, "checks": rep.checks, **rep.data},
                indent=2,
            )
        )
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
