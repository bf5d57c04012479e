"""deploy/stage_ort_gpu.py and deploy/fatbin.py: onnxruntime staged in chunks and rebuilt, damaged chunks
named, and the CUDA fat binary pruned to one architecture.

The pipeline runs for real (``python -m deploy.stage_ort_gpu prepare|plan|assemble|verify``) on the CPU
onnxruntime wheel of this interpreter (28 MB): the same steps as for onnxruntime-gpu, which cannot be
imported by this Python (its wheel is for the GPU machine's 3.12) nor run without a GPU. The pruning is
checked on a synthetic ELF with a synthetic ``.nv_fatbin``, and on the real onnxruntime-gpu provider
library. Wheels are downloaded from PyPI once into ~/.cache/attnserve/wheels and kept there: onnxruntime-gpu
is 256 MB, about 5 s on the development machine, and the only way to check the layout against the real
file; later runs read the cached wheels and need no network.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from deploy.fatbin import CUBIN, ENTRY_HEADER, FATBIN_HEADER, FATBIN_MAGIC, PTX, FatbinError, fatbin_entries, prune
from deploy.stage_ort_gpu import CUDA_PROVIDER_LIBRARY, MIB, StageError, download_wheel, plan_runs
from tests.deploy.parsing import ROOT, dockerignore_rules, ignored

WHEELS = Path.home() / ".cache" / "attnserve" / "wheels"
PLATFORM = "manylinux_2_28_x86_64"
HERE = f"cp{sys.version_info.major}{sys.version_info.minor}"


def cached_wheel(package: str, version: str, python_tag: str) -> Path:
    found = sorted(WHEELS.glob(f"{package.replace('-', '_')}-{version}-{python_tag}-*-{PLATFORM}.whl"))
    return found[-1] if found else download_wheel(package, version, python_tag, PLATFORM, WHEELS)


def stage_cli(stage: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "deploy.stage_ort_gpu", "--stage", str(stage), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


# --- the fat binary, synthetic --------------------------------------------------------------------
def entry(kind: int, arch: int, payload: bytes, header_size: int = 64) -> bytes:
    header = ENTRY_HEADER.pack(kind, 0x101, header_size, len(payload), len(payload), 0, 8, 1, arch)
    return header.ljust(header_size, b"\xee") + payload


def fat_binary(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return FATBIN_HEADER.pack(FATBIN_MAGIC, 1, FATBIN_HEADER.size, len(body)) + body


def elf(sections: dict[str, bytes]) -> bytes:
    """An ELF64 little-endian file: header, the sections' bytes, ``.shstrtab``, the section headers."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n in [*sections, ".shstrtab"])
    body, headers = bytearray(), [bytes(64)]  # section 0 is the null section
    for name, data in [*sections.items(), (".shstrtab", names)]:
        offset = 64 + len(body)
        body += data + bytes(-len(data) % 8)
        name_offset = names.index(name.encode() + b"\0")
        headers.append(struct.pack("<IIQQQQIIQQ", name_offset, 1, 2, offset, offset, len(data), 0, 0, 8, 0))
    shoff = 64 + len(body)
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(headers), len(headers) - 1)
    return header + bytes(body) + b"".join(headers)


def payload(seed: int, size: int) -> bytes:
    """Bytes with no zero among them: a zeroed payload cannot pass for a kept one."""
    return np.random.default_rng(seed).integers(1, 256, size, dtype=np.uint8).tobytes()


def test_prune_keeps_only_the_kept_architecture(tmp_path):
    """Per fat binary: the sm_90 cubin if there is one, else PTX a sm_90 GPU compiles; all else zeroed,
    every header and the file's size unchanged."""
    p = {name: payload(i, 96 + 8 * i) for i, name in enumerate(["c75", "c80", "c90", "ptx80", "d75", "dptx80", "e120"])}
    section = (
        fat_binary(entry(CUBIN, 75, p["c75"]), entry(CUBIN, 80, p["c80"]), entry(CUBIN, 90, p["c90"], header_size=112))
        + fat_binary(entry(PTX, 80, p["ptx80"]), entry(CUBIN, 90, b""))  # an empty cubin still counts as sm_90's
        + bytes(8)  # alignment padding between fat binaries
        + fat_binary(entry(CUBIN, 75, p["d75"]), entry(PTX, 80, p["dptx80"]))
        + fat_binary(entry(CUBIN, 120, p["e120"]))
    )
    library = tmp_path / "libprovider.so"
    original = elf({".text": payload(99, 200), ".nv_fatbin": section, ".rodata": payload(98, 40)})
    library.write_bytes(original)
    before = fatbin_entries(original)
    assert [[(e.kind, e.arch) for e in fb] for fb in before] == [
        [(CUBIN, 75), (CUBIN, 80), (CUBIN, 90)],
        [(PTX, 80), (CUBIN, 90)],
        [(CUBIN, 75), (PTX, 80)],
        [(CUBIN, 120)],
    ]

    report = prune(library, keep_sm=90).as_dict()

    pruned = library.read_bytes()
    assert len(pruned) == len(original) and fatbin_entries(pruned) == before
    survivors = {"c90", "dptx80"}
    for name, data in p.items():
        at = original.index(data)
        assert pruned[at : at + len(data)] == (data if name in survivors else bytes(len(data))), name
    changed = [i for i, (a, b) in enumerate(zip(original, pruned)) if a != b]
    zeroed = [(original.index(data), len(data)) for name, data in p.items() if name not in survivors]
    assert changed == [i for at, n in sorted(zeroed) for i in range(at, at + n)]  # nothing but those payloads
    assert report["containers"] == 4 and report["containers_without_kept_arch"] == 1
    assert report["entries"] == {"kept_cubin": 2, "kept_ptx": 1, "zeroed_cubin": 4, "zeroed_ptx": 1}
    assert report["bytes_kept"] == len(p["c90"]) + len(p["dptx80"])
    assert report["bytes_by_arch"]["cubin_sm75"] == len(p["c75"]) + len(p["d75"])


def test_a_file_without_a_fat_binary_is_refused(tmp_path):
    with pytest.raises(FatbinError, match="no .nv_fatbin"):
        fatbin_entries(elf({".text": payload(0, 64)}))
    with pytest.raises(FatbinError, match="not a 64-bit"):
        fatbin_entries(b"#!/bin/sh\n" + bytes(100))
    with pytest.raises(FatbinError, match="does not add up"):
        fatbin_entries(elf({".nv_fatbin": fat_binary(entry(CUBIN, 90, payload(1, 64)))[:-8]}))


# --- the fat binary, real -------------------------------------------------------------------------
def test_prune_the_real_onnxruntime_gpu_provider(tmp_path):
    """onnxruntime-gpu 1.31.1's CUDA provider: 208 MiB of cubins for six architectures, no PTX; keeping
    sm_90 (H100, H200) keeps 73.3 MiB and zeroes the rest, the library's size unchanged."""
    wheel = cached_wheel("onnxruntime-gpu", "1.31.1", "cp312")
    with zipfile.ZipFile(wheel) as zf:
        library = Path(zf.extract(CUDA_PROVIDER_LIBRARY, tmp_path))
    size = library.stat().st_size

    report = prune(library, keep_sm=90).as_dict()

    assert library.stat().st_size == size
    assert report["bytes_by_arch"] == {
        "cubin_sm75": 9_772_208,
        "cubin_sm80": 32_287_792,
        "cubin_sm86": 31_899_800,
        "cubin_sm89": 31_298_784,
        "cubin_sm90": 76_902_328,
        "cubin_sm120": 36_318_344,
    }
    assert report["entries"] == {"kept_cubin": 600, "zeroed_cubin": 1458}
    assert report["bytes_kept"] == 76_902_328  # 73.3 MiB
    assert report["containers"] == 609 and report["containers_without_kept_arch"] == 9  # sm_120-only kernels
    again = prune(library, keep_sm=90).as_dict()  # pruning twice changes nothing more
    assert again["bytes_kept"] == report["bytes_kept"] and library.stat().st_size == size


# --- the pipeline on the CPU wheel ----------------------------------------------------------------
@pytest.fixture(scope="module")
def wheel() -> Path:
    return cached_wheel("onnxruntime", onnxruntime.__version__, HERE)


@pytest.fixture(scope="module")
def staged(wheel, tmp_path_factory) -> tuple[Path, str]:
    """The CPU wheel prepared (xz preset 0: fast; 4 MiB chunks: several) into a stage folder; prepare's output."""
    stage = tmp_path_factory.mktemp("stage") / ".gpu-stage"
    proc = stage_cli(
        stage, "prepare", "--wheel", str(wheel), "--xz-preset", "0", "--chunk-mib", "4", "--tree-mib", "38"
    )
    assert proc.returncode == 0, proc.stderr
    return stage, proc.stdout


@pytest.fixture
def stage(staged, tmp_path) -> Path:
    """A copy of the staged chunks and manifest, to damage."""
    return shutil.copytree(staged[0], tmp_path / ".gpu-stage", ignore=shutil.ignore_patterns("site"))


def test_prepare_assemble_verify(staged, wheel, tmp_path):
    stage, printed = staged
    manifest = json.loads((stage / "manifest.json").read_text())
    assert (manifest["package"], manifest["version"], manifest["python_tag"]) == (
        "onnxruntime",
        onnxruntime.__version__,
        HERE,
    )
    assert manifest["pruned"] is None and manifest["wheel"]["name"] == wheel.name
    assert len(manifest["chunks"]) > 1 and all(c["size"] <= 4 * MIB for c in manifest["chunks"])
    assert f"in {len(manifest['chunks'])} chunks" in printed and "run 1 of" in printed

    proc = stage_cli(stage, "assemble")
    assert proc.returncode == 0 and "assembled" in proc.stdout, proc.stderr

    site = stage / "site"
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.infolist() if not m.is_dir()]
        assert sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file()) == sorted(
            [m.filename for m in members] + ["attnserve-staged.json"]
        )
        for m in members:
            assert (site / m.filename).read_bytes() == zf.read(m), m.filename
            mode = (m.external_attr >> 16) & 0o777 or 0o644
            assert (site / m.filename).stat().st_mode & 0o777 == mode, m.filename

    proc = stage_cli(stage, "verify")
    assert proc.returncode == 0, proc.stderr
    assert f"from {site / 'onnxruntime' / '__init__.py'}" in proc.stdout  # not this environment's onnxruntime
    assert "CPUExecutionProvider" in proc.stdout and "max |delta| against a CPU session 0.00e+00" in proc.stdout
    proc = stage_cli(stage, "verify", "--require-cuda")
    assert proc.returncode == 1 and "does not run on CUDAExecutionProvider" in proc.stderr
    assert "this onnxruntime has no CUDA provider" in proc.stdout
    proc = stage_cli(stage, "verify", "--require-cuda", "--no-model")  # nothing run: CUDA not shown to work
    assert proc.returncode == 1 and "--require-cuda needs a model to run" in proc.stderr


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda chunk: chunk.unlink(), "missing chunk {chunk}"),
        (lambda chunk: chunk.write_bytes(chunk.read_bytes()[:-1]), "wrong size: {chunk} has"),
        (lambda chunk: chunk.write_bytes(b"\0" + chunk.read_bytes()[1:]), "wrong checksum: {chunk} is not"),
    ],
    ids=["missing", "cut short", "corrupted"],
)
def test_a_damaged_chunk_is_named(stage, damage, problem):
    chunk = stage / "chunks" / "stream.xz.001"
    damage(chunk)
    proc = stage_cli(stage, "assemble")
    assert proc.returncode == 1
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"PROBLEM: {problem.format(chunk=chunk)}")
    assert not (stage / "site").exists()


def test_a_file_unlike_the_manifests_is_named(stage):
    manifest = json.loads((stage / "manifest.json").read_text())
    manifest["files"][3]["sha256"] = "0" * 64
    (stage / "manifest.json").write_text(json.dumps(manifest))
    proc = stage_cli(stage, "assemble")
    assert proc.returncode == 1
    assert (
        proc.stderr.strip()
        == f"PROBLEM: wrong checksum: assembled {manifest['files'][3]['path']} is not the file the manifest lists"
    )
    assert not (stage / "site").exists() and not (stage / "site.partial").exists()


def test_check_only_counts_the_chunks_here(stage):
    """Between two runs: the chunks carried so far are checked, the ones still to come are not a problem."""
    names = sorted(p.name for p in (stage / "chunks").iterdir())
    for name in names[2:]:
        (stage / "chunks" / name).unlink()
    proc = stage_cli(stage, "assemble", "--check-only")
    assert proc.returncode == 0 and f"2 of {len(names)} chunks here" in proc.stdout, proc.stderr
    (stage / "chunks" / names[0]).write_bytes(b"not the chunk")
    assert stage_cli(stage, "assemble", "--check-only").returncode == 1


def test_assemble_leaves_a_folder_it_did_not_write_alone(stage, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    proc = stage_cli(stage, "assemble", "--target", str(target))
    assert proc.returncode == 1 and "holds files assemble did not write" in proc.stderr
    assert [p.name for p in target.iterdir()] == ["keep.txt"]


def test_verify_names_a_python_the_wheel_is_not_for(staged, tmp_path):
    site = tmp_path / "site"
    assert stage_cli(staged[0], "assemble", "--target", str(site)).returncode == 0
    (site / "attnserve-staged.json").write_text(json.dumps({"python_tag": "cp399"}))
    proc = stage_cli(staged[0], "verify", "--site", str(site), "--no-model")
    assert proc.returncode == 1 and f"staged for cp399, this Python is {HERE}" in proc.stderr


# --- the plan -------------------------------------------------------------------------------------
def test_plan_packs_whole_chunks_into_runs():
    manifest = {"chunks": [{"name": f"c{i}", "size": s} for i, s in enumerate([10, 10, 10, 5, 9])]}
    assert plan_runs(manifest, manifest_bytes=1, budget=21) == [["c0", "c1"], ["c2", "c3"], ["c4"]]
    assert plan_runs(manifest, manifest_bytes=1, budget=11) == [["c0"], ["c1"], ["c2"], ["c3"], ["c4"]]
    with pytest.raises(StageError, match="smaller --chunk-mib"):
        plan_runs(manifest, manifest_bytes=1, budget=10)


def test_plan_prints_the_carry_lists(staged):
    """Runs of 64 MiB, 55 of them taken by the tree: two 4 MiB chunks and the manifest per run."""
    proc = stage_cli(staged[0], "plan", "--tree-mib", "55", "--margin-mib", "0")
    assert proc.returncode == 0, proc.stderr
    runs = [line for line in proc.stdout.splitlines() if line.startswith("run ")]
    chunks = sorted(p.name for p in (staged[0] / "chunks").iterdir())
    assert len(runs) == (len(chunks) + 1) // 2 and runs[0].startswith(f"run 1 of {len(runs)}: carry [")
    carried = [json.loads(line.split("carry ", 1)[1]) for line in runs]
    assert [Path(p).name for run in carried for p in run if "chunks" in p] == chunks
    assert all(Path(run[0]).name == "manifest.json" for run in carried)


def test_the_stage_folder_stays_out_of_git_and_docker():
    subprocess.run(["git", "check-ignore", "-q", ".gpu-stage/chunks/stream.xz.000"], cwd=ROOT, check=True)
    assert ignored(".gpu-stage/chunks/stream.xz.000", dockerignore_rules())
