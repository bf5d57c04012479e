"""Stage onnxruntime-gpu onto a machine that has no network and takes files in size-limited transfers.

    python -m deploy.stage_ort_gpu prepare --keep-sm 90     # here, with PyPI: download, prune, compress, cut
    python -m deploy.stage_ort_gpu plan                     # which pieces go in which transfer (prepare prints it)
    python -m deploy.stage_ort_gpu assemble                 # there: check every piece, rebuild the wheel's files
    python -m deploy.stage_ort_gpu verify --require-cuda    # there: import it, run a model on CUDA and on the CPU

The stage folder (``.gpu-stage/``, ignored by git and by the Docker build context) holds:

    manifest.json       package, version, Python tag, pruned architecture; every chunk and every file
                        of the wheel with its size and sha256, the files in the order they are streamed
    chunks/stream.xz.N  one xz stream of every file's bytes, cut into chunks of at most --chunk-mib
    site/               written by assemble: the unpacked wheel, a folder for PYTHONPATH

``--keep-sm`` zeroes the CUDA kernels of every other GPU architecture (``deploy/fatbin.py``): the
provider library keeps its size but compresses to a fifth. xz rather than zstd because ``lzma`` is in
the standard library on both sides, and xz -9 is the smaller of the two on the pruned library (51.5
MB against zstd -19's 52.6 MB). assemble needs only the standard library; verify also numpy.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]
STAGE = Path(".gpu-stage")  # relative to the repository root, where the device runs start
CUDA_PROVIDER_LIBRARY = "onnxruntime/capi/libonnxruntime_providers_cuda.so"
DEFAULT_MODEL = ROOT / "models" / "vit" / "1" / "model.onnx"
MARKER = "attnserve-staged.json"  # in site/: this folder was written by assemble and may be replaced
MIB = 1 << 20
BLOCK = 4 * MIB


class StageError(Exception):
    """A step cannot go on; the message says what to do."""


# --- prepare (here) -------------------------------------------------------------------------------
def python_version(tag: str) -> str:
    """``cp312`` -> ``3.12``: the interpreter the wheel's compiled modules are built for."""
    if not (tag.startswith("cp") and tag[2:].isdigit() and len(tag) >= 4):
        raise StageError(f"{tag!r} is not a CPython tag such as cp312")
    return f"{tag[2]}.{tag[3:]}"


def download_wheel(package: str, version: str, python_tag: str, platform: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", f"{package}=={version}", "--no-deps", "--only-binary=:all:"]
    cmd += ["--implementation", "cp", "--python-version", python_version(python_tag), "--platform", platform]
    subprocess.run([*cmd, "--dest", str(dest), "--quiet"], check=True)
    wheels = sorted(dest.glob(f"{package.replace('-', '_')}-{version}-{python_tag}-*.whl"))
    if not wheels:
        raise StageError(f"pip downloaded no {package} {version} wheel for {python_tag} into {dest}")
    return wheels[-1]


def compress_tree(tree: Path, files: list[dict], preset: int) -> bytes:
    """Every file of ``files`` (in order) through one xz compressor; fills in each file's size and sha256."""
    compressor, out = lzma.LZMACompressor(lzma.FORMAT_XZ, preset=preset), bytearray()
    for f in files:
        digest, size = hashlib.sha256(), 0
        with open(tree / f["path"], "rb") as src:
            while block := src.read(BLOCK):
                digest.update(block)
                size += len(block)
                out += compressor.compress(block)
        f.update(size=size, sha256=digest.hexdigest())
    return bytes(out + compressor.flush())


def write_chunks(stream: bytes, folder: Path, chunk_bytes: int) -> list[dict]:
    chunks = []
    for i, start in enumerate(range(0, len(stream), chunk_bytes)):
        piece = stream[start : start + chunk_bytes]
        (folder / f"stream.xz.{i:03d}").write_bytes(piece)
        chunks.append({"name": f"stream.xz.{i:03d}", "size": len(piece), "sha256": hashlib.sha256(piece).hexdigest()})
    return chunks


def prepare(args: argparse.Namespace) -> dict:
    from deploy.fatbin import prune

    stage = args.stage
    wheel = args.wheel or download_wheel(args.package, args.version, args.python_tag, args.platform, stage / "wheels")
    shutil.rmtree(stage / "chunks", ignore_errors=True)
    (stage / "manifest.json").unlink(missing_ok=True)
    (stage / "chunks").mkdir(parents=True)
    with tempfile.TemporaryDirectory(dir=stage, prefix="unpacked-") as tmp, zipfile.ZipFile(wheel) as zf:
        members = sorted((m for m in zf.infolist() if not m.is_dir()), key=lambda m: m.filename)
        zf.extractall(tmp, members)
        files = [{"path": m.filename, "mode": (m.external_attr >> 16) & 0o777 or 0o644} for m in members]
        pruned = None
        if args.keep_sm is not None:
            if CUDA_PROVIDER_LIBRARY not in {f["path"] for f in files}:
                raise StageError(f"{wheel.name} has no {CUDA_PROVIDER_LIBRARY}: nothing to prune")
            pruned = {
                "library": CUDA_PROVIDER_LIBRARY,
                **prune(Path(tmp) / CUDA_PROVIDER_LIBRARY, args.keep_sm).as_dict(),
            }
        stream = compress_tree(Path(tmp), files, args.xz_preset)
    chunks = write_chunks(stream, stage / "chunks", args.chunk_mib * MIB)
    parts = wheel.name.removesuffix(".whl").split("-")  # name-version[-build]-python-abi-platform
    name, version, python_tag, platform = parts[0], parts[1], parts[-3], parts[-1]
    manifest = {
        "format": 1,
        "package": name.replace("_", "-"),
        "version": version,
        "python_tag": python_tag,
        "platform": platform,
        "wheel": {"name": wheel.name, "size": wheel.stat().st_size, "sha256": sha256_of(wheel)},
        "pruned": pruned,
        "stream": {"format": "xz", "preset": args.xz_preset, "size": sum(c["size"] for c in chunks)},
        "chunks": chunks,
        "files": files,
    }
    (stage / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


# --- plan -----------------------------------------------------------------------------------------
def tree_bytes(root: Path = ROOT) -> int:
    """What a device run sends besides the carried paths: the tracked and the untracked, not ignored, files."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    paths = {root / p for p in listed.decode().split("\0") if p}
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def plan_runs(manifest: dict, manifest_bytes: int, budget: int) -> list[list[str]]:
    """Chunk names per run: each run carries the manifest and as many whole chunks as fit ``budget``."""
    runs: list[list[str]] = []
    room = 0
    for chunk in manifest["chunks"]:
        if manifest_bytes + chunk["size"] > budget:
            raise StageError(
                f"{chunk['name']} ({chunk['size'] / MIB:.1f} MiB) does not fit a run's {budget / MIB:.1f} MiB: "
                "prepare again with a smaller --chunk-mib"
            )
        if chunk["size"] > room:
            runs.append([])
            room = budget - manifest_bytes
        runs[-1].append(chunk["name"])
        room -= chunk["size"]
    return runs


def print_plan(stage: Path, per_run_mib: float, margin_mib: float, tree: int | None) -> None:
    manifest = read_manifest(stage)
    manifest_bytes = (stage / "manifest.json").stat().st_size
    tree = tree_bytes() if tree is None else tree
    budget = int((per_run_mib - margin_mib) * MIB) - tree
    runs = plan_runs(manifest, manifest_bytes, budget)
    files = manifest["files"]
    arch = f"cubins for sm_{manifest['pruned']['keep_sm']} only" if manifest["pruned"] else "not pruned"
    print(
        f"staged {manifest['package']} {manifest['version']} ({manifest['python_tag']}, {manifest['platform']}, "
        f"{arch}): {len(files)} files, {sum(f['size'] for f in files) / 1e6:.1f} MB -> "
        f"{manifest['stream']['size'] / 1e6:.1f} MB of xz in {len(manifest['chunks'])} chunks"
    )
    if pruned := manifest["pruned"]:
        entries, sm = pruned["entries"], pruned["keep_sm"]
        print(
            f"pruned {pruned['library']}: kept {entries.get('kept_cubin', 0)} sm_{sm} cubins and "
            f"{entries.get('kept_ptx', 0)} PTX ({pruned['bytes_kept'] / 1e6:.1f} MB), zeroed "
            f"{entries.get('zeroed_cubin', 0)} cubins and {entries.get('zeroed_ptx', 0)} PTX of other architectures "
            f"({pruned['bytes_zeroed'] / 1e6:.1f} MB); {pruned['containers_without_kept_arch']} of "
            f"{pruned['containers']} fat binaries have no code for sm_{sm} (nor had they before)"
        )
    print(
        f"the working tree sends {tree / MIB:.1f} MiB, so a run carries at most {budget / MIB:.1f} MiB of chunks "
        f"({per_run_mib:g} MiB a run, {margin_mib:g} MiB kept spare): {len(runs)} run(s)"
    )
    try:
        where = stage.resolve().relative_to(ROOT)
    except ValueError:
        where = stage
        print(f"{stage} is outside the repository {ROOT}: a run carries only paths inside it")
    for i, names in enumerate(runs, 1):
        carry = [str(where / "manifest.json"), *(str(where / "chunks" / n) for n in names)]
        last = i == len(runs)
        command = "python3 -m deploy.stage_ort_gpu " + (
            "assemble && python3 -m deploy.stage_ort_gpu verify --require-cuda" if last else "assemble --check-only"
        )
        print(f"run {i} of {len(runs)}: carry {json.dumps(carry)}\n  command: {command}")
    print(
        "Each run must start while the machine is still warm from the one before: the chunks of earlier runs "
        "stay there as ignored files only until it is given back. Then PYTHONPATH=.gpu-stage/site in later runs."
    )


# --- assemble (there: standard library only) ------------------------------------------------------
def read_manifest(stage: Path) -> dict:
    path = stage / "manifest.json"
    if not path.is_file():
        raise StageError(f"no {path}: carry it (prepare writes it)")
    return json.loads(path.read_text())


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


def chunk_problems(stage: Path, manifest: dict, *, missing_ok: bool = False) -> list[str]:
    problems = []
    for c in manifest["chunks"]:
        path = stage / "chunks" / c["name"]
        if not path.is_file():
            if not missing_ok:
                problems.append(f"missing chunk {path}")
        elif path.stat().st_size != c["size"]:
            problems.append(f"wrong size: {path} has {path.stat().st_size} bytes, the manifest says {c['size']}")
        elif sha256_of(path) != c["sha256"]:
            problems.append(f"wrong checksum: {path} is not the chunk the manifest lists (sha256 {c['sha256']})")
    return problems


def safe_path(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise StageError(f"the manifest names a file outside the target folder: {name!r}")
    return path


def unpack_stream(stage: Path, manifest: dict, target: Path) -> list[str]:
    """Decompress the chunks into ``target``, file by file; the files whose bytes are not the manifest's."""
    problems = []
    compressed = b"".join((stage / "chunks" / c["name"]).read_bytes() for c in manifest["chunks"])
    with lzma.open(io.BytesIO(compressed)) as stream:
        for f in manifest["files"]:
            dest = target / safe_path(f["path"])
            dest.parent.mkdir(parents=True, exist_ok=True)
            digest, left = hashlib.sha256(), f["size"]
            with open(dest, "wb") as out:
                while left and (block := stream.read(min(left, BLOCK))):
                    digest.update(block)
                    out.write(block)
                    left -= len(block)
            os.chmod(dest, f["mode"])
            if left:
                raise StageError(f"the stream ends inside {f['path']}")
            if digest.hexdigest() != f["sha256"]:
                problems.append(f"wrong checksum: assembled {f['path']} is not the file the manifest lists")
        if stream.read(1):
            problems.append("the stream holds more bytes than the manifest's files")
    return problems


def assemble(stage: Path, target: Path, check_only: bool) -> list[str]:
    manifest = read_manifest(stage)
    problems = chunk_problems(stage, manifest, missing_ok=check_only)
    if check_only or problems:
        return problems
    if target.exists() and any(target.iterdir()) and not (target / MARKER).is_file():
        return [f"{target} holds files assemble did not write: choose another --target"]
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        problems = unpack_stream(stage, manifest, partial)
    except (lzma.LZMAError, EOFError, StageError) as e:
        problems = [f"the chunks do not decompress: {e}"]
    if problems:
        shutil.rmtree(partial)
        return problems
    (partial / MARKER).write_text(json.dumps({k: manifest[k] for k in ("package", "version", "python_tag")}))
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return []


# --- verify (there) -------------------------------------------------------------------------------
PROBE = r"""
import json, sys
import numpy as np
import onnxruntime as ort

info = {"file": ort.__file__, "version": ort.__version__, "providers": ort.get_available_providers()}
try:
    from onnxruntime.capi import build_and_package_info as build
    info.update(package=getattr(build, "package_name", None), cuda_version=getattr(build, "cuda_version", None))
except ImportError:
    pass
if len(sys.argv) > 1:
    def session(providers):
        return ort.InferenceSession(sys.argv[1], providers=providers)
    try:
        cpu, cuda = session(["CPUExecutionProvider"]), session(["CUDAExecutionProvider", "CPUExecutionProvider"])
        info["session_providers"] = cuda.get_providers()
        rng = np.random.default_rng(0)
        types = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32}
        feeds = {
            i.name: rng.standard_normal([d if isinstance(d, int) else 2 for d in i.shape]).astype(types[i.type])
            for i in cpu.get_inputs()
        }
        a, b = cpu.run(None, feeds), cuda.run(None, feeds)
        info["max_abs_diff"] = max(float(np.max(np.abs(x.astype(np.float64) - y))) for x, y in zip(a, b))
    except Exception as e:
        info["session_error"] = f"{type(e).__name__}: {e}"
print(json.dumps(info))
"""


@dataclass
class Verdict:
    lines: list[str]
    problems: list[str]


def verify(site: Path, model: Path | None, require_cuda: bool, atol: float) -> Verdict:
    """Import onnxruntime from ``site`` in a fresh interpreter and, given a model, run it on CUDA and the CPU."""
    site = site.resolve()
    manifest = json.loads((site / MARKER).read_text()) if (site / MARKER).is_file() else {}
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    problems = []
    if manifest.get("python_tag", here) != here:
        problems.append(f"{site} is staged for {manifest['python_tag']}, this Python is {here}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-c", PROBE, *([str(model)] if model else [])]
    proc = subprocess.run(cmd, env=env, cwd=site, capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        return Verdict([], [*problems, f"import onnxruntime from {site} failed: {proc.stderr.strip()[-2000:]}"])
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    built = f"{info.get('package')}, built for CUDA {info.get('cuda_version') or '-'}"
    lines = [
        f"onnxruntime {info['version']} ({built}) from {info['file']}",
        f"available providers: {info['providers']} (a provider compiled in is listed whether or not it can run here)",
    ]
    if not Path(info["file"]).resolve().is_relative_to(site):
        problems.append(f"onnxruntime was imported from {info['file']}, not from {site}")
    if model is None:
        return Verdict(lines, [*problems, *(["--require-cuda needs a model to run: --model"] if require_cuda else [])])
    if "session_error" in info:
        return Verdict(lines, [*problems, f"{model.name}: {info['session_error']}"])
    on_cuda = info["session_providers"][0] == "CUDAExecutionProvider"
    fallback = (
        "CUDA fell back to the CPU: no usable GPU, driver or CUDA library here"
        if "CUDAExecutionProvider" in info["providers"]
        else "this onnxruntime has no CUDA provider"
    )
    lines.append(
        f"{model.name}: session asked for CUDA got {info['session_providers']}"
        + ("" if on_cuda else f" ({fallback})")
        + f"; max |delta| against a CPU session {info['max_abs_diff']:.2e}"
    )
    if not on_cuda:  # onnxruntime's own reason: a CUDA library it could not load, say
        said = re.sub(r"\x1b\[[0-9;]*m", "", proc.stderr).splitlines()
        lines += [f"onnxruntime: {line[line.index('Failed to') :][:300]}" for line in said if "Failed to" in line]
    if require_cuda and not on_cuda:
        problems.append(f"{model.name} does not run on CUDAExecutionProvider")
    if info["max_abs_diff"] > atol:
        problems.append(f"{model.name}: outputs differ from the CPU's by {info['max_abs_diff']:.2e} > {atol}")
    return Verdict(lines, problems)


# --- command line ---------------------------------------------------------------------------------
def report(problems: list[str], done: str = "") -> int:
    """One line per problem on stderr, and the exit status."""
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    if done and not problems:
        print(done)
    return 1 if problems else 0


def run_prepare(args: argparse.Namespace) -> int:
    prepare(args)
    return run_plan(args)


def run_plan(args: argparse.Namespace) -> int:
    print_plan(args.stage, args.run_mib, args.margin_mib, None if args.tree_mib is None else int(args.tree_mib * MIB))
    return 0


def run_assemble(args: argparse.Namespace) -> int:
    target = args.target or args.stage / "site"
    problems = assemble(args.stage, target, args.check_only)
    if args.check_only:
        chunks = read_manifest(args.stage)["chunks"]
        here = [c["name"] for c in chunks if (args.stage / "chunks" / c["name"]).is_file()]
        return report(problems, f"{len(here)} of {len(chunks)} chunks here, intact: {', '.join(here) or 'none'}")
    return report(problems, f"assembled {args.stage / 'manifest.json'} into {target}")


def run_verify(args: argparse.Namespace) -> int:
    model = None if args.no_model or args.model is None else args.model.resolve()
    verdict = verify(args.site or args.stage / "site", model, args.require_cuda, args.atol)
    print("\n".join(verdict.lines))
    return report(verdict.problems, "verified")


STEPS = {"prepare": run_prepare, "plan": run_plan, "assemble": run_assemble, "verify": run_verify}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m deploy.stage_ort_gpu",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--stage", type=Path, default=STAGE, help="stage folder (default: %(default)s)")
    sub = p.add_subparsers(dest="step", required=True)

    prep = sub.add_parser("prepare", help="download the wheel, prune, compress and cut it into chunks")
    prep.add_argument("--package", default="onnxruntime-gpu", help="default: %(default)s")
    prep.add_argument("--version", default="1.31.1", help="default: %(default)s")
    prep.add_argument(
        "--python-tag", default="cp312", help="CPython of the machine that runs it (default: %(default)s)"
    )
    prep.add_argument("--platform", default="manylinux_2_28_x86_64", help="default: %(default)s")
    prep.add_argument("--wheel", type=Path, help="a wheel already downloaded, instead of asking PyPI")
    prep.add_argument("--keep-sm", type=int, help="keep only this GPU architecture's CUDA kernels (90: H100, H200)")
    prep.add_argument("--chunk-mib", type=int, default=24, help="largest chunk (default: %(default)s)")
    prep.add_argument("--xz-preset", type=int, default=9, choices=range(10), help="default: %(default)s")
    for parser in (prep, sub.add_parser("plan", help="which chunks to carry in which run")):
        parser.add_argument("--run-mib", type=float, default=64, help="what one run may send (default: %(default)s)")
        parser.add_argument("--margin-mib", type=float, default=1, help="kept spare per run (default: %(default)s)")
        parser.add_argument("--tree-mib", type=float, help="the working tree a run sends (default: measured by git)")

    asm = sub.add_parser("assemble", help="check the chunks and rebuild the wheel's files (standard library only)")
    asm.add_argument("--target", type=Path, help="default: STAGE/site")
    asm.add_argument("--check-only", action="store_true", help="check the chunks present so far, write nothing")

    ver = sub.add_parser("verify", help="import the assembled onnxruntime and run a model on CUDA and on the CPU")
    ver.add_argument("--site", type=Path, help="default: STAGE/site")
    ver.add_argument("--model", type=Path, default=DEFAULT_MODEL if DEFAULT_MODEL.is_file() else None)
    ver.add_argument("--no-model", action="store_true", help="only import it and list its providers")
    ver.add_argument("--require-cuda", action="store_true", help="fail when the session falls back to the CPU")
    ver.add_argument("--atol", type=float, default=2e-2, help="largest |CUDA - CPU| (default: %(default)s)")
    p.epilog = "".join(parser.format_usage() for parser in sub.choices.values())  # every step's options
    args = p.parse_args(argv)
    try:
        return STEPS[args.step](args)
    except StageError as e:
        return report([str(e)])


if __name__ == "__main__":
    sys.exit(main())
