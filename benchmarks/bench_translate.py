"""Benchmark translation decoding, bare and through the service, in one run.

``python -m benchmarks.bench_translate --repository models``

1. Bare onnxruntime (the service's own decoding loop, ``contract/decoding.py``, on the entry's
   sessions with the service's session options): tokens/s of KV-cache decoding vs re-running the
   whole prefix each step (``decoder_prefix.onnx``, no cache) at 16, 32 and 64 generated tokens;
   tokens/s at batch 1 and 16, greedy and beam 4, 20 and 64 tokens (fixed lengths: end-of-sentence
   is ignored so every configuration generates exactly that many tokens); the batching ceiling (the
   bare loop on the service's 32 sentences at once vs one by one); and PyTorch eager cached greedy
   decoding. The same configurations against CTranslate2 are ``benchmarks/bench_ctranslate2.py``.
2. The service (``python -m service`` in a subprocess): the same 32 real test sentences sent one at
   a time vs by 32 concurrent clients (continuous batching) vs the same concurrency with
   ``ATTNSERVE_DECODE_BATCHING=static``; the service's one-at-a-time latency vs the bare loop at
   batch 1 on the same sentences; the time to the first streamed token; and the latency of the
   32 sentences arriving 10 ms apart, continuous vs static batching.
Every figure is the median of ``--rounds`` interleaved rounds. A table is printed at the end.

``--decoder-cache`` compares the two decoding paths of the service on the entry instead: the bare loop with
its key/value caches on the session's device (``service/engine/resident.py``: OrtValues, IO binding)
against the numpy one, batch 1, 16 and 64 of the real sentences, greedy and beam 4, natural lengths,
the path run first alternating; both must decode the same tokens.

``--against models/translator/N`` compares two entries instead (a new version against the one it
replaces, an int8 variant against its fp32 entry): the bare loop of each on the same configurations,
both loaded afresh every round and run in alternating order, with the service sentences at their
natural lengths (the encoder included) beside them; the same entry against itself reads 0.98-1.02x.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from contract.decoding import (
    DecodeRequest,
    DecoderSpec,
    Graph,
    decoding_outputs,
    pad_sources,
    run_to_end,
    session_fn,
)
from contract.manifest import load_entry
from contract.tokenizer import Tokenizer
from service.engine.resident import CacheGraphs, ResidentDecoder, ResidentEncoder
from service.runtime import create_session
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = (Path(__file__).parent / "translate_sentences.txt").read_text().splitlines()
STAGGER_S = 0.01  # arrival gap of the staggered-arrival comparison


def without_eos(decoder: Graph, eos: int) -> Graph:
    """The step graph with end-of-sentence ruled out, so every sentence decodes exactly ``max_new_tokens``
    tokens: timings at a fixed length (in place, on onnxruntime's fresh output array)."""

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = decoder(feeds)
        out["log_probs"][:, eos] = -np.inf
        return out

    return run


class Bare:
    """The entry's three graphs on sessions built like the service builds them."""

    def __init__(self, entry_dir: Path, settings: Settings) -> None:
        entry = load_entry(entry_dir)
        m, self.path = entry.manifest, entry_dir
        self.sessions = {k: create_session(entry_dir / v.file, settings).session for k, v in m.graphs.items()}
        g = {k: session_fn(s) for k, s in self.sessions.items()}
        self.encoder, self.decoder, self.prefix = g["encoder"], g["decoder"], g.get("decoder_prefix")
        self.spec = DecoderSpec.from_manifest(m)
        self.fixed_length_decoder = without_eos(self.decoder, self.spec.eos_id)
        self.tok = Tokenizer.load(entry_dir / m.tokenizer.file)
        self.manifest = m

    def sources(self, n: int) -> list[list[int]]:
        return [self.tok.encode(SENTENCES[i % len(SENTENCES)], add_eos=True) for i in range(n)]

    def cached(self, sources: list[list[int]], tokens: int, beam: int = 1) -> float:
        """Seconds to generate exactly ``tokens`` per sentence with the KV cache."""
        reqs = [DecodeRequest(s, tokens, beam=beam) for s in sources]
        start = time.perf_counter()
        run_to_end(self.encoder, self.fixed_length_decoder, reqs, self.spec)
        return time.perf_counter() - start

    def natural(self, sources: list[list[int]], beam: int = 1) -> tuple[float, int]:
        """(seconds, generated tokens with their eos) to decode ``sources`` to their natural ends, encoder included."""
        reqs = [DecodeRequest(s, self.spec.max_length(len(s)), beam=beam) for s in sources]
        start = time.perf_counter()
        done = run_to_end(self.encoder, self.decoder, reqs, self.spec)
        return time.perf_counter() - start, sum(len(r.results()[0].tokens) + 1 for r in done)

    def resident(self) -> tuple[Graph, Graph]:
        """The encoder and decoder as the service's device-resident path runs them (``ATTNSERVE_DECODER_CACHE=device``)."""
        out = decoding_outputs(self.spec.layers)
        enc, dec = self.sessions["encoder"], self.sessions["decoder"]
        graphs = CacheGraphs(enc, dec, self.spec.layers)
        return ResidentEncoder(enc, list(out["encoder"]), graphs), ResidentDecoder(dec, list(out["decoder"]))

    def uncached(self, sources: list[list[int]], tokens: int) -> float:
        """Seconds for greedy decoding that re-runs the whole prefix at every step (no cache)."""
        start = time.perf_counter()
        ids, mask = pad_sources(sources, self.spec.pad_id)
        enc = self.encoder({"src_ids": ids, "src_mask": mask})
        tgt = np.full((len(sources), 1), self.spec.bos_id, dtype=np.int64)
        for _ in range(tokens):
            out = self.prefix(
                {"tgt_ids": tgt, "cross_keys": enc["cross_keys"], "cross_values": enc["cross_values"], "src_mask": mask}
            )
            last = out["log_probs"][:, -1]
            last[:, self.spec.eos_id] = -np.inf
            tgt = np.concatenate([tgt, last.argmax(-1)[:, None]], axis=1)
        return time.perf_counter() - start


def torch_greedy(checkpoint: Path, sources: list[list[int]], threads: int) -> tuple[float, int] | None:
    """PyTorch eager cached greedy decoding (natural lengths): (seconds, tokens), or None without torch."""
    try:
        import torch

        from model.seq2seq import Seq2Seq, Seq2SeqConfig, greedy_decode
    except ImportError:
        return None
    if not checkpoint.is_file():
        return None
    torch.set_num_threads(threads)
    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=False)
    model = Seq2Seq(Seq2SeqConfig.from_dict(ckpt["config"])).eval()
    model.load_state_dict(ckpt["state_dict"])
    src = torch.from_numpy(pad_sources(sources, 0)[0])
    start = time.perf_counter()
    out = greedy_decode(model, src, max_len=int(src.shape[1] * 1.5) + 10)
    return time.perf_counter() - start, sum(len(o) + 1 for o in out)


def median_of(rounds: int, fn) -> float:
    return statistics.median(fn() for _ in range(rounds))


# ---- the service ------------------------------------------------------------------------------


def start_service(
    repository: Path, workdir: Path, module: str = "service", **settings: str
) -> tuple[subprocess.Popen, str]:
    """``python -m MODULE`` serving ``repository`` on a free port; returns it and its URL once ready."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "ATTNSERVE_PORT": str(port),
        "ATTNSERVE_GRPC_PORT": "0",  # HTTP is measured; a gRPC server on the shared 8001 would clash
        "ATTNSERVE_DRAIN_DELAY_S": "0",  # no load balancer in front: stop at once
        "ATTNSERVE_MODEL_REPOSITORY": str(repository),
        "ATTNSERVE_ACCESS_LOG": "false",
        **{f"ATTNSERVE_{k.upper()}": str(v) for k, v in settings.items()},
    }
    log = open(workdir / f"service-{port}.log", "w")  # noqa: SIM115 - owned by the process
    proc = subprocess.Popen([sys.executable, "-m", module], cwd=ROOT, env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"service did not become ready; see {log.name}")


async def one_at_a_time(url: str, texts: list[str]) -> tuple[float, list[dict]]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        start, out = time.perf_counter(), []
        for t in texts:
            out.append((await client.post("/translate", json={"text": t, "beam_size": 1})).json())
        return time.perf_counter() - start, out


async def concurrently(url: str, texts: list[str]) -> tuple[float, list[dict]]:
    limits = httpx.Limits(max_connections=len(texts))
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        start = time.perf_counter()
        out = await asyncio.gather(*(client.post("/translate", json={"text": t, "beam_size": 1}) for t in texts))
        return time.perf_counter() - start, [r.json() for r in out]


async def staggered(url: str, texts: list[str], gap_s: float) -> list[float]:
    """Latency of each request when they arrive ``gap_s`` apart (not all at once)."""
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=httpx.Limits(max_connections=len(texts))) as client:

        async def one(i: int, text: str) -> float:
            await asyncio.sleep(i * gap_s)
            start = time.perf_counter()
            r = await client.post("/translate", json={"text": text, "beam_size": 1})
            r.raise_for_status()
            return time.perf_counter() - start

        return list(await asyncio.gather(*(one(i, t) for i, t in enumerate(texts))))


async def first_token(url: str, text: str) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        start = time.perf_counter()
        async with client.stream("POST", "/translate", json={"text": text, "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("event: token"):
                    return time.perf_counter() - start
    raise RuntimeError("no token event")


def generated(answers: list[dict]) -> int:
    return sum(len(a["results"][0]["target_tokens"]) + 1 for a in answers)


# ---- main -------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_translate", description=__doc__.splitlines()[0])
    p.add_argument("--repository", type=Path, default=Path("models"))
    p.add_argument("--name", default="translator")
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=Path("checkpoints/translator-default/best.pt"),
        help="for the PyTorch eager comparison (skipped when absent)",
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--skip-service", action="store_true")
    p.add_argument("--against", type=Path, metavar="ENTRY", help="compare the bare loop with this entry's, only")
    p.add_argument(
        "--decoder-cache", action="store_true", help="compare the device-resident decoder cache with the host one, only"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    entry_dir = max((args.repository / args.name).iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    settings = Settings()
    bare = Bare(entry_dir, settings)
    rows: list[tuple[str, str]] = []
    print(
        f"{args.name}/{entry_dir.name}: {bare.manifest.model['parameters']:,} parameters; onnxruntime threads as the "
        f"service ({settings.intra_op_threads or 'cores-1'}); {os.cpu_count()} cores",
        file=sys.stderr,
    )

    if args.against or args.decoder_cache:
        rows = (
            compare_caches(bare, args.rounds)
            if args.decoder_cache
            else compare_entries(entry_dir, args.against, settings, args.rounds)
        )
        width = max(len(k) for k, _ in rows)
        print()
        for k, v in rows:
            print(f"{k:<{width}}  {v}")
        return 0
    for batch in (1, 16):
        src = bare.sources(batch)
        for n in (16, 32, 64):
            c = median_of(args.rounds, lambda src=src, n=n: bare.cached(src, n))
            u = median_of(args.rounds, lambda src=src, n=n: bare.uncached(src, n))
            rows.append(
                (
                    f"batch {batch}, {n} tokens: cached vs uncached decoding",
                    f"{batch * n / c:,.0f} vs {batch * n / u:,.0f} tok/s = {u / c:.2f}x",
                )
            )
    for batch in (1, 16):
        src = bare.sources(batch)
        for beam in (1, 4):
            for n in (20, 64):
                t = median_of(args.rounds, lambda src=src, n=n, beam=beam: bare.cached(src, n, beam))
                rows.append(
                    (
                        f"bare loop, batch {batch}, {'greedy' if beam == 1 else 'beam 4'}, {n} tokens",
                        f"{batch * n / t:,.0f} tok/s ({t * 1000 / n:.2f} ms/step)",
                    )
                )
    rows.append(batching_ceiling(args, bare))
    src = bare.sources(16)
    torch_run = torch_greedy(args.checkpoint, src, max(1, (os.cpu_count() or 2) - 1))
    if torch_run is not None:
        ort_runs = [bare.natural(src) for _ in range(args.rounds)]
        ort_t, ort_tokens = statistics.median(t for t, _ in ort_runs), ort_runs[0][1]
        torch_t, torch_tokens = torch_run
        rows.append(
            (
                "batch 16 greedy, natural lengths: onnxruntime loop vs PyTorch eager (cached)",
                f"{ort_tokens / ort_t:,.0f} vs {torch_tokens / torch_t:,.0f} tok/s = {(ort_tokens / ort_t) / (torch_tokens / torch_t):.2f}x",
            )
        )

    if not args.skip_service:
        rows += service_rows(args, bare)
    width = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


def compare_caches(bare: Bare, rounds: int) -> list[tuple[str, str]]:
    """Tokens/s of the bare loop with the decoder cache on the device and on the host; device ÷ host.

    Both paths run on the same sessions, the one run first alternating from configuration to configuration
    and round to round; a mismatch in the decoded tokens is an error, not a figure."""
    paths = {"device": bare.resident(), "host": (bare.encoder, bare.decoder)}
    configs = [(b, k) for b in (1, 16, 64) for k in (1, 4)]
    runs: dict[tuple, dict[str, list[float]]] = {c: {"device": [], "host": []} for c in configs}
    # untimed: the first runs at a shape pay onnxruntime's set-up (and the device path's graphs)
    for batch, beam in configs:
        for encoder, decoder in paths.values():
            run_to_end(encoder, decoder, [DecodeRequest(s, 8, beam=beam) for s in bare.sources(batch)], bare.spec)
    for i in range(rounds):
        for j, (batch, beam) in enumerate(configs):
            sources = bare.sources(batch)
            tokens = {}
            for key in sorted(paths, reverse=(i + j) % 2 == 1):
                reqs = [DecodeRequest(s, bare.spec.max_length(len(s)), beam=beam) for s in sources]
                start = time.perf_counter()
                run_to_end(*paths[key], reqs, bare.spec)
                seconds = time.perf_counter() - start
                tokens[key] = [r.results()[0].tokens for r in reqs]
                runs[(batch, beam)][key].append(sum(len(t) + 1 for t in tokens[key]) / seconds)
            if tokens["device"] != tokens["host"]:
                raise SystemExit(f"batch {batch}, beam {beam}: the device path decoded other tokens than the host's")
    rows = []
    for (batch, beam), got in runs.items():
        speed = {k: statistics.median(v) for k, v in got.items()}
        ratios = [d / h for d, h in zip(got["device"], got["host"], strict=True)]
        figures = f"{speed['device']:,.0f} vs {speed['host']:,.0f} tok/s = {speed['device'] / speed['host']:.2f}x"
        name = f"decoder cache device vs host, batch {batch}, {'greedy' if beam == 1 else 'beam 4'}, natural lengths"
        rows.append((name, f"{figures} (rounds {min(ratios):.2f}x-{max(ratios):.2f}x)"))
    return rows


def compare_entries(new_dir: Path, old_dir: Path, settings: Settings, rounds: int) -> list[tuple[str, str]]:
    """Tokens/s of the bare loop of two entries; new ÷ old.

    Each round loads both entries afresh, the one loaded first alternating, and runs every
    configuration on both, the one run first alternating: with sessions kept for all rounds, an entry
    compared with itself measured 0.91-0.99x (the sessions created first ran slower throughout)."""
    configs = [(b, k, n) for b in (1, 16) for k in (1, 4) for n in (20, 64, None)]
    runs: dict[tuple, dict[str, list[tuple[float, int]]]] = {c: {"new": [], "old": []} for c in configs}
    for i in range(rounds):
        order = [("new", new_dir), ("old", old_dir)][:: -1 if i % 2 else 1]
        loaded = [(key, Bare(path, settings)) for key, path in order]
        for batch, beam, n in configs:
            for key, bare in loaded[:: -1 if (i + batch + beam) % 2 else 1]:
                if n is None:  # the service sentences as they come (2 for batch 1, all 32 for 16)
                    sources = [bare.tok.encode(t, add_eos=True) for t in SENTENCES[: 2 * batch]]
                    runs[(batch, beam, n)][key].append(bare.natural(sources, beam))
                else:
                    runs[(batch, beam, n)][key].append((bare.cached(bare.sources(batch), n, beam), batch * n))
        del loaded
    names = f"{new_dir.parent.name}/{new_dir.name} vs {old_dir.parent.name}/{old_dir.name}"
    rows = []
    for (batch, beam, n), got in runs.items():
        speed = {k: statistics.median(tokens / t for t, tokens in v) for k, v in got.items()}
        ratios = [a[1] / a[0] / (b[1] / b[0]) for a, b in zip(got["new"], got["old"], strict=True)]
        what = f"{n} tokens" if n else f"{2 * batch} service sentences, natural lengths"
        figures = f"{speed['new']:,.0f} vs {speed['old']:,.0f} tok/s = {speed['new'] / speed['old']:.2f}x"
        spread = f"(rounds {min(ratios):.2f}x-{max(ratios):.2f}x)"
        rows.append((f"{names}, batch {batch}, {'greedy' if beam == 1 else 'beam 4'}, {what}", f"{figures} {spread}"))
    return rows


def batching_ceiling(args: argparse.Namespace, bare: Bare) -> tuple[str, str]:
    """What batching can give at all on this machine: the bare loop on 32 sentences at once vs one by one."""
    sources = [bare.tok.encode(t, add_eos=True) for t in SENTENCES[:32]]
    together = median_of(args.rounds, lambda: bare.natural(sources)[0])
    alone = median_of(args.rounds, lambda: sum(bare.natural([s])[0] for s in sources))
    return ("bare loop, the 32 service sentences: batch 32 vs one at a time", f"{alone / together:.2f}x")


def service_rows(args: argparse.Namespace, bare: Bare) -> list[tuple[str, str]]:
    texts = SENTENCES[:32]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        procs = {}
        try:
            procs["continuous"] = start_service(args.repository.resolve(), Path(tmp))
            procs["static"] = start_service(args.repository.resolve(), Path(tmp), module="benchmarks.static_batching")
            seq, cont, stat, ttft, stagger = [], [], [], [], {}
            for _ in range(args.rounds):
                t, answers = asyncio.run(one_at_a_time(procs["continuous"][1], texts))
                seq.append(generated(answers) / t)
                t, together = asyncio.run(concurrently(procs["continuous"][1], texts))
                cont.append(generated(together) / t)
                if [a["results"] for a in together] != [a["results"] for a in answers]:
                    raise RuntimeError("concurrent answers differ from one-at-a-time answers")
                t, static_answers = asyncio.run(concurrently(procs["static"][1], texts))
                stat.append(generated(static_answers) / t)
                ttft.append(statistics.median(asyncio.run(first_token(procs["continuous"][1], x)) for x in texts[:8]))
                for kind in ("continuous", "static"):
                    lat = asyncio.run(staggered(procs[kind][1], texts, STAGGER_S))
                    stagger.setdefault(kind, []).append((statistics.mean(lat), sorted(lat)[int(0.9 * len(lat))]))
        finally:
            for proc, _ in procs.values():
                proc.terminate()
                proc.wait(timeout=30)
    sources = [bare.tok.encode(t, add_eos=True) for t in texts]
    one_by_one = [[bare.natural([s]) for s in sources] for _ in range(args.rounds)]
    bare_seq = statistics.median(sum(t for t, _ in run) for run in one_by_one)
    bare_tokens = sum(n for _, n in one_by_one[0])
    s, c, st = statistics.median(seq), statistics.median(cont), statistics.median(stat)
    rows.append(
        ("service, 32 sentences: 32 concurrent clients vs one at a time", f"{c:,.0f} vs {s:,.0f} tok/s = {c / s:.2f}x")
    )
    rows.append(
        (
            "service, 32 concurrent clients: continuous vs static batching",
            f"{c:,.0f} vs {st:,.0f} tok/s = {c / st:.2f}x",
        )
    )
    rows.append(
        (
            "one at a time: service vs bare loop (batch 1)",
            f"{s:,.0f} vs {bare_tokens / bare_seq:,.0f} tok/s = {s / (bare_tokens / bare_seq):.2f}x",
        )
    )
    rows.append(
        ("time to first streamed token (idle service, median of 8)", f"{statistics.median(ttft) * 1000:.1f} ms")
    )
    (c_mean, c_p90), (s_mean, s_p90) = (
        (statistics.median(m for m, _ in stagger[k]), statistics.median(p for _, p in stagger[k]))
        for k in ("continuous", "static")
    )
    rows.append(
        (
            f"32 requests arriving {STAGGER_S * 1000:.0f} ms apart: mean / p90 latency, continuous vs static",
            (
                f"{c_mean * 1000:.0f} / {c_p90 * 1000:.0f} vs {s_mean * 1000:.0f} / {s_p90 * 1000:.0f} ms = "
                f"{s_mean / c_mean:.2f}x / {s_p90 / c_p90:.2f}x lower"
            ),
        )
    )
    return rows


if __name__ == "__main__":
    sys.exit(main())
