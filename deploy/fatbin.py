"""Keep one GPU architecture's code in a CUDA library: zero every other payload of its ``.nv_fatbin``.

A CUDA library carries its kernels once per GPU architecture in the ELF section ``.nv_fatbin``: a
run of fat binaries, each a header followed by entries, one entry per architecture, an entry being
a cubin (machine code for one SM version) or PTX (JIT-compiled by the driver for that version or
newer). Pruning overwrites the payloads of the entries a GPU of the kept architecture never loads
with zeros: every header, offset and size stays, so the library is the same file to the loader and
the driver, and the zeros compress to nothing. Layout, read from onnxruntime-gpu 1.31.1's
``libonnxruntime_providers_cuda.so`` (little-endian):

    fat binary header, 16 bytes: magic u32 (0xBA55ED50), version u16, header size u16, size u64
        (of the entries that follow the header)
    entry header, ``header size`` bytes (64; 112 for sm_120): kind u16 (1 PTX, 2 cubin), u16,
        header size u32, payload size u64, compressed size u32, u32, minor u16, major u16, arch u32
        (75, 80, ... 120), ...; the payload follows it, the next entry follows the payload.

Stdlib only: it runs wherever a wheel is staged.
"""

from __future__ import annotations

import mmap
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
FATBIN_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries
ENTRY_HEADER = struct.Struct("<HHIQIIHHI")  # kind, ?, header size, payload size, compressed, ?, minor, major, arch
SECTION_HEADER = struct.Struct("<IIQQQQIIQQ")  # ELF64 Shdr: name, type, flags, addr, offset, size, link, info, ...
PTX, CUBIN = 1, 2
KIND_NAMES = {PTX: "ptx", CUBIN: "cubin"}


class FatbinError(ValueError):
    """The file is not an ELF64 library with a ``.nv_fatbin`` section of the layout above."""


@dataclass(frozen=True)
class Entry:
    kind: int  # PTX or CUBIN
    arch: int  # SM version: 90 for sm_90
    header_offset: int  # in the file
    header_size: int
    payload_size: int

    @property
    def payload(self) -> slice:
        start = self.header_offset + self.header_size
        return slice(start, start + self.payload_size)


@dataclass
class PruneReport:
    keep_sm: int
    kept: Counter = field(default_factory=Counter)  # (kind name, arch) -> payload bytes kept
    zeroed: Counter = field(default_factory=Counter)  # (kind name, arch) -> payload bytes zeroed
    entries: Counter = field(default_factory=Counter)  # ("kept"|"zeroed", kind name) -> entries
    containers: int = 0
    without_kept_arch: int = 0  # fat binaries with no code a GPU of the kept architecture can load

    def as_dict(self) -> dict:
        return {
            "keep_sm": self.keep_sm,
            "containers": self.containers,
            "containers_without_kept_arch": self.without_kept_arch,
            "entries": {f"{state}_{kind}": n for (state, kind), n in sorted(self.entries.items())},
            "bytes_kept": sum(self.kept.values()),
            "bytes_zeroed": sum(self.zeroed.values()),
            "bytes_by_arch": {
                f"{kind}_sm{arch}": self.kept[(kind, arch)] + self.zeroed[(kind, arch)]
                for kind, arch in sorted(self.kept.keys() | self.zeroed.keys())
            },
        }


def fatbin_section(data: bytes | mmap.mmap) -> tuple[int, int]:
    """(offset, size) of the ``.nv_fatbin`` section of an ELF64 little-endian file."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise FatbinError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [SECTION_HEADER.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    names_offset = headers[shstrndx][4]
    for name, _type, _flags, _addr, offset, size, *_ in headers:
        start = names_offset + name
        if data[start : data.find(b"\0", start)] == b".nv_fatbin":
            return offset, size
    raise FatbinError("no .nv_fatbin section")


def fatbin_entries(data: bytes | mmap.mmap) -> list[list[Entry]]:
    """The entries of every fat binary in the ``.nv_fatbin`` section, one list per fat binary."""
    offset, size = fatbin_section(data)
    containers, pos, end = [], offset, offset + size
    while pos < end:
        magic, _version, header_size, entries_size = FATBIN_HEADER.unpack_from(data, pos)
        if magic != FATBIN_MAGIC:
            if data[pos : pos + 8] == bytes(8):  # alignment padding between fat binaries
                pos += 8
                continue
            raise FatbinError(f"no fat binary header at section offset {pos - offset}")
        entry, entries_end, entries = pos + header_size, pos + header_size + entries_size, []
        while entry < entries_end:
            kind, _, entry_header_size, payload_size, *_, arch = ENTRY_HEADER.unpack_from(data, entry)
            if kind not in KIND_NAMES:
                raise FatbinError(f"entry of unknown kind {kind} at section offset {entry - offset}")
            entries.append(Entry(kind, arch, entry, entry_header_size, payload_size))
            entry += entry_header_size + payload_size
        if entry != entries_end or entries_end > end:
            raise FatbinError(f"the fat binary at section offset {pos - offset} does not add up")
        containers.append(entries)
        pos = entries_end
    return containers


def kept_entries(entries: list[Entry], keep_sm: int) -> list[Entry]:
    """What a GPU of ``keep_sm`` loads from one fat binary: its cubins, else PTX it can compile."""
    cubins = [e for e in entries if e.kind == CUBIN and e.arch == keep_sm]
    return cubins or [e for e in entries if e.kind == PTX and e.arch <= keep_sm]


def prune(path: Path, keep_sm: int) -> PruneReport:
    """Zero, in place, the payload of every entry a GPU of ``keep_sm`` does not load."""
    report = PruneReport(keep_sm)
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as data:
        for entries in fatbin_entries(data):
            report.containers += 1
            keep = kept_entries(entries, keep_sm)
            report.without_kept_arch += not keep
            for e in entries:
                kind = KIND_NAMES[e.kind]
                if e in keep:
                    report.kept[(kind, e.arch)] += e.payload_size
                    report.entries[("kept", kind)] += 1
                else:
                    data[e.payload] = bytes(e.payload_size)
                    report.zeroed[(kind, e.arch)] += e.payload_size
                    report.entries[("zeroed", kind)] += 1
        data.flush()
    return report
