"""One weights file for all graphs of an entry, each distinct tensor stored once: ``python -m export.shared_weights ENTRY``.

A translator's three graphs hold the same parameters: the shared embedding in all three, the
decoder's layers in both the step graph and the prefix graph. Inlined, ``translator/3`` is 56 MB;
with ``weights.bin`` holding every distinct tensor of 1 KiB or more once and each graph pointing
into it (ONNX external data, which onnxruntime reads from the graph's folder), it is 33 MB. The
graphs compute exactly what they did: only where the bytes live changes.

The exporters write entries this way (the translator's three graphs, an image classifier's serving and
attention graphs); the command rewrites an existing entry in place (its manifest's ``files`` section and
each graph's ``weights`` follow) and is idempotent.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import onnx
from onnx.external_data_helper import set_external_data

from contract.manifest import ManifestError, describe_files, read_manifest, write_manifest
from model.cli import CliError, run_cli

WEIGHTS = "weights.bin"
MIN_BYTES = 1024  # smaller tensors (shapes, scalars) stay in their graph
ALIGN = 64  # each tensor starts on a 64-byte boundary of the file


def share_weights(folder: Path, graphs: list[str]) -> dict:
    """Move the large initializers of ``graphs`` (files in ``folder``) into ``folder/weights.bin``, each
    distinct tensor once; returns the sizes before and after."""
    models = {g: onnx.load(str(folder / g)) for g in graphs}  # external data (a rerun) read back in
    before = sum((folder / g).stat().st_size for g in graphs)
    stored: dict[str, tuple[int, int]] = {}  # sha256 of the bytes -> (offset, length)
    with open(folder / WEIGHTS, "wb") as f:
        for model in models.values():
            for tensor in model.graph.initializer:
                data = tensor.raw_data
                if len(data) < MIN_BYTES:
                    continue
                key = hashlib.sha256(data).hexdigest()
                if key not in stored:
                    f.write(b"\0" * (-f.tell() % ALIGN))
                    stored[key] = (f.tell(), len(data))
                    f.write(data)
                offset, length = stored[key]
                set_external_data(tensor, WEIGHTS, offset=offset, length=length)
                tensor.data_location = onnx.TensorProto.EXTERNAL
                tensor.ClearField("raw_data")
    for g, model in models.items():
        (folder / g).write_bytes(model.SerializeToString())
    after = sum((folder / g).stat().st_size for g in graphs) + (folder / WEIGHTS).stat().st_size
    return {"tensors": len(stored), "bytes_before": before, "bytes_after": after}


def record_weights(manifest: dict, folder: Path) -> None:
    """Name ``weights.bin`` as every graph's ``weights`` in ``manifest`` when ``folder`` has one (the
    service then knows which graphs hold the same parameters), and none otherwise."""
    shared = (folder / WEIGHTS).is_file()
    for graph in manifest["graphs"].values():
        if shared:
            graph["weights"] = WEIGHTS
        else:
            graph.pop("weights", None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m export.shared_weights", description=__doc__.splitlines()[0])
    p.add_argument("entry", type=Path, help="a model-repository entry, e.g. models/translator/3")
    args = p.parse_args(argv)
    try:
        manifest = read_manifest(args.entry)
    except ManifestError as e:
        raise CliError(str(e)) from None
    graphs = list(dict.fromkeys(g["file"] for g in manifest["graphs"].values()))  # the exporter's order
    sizes = share_weights(args.entry, graphs)
    manifest["files"] = describe_files(args.entry, sorted({*manifest["files"], WEIGHTS}))
    record_weights(manifest, args.entry)
    write_manifest(args.entry, manifest)
    print(
        f"{args.entry}: {sizes['tensors']} distinct tensors in {WEIGHTS}; "
        f"{sizes['bytes_before'] / 1e6:.1f} MB -> {sizes['bytes_after'] / 1e6:.1f} MB",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    run_cli(main)
