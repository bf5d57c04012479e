"""What ``bench_libretranslate`` runs: the Argos package, both servers, and CTranslate2 alone.

LibreTranslate serves Argos Translate packages: a folder with ``metadata.json`` (``from_code``,
``to_code``, ``type``: ``translate``), a CTranslate2 model in ``model/`` and the SentencePiece model
as ``sentencepiece.model`` (argos-translate's ``package.py``). :func:`argos_package` builds one from a
translator entry of our model repository: ``ctranslate2_model.convert`` for the weights, our
tokenizer's model as it is. argos-translate hands CTranslate2 a sentence's pieces without the
end-of-sentence token that our model was trained with, so the model's config asks CTranslate2 to add
it (``add_source_eos``), as CTranslate2's own converters do for such models.

Both servers listen on 127.0.0.1 only, on free ports; each is one process whose RSS (with any
children) and CPU time are read from ``/proc``. :class:`Ceiling` is the package's model in
CTranslate2 with no server in front: what the hardware gives when every message is known at once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from benchmarks.bench_classify import ROOT, _free_port
from benchmarks.ctranslate2_model import convert

LT_PYTHON = ROOT / ".venv-libretranslate" / "bin" / "python"  # make libretranslate
LT_LAUNCHER = ROOT / "benchmarks" / "bench_libretranslate_offline.py"
COMPUTE_TYPES = {"fp32": "float32", "int8": "int8"}
ARGOS_LENGTH_PENALTY = 0.2  # argos-translate's translate_batch call


def argos_package(entry_dir: Path, packages_dir: Path) -> Path:
    """Our translator entry as an installed en->de Argos Translate package under ``packages_dir``."""
    manifest = json.loads((entry_dir / "manifest.json").read_text())
    tokenizer = entry_dir / manifest["tokenizer"]["file"]
    if not tokenizer.is_file():
        raise ValueError(f"{entry_dir}: an Argos package needs one SentencePiece model; {tokenizer} is not one")
    folder = packages_dir / f"translate-en_de-{manifest['name']}-{manifest['version']}"
    convert(entry_dir, folder / "model")
    config_path = folder / "model" / "config.json"
    config = json.loads(config_path.read_text())
    config["add_source_eos"] = True  # argos hands CTranslate2 the pieces alone
    config_path.write_text(json.dumps(config, indent=2))
    shutil.copyfile(tokenizer, folder / "sentencepiece.model")
    metadata = {
        "package_version": str(manifest["version"]),
        "argos_version": "1.9",
        "from_code": "en",
        "from_name": "English",
        "to_code": "de",
        "to_name": "German",
        "type": "translate",
    }
    (folder / "metadata.json").write_text(json.dumps(metadata, indent=2))
    return folder


@dataclass(frozen=True)
class LTSetting:
    """How LibreTranslate runs CTranslate2: ``inter`` translators side by side (``ARGOS_INTER_THREADS``),
    ``intra`` threads each (``ARGOS_INTRA_THREADS``), behind ``threads`` waitress threads (``--threads``)."""

    inter: int
    intra: int
    threads: int

    @classmethod
    def parse(cls, text: str) -> LTSetting:
        inter, intra, threads = (int(x) for x in text.split("x"))
        return cls(inter, intra, threads)

    @property
    def label(self) -> str:
        return f"{self.inter}x{self.intra}x{self.threads}"


class Server:
    """One server process on 127.0.0.1, its output in ``log_path``."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], port: int, log_path: Path) -> None:
        self.name, self.port, self.log_path = name, port, log_path
        self.url = f"http://127.0.0.1:{port}"
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log)

    def wait_ready(self, path: str, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited ({self.proc.returncode}); see {self.log_path}")
            try:
                with urllib.request.urlopen(self.url + path, timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise SystemExit(f"{self.name} not ready after {timeout:.0f} s; see {self.log_path}")

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.loads(r.read())

    def pids(self) -> list[int]:
        """The server's process and its descendants."""
        out, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            for task in Path(f"/proc/{pid}/task").glob("*"):
                todo += [int(c) for c in (task / "children").read_text().split()]
        return out

    def rss_mib(self) -> float:
        total_kib = 0
        for pid in self.pids():
            status = Path(f"/proc/{pid}/status").read_text()
            total_kib += int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])
        return total_kib / 1024

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def batch_histogram(self) -> tuple[float, float]:
        """Not read here (``bench_classify.run_wrk`` asks every server for it)."""
        return 0.0, 0.0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_attnserve(
    repository: Path,
    workdir: Path,
    precision: str = "auto",
    module: str = "service",
    extra_env: dict[str, str] | None = None,
) -> Server:
    """``python -m service`` on ``repository`` as ``make serve`` starts it, on a free port, gRPC off (the
    benchmarks measure HTTP; a gRPC server on the shared default port would clash), at ``precision``
    (``ATTNSERVE_PRECISION``); ``module`` for a wrapper that starts the service itself, ``extra_env`` for more
    variables."""
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "ATTNSERVE_MODEL_REPOSITORY": str(repository),
        "ATTNSERVE_PORT": str(port),
        "ATTNSERVE_GRPC_PORT": "0",
        "ATTNSERVE_DRAIN_DELAY_S": "0",  # no load balancer in front: stop at once
        "ATTNSERVE_PRECISION": precision,
        **(extra_env or {}),
    }
    return Server("attnserve", [sys.executable, "-m", module], env, port, workdir / "attnserve.log")


def start_libretranslate(
    packages_dir: Path, workdir: Path, setting: LTSetting, beam: int, precision: str, name: str
) -> Server:
    """LibreTranslate on the packages of ``packages_dir`` alone, offline (``bench_libretranslate_offline``):
    argos-translate's folders under ``workdir`` (nothing read from or written to the user's own), its
    CTranslate2 translators run as ``setting`` says at ``precision``, every search with ``beam`` beams
    (``ARGOS_BEAM_SIZE``: the API has no such parameter)."""
    if not LT_PYTHON.is_file():
        raise SystemExit(f"{LT_PYTHON} not found: run 'make libretranslate' (LibreTranslate in its own environment)")
    port = _free_port()
    home = workdir / f"home-{name}"
    env = {
        **os.environ,
        "HOME": str(home),
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "ARGOS_PACKAGES_DIR": str(packages_dir),
        "ARGOS_DEVICE_TYPE": "cpu",
        "ARGOS_COMPUTE_TYPE": COMPUTE_TYPES[precision],
        "ARGOS_INTER_THREADS": str(setting.inter),
        "ARGOS_INTRA_THREADS": str(setting.intra),
        "ARGOS_BEAM_SIZE": str(beam),
    }
    env.pop("PYTHONPATH", None)
    cmd = [
        str(LT_PYTHON),
        str(LT_LAUNCHER),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--load-only",
        "en,de",
        "--threads",
        str(setting.threads),
        "--disable-web-ui",
        "--disable-files-translation",
    ]
    return Server(name, cmd, env, port, workdir / f"{name}.log")


class Ceiling:
    """CTranslate2 alone on the package's model: every message in one ``translate_batch``."""

    def __init__(self, package: Path, precision: str, texts: list[str]) -> None:
        import ctranslate2
        import sentencepiece as spm

        self.version = ctranslate2.__version__
        pieces = spm.SentencePieceProcessor(model_file=str(package / "sentencepiece.model"))
        self.tokens = [pieces.encode(t, out_type=str) for t in texts]  # as argos' tokenizer: no eos
        self.translator = ctranslate2.Translator(
            str(package / "model"),
            device="cpu",
            compute_type=COMPUTE_TYPES[precision],
            inter_threads=2,
            intra_threads=1,
        )

    def sentences_per_s(self, beam: int) -> float:
        start = time.perf_counter()
        self.translator.translate_batch(
            self.tokens, max_batch_size=32, beam_size=beam, length_penalty=ARGOS_LENGTH_PENALTY
        )
        return len(self.tokens) / (time.perf_counter() - start)


def translations(server: Server, texts: list[str], beam: int) -> list[str]:
    """Each text translated alone (one request at a time)."""
    if server.name == "attnserve":
        return [server.post("/translate", {"text": t, "beam_size": beam})["results"][0]["translation"] for t in texts]
    return [server.post("/translate", lt_body(t))["translatedText"] for t in texts]


def lt_body(text: str) -> dict:
    return {"q": text, "source": "en", "target": "de", "format": "text"}


def lt_versions() -> str:
    code = (
        "import importlib.metadata as m; print(', '.join(f'{p} {m.version(p)}' for p in "
        "('libretranslate', 'argos-translate-lt', 'ctranslate2', 'waitress', 'flask')))"
    )
    return subprocess.run([str(LT_PYTHON), "-c", code], capture_output=True, text=True, check=True).stdout.strip()
