"""Decoding with every buffer of the batch on the decoder session's device (onnxruntime OrtValues).

The numpy path (``contract/decoding.py``) hands onnxruntime host arrays: on a GPU each step would
copy every layer's cache to the device and the new keys/values back, and beams would reorder on the
host. Here the caches, the cross-attention keys/values and both masks are OrtValues where the
session runs; each step goes through IO binding, with the step's outputs bound to the buffers of
the batch's first step; only the token ids and positions go in, and only each row's best
candidates come out (the whole log-probs only for a request that records them). Writing the new
column, reordering beams, joining batches and dropping rows are the small graphs of
``service/engine/cache_graphs.py``, run on the same provider. The search itself is the contract's
(``advance``, ``plan``), so both paths pick the same tokens with the same scores.

On the CPU provider the same code runs on CPU OrtValues; ``service/translator.py`` says which path
serves where, and why.
"""

from __future__ import annotations

import threading

import numpy as np
import onnxruntime as ort

from contract.batch_rows import joined_capacity, trim_points
from contract.constraints import Limit, apply
from contract.decoding import (
    GROW,
    DecodeRequest,
    DecoderSpec,
    Graph,
    advance,
    candidates_needed,
    cross_layout,
    length_runs,
    pad_sources,
    per_layer,
    plan,
    session_fn,
    top_candidates,
)
from service.engine import cache_graphs

CUDA = "CUDAExecutionProvider"
_NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


def _dtype(args, name: str) -> np.dtype:
    return np.dtype(_NUMPY_TYPES[next(a.type for a in args if a.name == name)])


class CacheGraphs:
    """One model's cache graphs as sessions on its decoder's device, and how to run a graph there."""

    def __init__(self, encoder: ort.InferenceSession, decoder: ort.InferenceSession, layers: int) -> None:
        self.layers = layers
        provider = decoder.get_providers()[0]
        self.device = (
            ("cuda", int(decoder.get_provider_options()[CUDA]["device_id"])) if provider == CUDA else ("cpu", 0)
        )
        self._providers = [(p, decoder.get_provider_options().get(p, {})) for p in decoder.get_providers()]
        self._options = decoder.get_session_options()
        cache = _dtype(decoder.get_inputs(), "past_keys_0")
        self.source = _dtype(decoder.get_inputs(), "cross_keys_0")
        scores = _dtype(decoder.get_outputs(), "log_probs")
        self.cache = cache
        self.advance = self._session(cache_graphs.advance(layers, cache, scores))
        self.pick = self._session(cache_graphs.pick(scores))
        self.reorder = self._session(cache_graphs.reorder(layers, cache))
        self.take = self._session(cache_graphs.take(layers, cache, self.source))
        self.join = self._session(cache_graphs.join(layers, cache, self.source))
        self.grow = self._session(cache_graphs.grow(layers, cache, GROW))
        self._starts: dict[int, ort.InferenceSession] = {}  # by number of encoder runs
        self._lock = threading.Lock()

    def _session(self, graph: bytes) -> ort.InferenceSession:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self._options.intra_op_num_threads
        opts.inter_op_num_threads = self._options.inter_op_num_threads
        for key in ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning"):
            try:
                opts.add_session_config_entry(key, self._options.get_session_config_entry(key))
            except RuntimeError:  # the decoder's session left it to onnxruntime's default
                pass
        opts.log_severity_level = 3
        return ort.InferenceSession(graph, opts, providers=self._providers)

    def start(self, runs: int) -> ort.InferenceSession:
        with self._lock:  # warm-up and the scheduler's worker may both start batches
            if runs not in self._starts:
                self._starts[runs] = self._session(cache_graphs.start(self.layers, runs, self.cache, self.source))
            return self._starts[runs]

    def upload(self, array: np.ndarray) -> ort.OrtValue:
        """A copy of a host array on the device (on the CPU too: the OrtValue must not alias the host mirror)."""
        return ort.OrtValue.ortvalue_from_numpy(np.array(array, copy=True), *self.device)

    def run(
        self,
        session: ort.InferenceSession,
        inputs: dict[str, ort.OrtValue | np.ndarray],
        outputs: dict[str, ort.OrtValue | str | None],
    ) -> dict[str, ort.OrtValue]:
        """One run through IO binding. Host arrays in ``inputs`` are copied where the graph wants them;
        an output is written into the OrtValue given, or allocated on the device (None) or the host ("cpu")."""
        io = session.io_binding()
        for name, value in inputs.items():
            if isinstance(value, np.ndarray):
                io.bind_cpu_input(name, value)
            else:
                io.bind_ortvalue_input(name, value)
        for name, value in outputs.items():
            if value is None:
                io.bind_output(name, *self.device)
            elif isinstance(value, str):
                io.bind_output(name, value)
            else:
                io.bind_ortvalue_output(name, value)
        session.run_with_iobinding(io)
        return dict(zip(outputs, io.get_outputs()))


class ResidentEncoder:
    """The encoder graph (a plain name -> array callable too) that starts batches on the device."""

    def __init__(self, session: ort.InferenceSession, outputs: list[str], graphs: CacheGraphs) -> None:
        self.session, self.graphs = session, graphs
        self._host = session_fn(session, outputs)

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._host(feeds)

    def start_batch(self, requests: list[DecodeRequest], spec: DecoderSpec) -> DeviceBatch:
        """Encode in :func:`length_runs` as the numpy path does; the runs' keys/values stay on the device,
        where one graph pads, stacks and spreads them over the rows (a request's beams share its encoding)."""
        g = self.graphs
        width = max(len(r.source) for r in requests)
        mask = np.zeros((len(requests), width), dtype=bool)
        runs = length_runs([len(r.source) for r in requests])
        feeds: dict[str, ort.OrtValue | np.ndarray] = {}
        stacked: list[int] = []  # request index of each stacked row
        for n, run in enumerate(runs):
            ids, run_mask = pad_sources([requests[i].source for i in run], spec.pad_id)
            out = g.run(
                self.session, {"src_ids": ids, "src_mask": run_mask}, {"cross_keys": None, "cross_values": None}
            )
            feeds[f"keys_{n}"], feeds[f"values_{n}"] = out["cross_keys"], out["cross_values"]
            feeds[f"pads_{n}"] = np.array([0] * 8 + [width - ids.shape[1], 0], dtype=np.int64)
            mask[run, : ids.shape[1]] = run_mask
            stacked += run
        at = {request: i for i, request in enumerate(stacked)}
        rows = sum(r.beam for r in requests)
        group, cross = cross_layout(requests, spec)
        feeds["rows"] = np.array([at[r] for r in cross], dtype=np.int64)
        feeds["cache_shape"] = np.array([rows, spec.heads, GROW, spec.head_dim], dtype=np.int64)
        names = cache_graphs.cross(g.layers) + cache_graphs.caches(g.layers)
        out = g.run(g.start(len(runs)), feeds, {f"{n}_out": None for n in names})
        return DeviceBatch(
            g,
            list(requests),
            np.full(rows, spec.bos_id, dtype=np.int64),
            [out[f"{n}_out"] for n in cache_graphs.caches(g.layers)],
            np.zeros((rows, GROW), dtype=bool),
            0,
            [out[f"{n}_out"] for n in cache_graphs.cross(g.layers)],
            mask[cross],
            group,
        )


class ResidentDecoder:
    """The step graph (a plain name -> array callable too), which device batches run through IO binding."""

    def __init__(self, session: ort.InferenceSession, outputs: list[str]) -> None:
        self.session = session
        self._host = session_fn(session, outputs)
        self.outputs = outputs

    def __call__(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._host(feeds)


class DeviceScores:
    """A step's best candidates, brought to the host; the log-probs of the rows asked for, and only those."""

    def __init__(self, ids: np.ndarray, values: np.ndarray, log_probs: ort.OrtValue, graphs: CacheGraphs) -> None:
        self.ids, self.values, self._log_probs, self._graphs = ids, values, log_probs, graphs
        self._constrained: dict[int, np.ndarray] = {}  # row -> its log-probs with what it may not emit at -inf

    def best(self, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        return self.ids[rows, :k], self.values[rows, :k]

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """The log-probs of ``rows`` on the host: a gather on the device first, so a GPU sends (R, V), not (B, V)."""
        feeds = {"log_probs": self._log_probs, "rows": np.ascontiguousarray(rows, dtype=np.int64)}
        return self._graphs.run(self._graphs.pick, feeds, {"picked": "cpu"})["picked"].numpy()

    def full(self, rows: np.ndarray) -> np.ndarray:
        out = self.rows(rows)
        for i, row in enumerate(rows.tolist()):
            if row in self._constrained:
                out[i] = self._constrained[row]
        return out

    def constrain(self, limits: list[Limit]) -> None:
        """The constrained rows come to the host (the only rows that do), are masked there, and their best
        candidates are found again: the device's TopK ranked what they may not emit."""
        rows = np.array([r for where, *_ in limits for r in where], dtype=np.int64)
        local = {r: i for i, r in enumerate(rows.tolist())}
        host = self.rows(rows)
        apply(host, [([local[r] for r in where], *rest) for where, *rest in limits])
        ids, values = top_candidates(host, self.ids.shape[1])
        self.ids, self.values = self.ids.copy(), self.values.copy()
        self.ids[rows], self.values[rows] = ids, values
        self._constrained = dict(zip(rows.tolist(), host))


class DeviceBatch:
    """The numpy :class:`~contract.decoding.DecodeBatch`'s geometry (same capacity, width, padding and
    trimming, so the decoder sees the same shapes and computes the same numbers), its buffers on the device.

    The masks are kept on the host too, where the trimming reads them; the device copies are the graphs'.
    """

    def __init__(
        self,
        graphs: CacheGraphs,
        requests: list[DecodeRequest],
        tokens: np.ndarray,
        past: list[ort.OrtValue],  # every layer's keys, then every layer's values: (rows, H, C, Dh)
        cache_mask: np.ndarray,
        width: int,
        cross: list[ort.OrtValue],  # keys then values: (rows / group, H, S, Dh)
        src_mask: np.ndarray,  # (rows / group, S)
        group: int = 1,  # rows sharing a cross-attention row (DecodeBatch.group)
    ) -> None:
        self.graphs, self.requests, self.tokens, self.width, self.group = graphs, requests, tokens, width, group
        self.past, self.cross = past, cross
        self._mask, self._src_mask = cache_mask, src_mask
        self._device_mask = graphs.upload(cache_mask) if len(tokens) else None
        self._device_src_mask = graphs.upload(src_mask) if len(tokens) else None
        self._outputs: dict[str, ort.OrtValue] = {}  # the decoder's outputs, bound again at every step

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def capacity(self) -> int:
        return self._mask.shape[1]

    @property
    def positions(self) -> np.ndarray:
        return np.repeat(np.array([r.steps for r in self.requests], dtype=np.int64), [r.beam for r in self.requests])

    # Read back from the device, for inspection (tests): decoding itself never does.
    @property
    def cache_mask(self) -> np.ndarray:
        return self._device_mask.numpy().copy()

    @property
    def src_mask(self) -> np.ndarray:
        return self._device_src_mask.numpy().copy()

    @property
    def past_keys(self) -> list[np.ndarray]:
        return [v.numpy().copy() for v in self.past[: self.graphs.layers]]

    @property
    def past_values(self) -> list[np.ndarray]:
        return [v.numpy().copy() for v in self.past[self.graphs.layers :]]

    @property
    def cross_keys(self) -> list[np.ndarray]:
        return [v.numpy().copy() for v in self.cross[: self.graphs.layers]]

    @property
    def cross_values(self) -> list[np.ndarray]:
        return [v.numpy().copy() for v in self.cross[self.graphs.layers :]]

    def step(self, decoder: Graph, spec: DecoderSpec) -> tuple[list[DecodeRequest], DeviceBatch]:
        """:func:`contract.decoding.step` on the device: one decoder run, one run writing its keys/values
        and ranking its candidates, and a gather when beams reorder or rows leave."""
        if not isinstance(decoder, ResidentDecoder):
            raise TypeError("a device batch steps through the ResidentDecoder of its model")
        g, layers = self.graphs, self.graphs.layers
        if self.width == self.capacity:
            self._grow()
        caches = cache_graphs.caches(layers)
        feeds = {
            "tokens": self.tokens[:, None],
            "positions": self.positions[:, None],
            "cache_mask": self._device_mask,
            "src_mask": self._device_src_mask,
        }
        feeds |= dict(zip(caches, self.past)) | dict(zip(cache_graphs.cross(layers), self.cross))
        self._outputs = g.run(decoder.session, feeds, {n: self._outputs.get(n) for n in decoder.outputs})
        k = candidates_needed(self.requests, self._outputs["log_probs"].shape()[1])
        feeds = {
            "log_probs": self._outputs["log_probs"],
            "k": np.array([k], dtype=np.int64),
            "column": np.array([self.width], dtype=np.int64),
            "cache_mask": self._device_mask,
        }
        feeds |= {n: self._outputs[n] for n in per_layer("new_keys", layers) + per_layer("new_values", layers)}
        feeds |= dict(zip(caches, self.past))
        written = {f"{n}_out": v for n, v in zip(caches, self.past)} | {"cache_mask_out": self._device_mask}
        top = g.run(g.advance, feeds, {"top_values": "cpu", "top_ids": "cpu", **written})
        self._mask[:, self.width] = True
        self.width += 1
        scores = DeviceScores(top["top_ids"].numpy(), top["top_values"].numpy(), self._outputs["log_probs"], g)
        finished, keep, order, tokens = plan(self.requests, advance(self.requests, scores, spec.eos_id))
        if finished:
            return finished, self._take(order, keep, tokens)
        moved = np.flatnonzero(order != np.arange(len(order)))  # beams reorder within their requests
        if len(moved):
            feeds = dict(zip(caches, self.past)) | {"moved": moved[:, None], "sources": order[moved]}
            g.run(g.reorder, feeds, {f"{n}_out": v for n, v in zip(caches, self.past)})
        self.tokens = tokens
        return finished, self

    def _grow(self) -> None:
        caches = cache_graphs.caches(self.graphs.layers)
        out = self.graphs.run(self.graphs.grow, dict(zip(caches, self.past)), {f"{n}_out": None for n in caches})
        self.past = [out[f"{n}_out"] for n in caches]
        self._mask = np.pad(self._mask, ((0, 0), (0, GROW)))
        self._device_mask = self.graphs.upload(self._mask)

    def _take(self, rows: np.ndarray, requests: list[DecodeRequest], tokens: np.ndarray) -> DeviceBatch:
        """The rows that go on (in ``rows``' order), trimmed of cache and source columns none of them uses."""
        g = self.graphs
        if not len(rows):
            return DeviceBatch(g, [], tokens, [], self._mask[:0], 0, [], self._src_mask[:0], self.group)
        groups = rows[:: self.group] // self.group  # a request's rows stay together
        cache_mask, src_mask = self._mask[rows], self._src_mask[groups]
        first, last = trim_points(cache_mask, src_mask, self.width)
        return self._gathered(rows, groups, first, last, requests, tokens)

    def _per_row(self) -> DeviceBatch:
        """This batch with a cross-attention row for each row (group 1)."""
        if self.group == 1:
            return self
        rows = np.arange(len(self))
        return self._gathered(rows, rows // self.group, 0, self._src_mask.shape[1], self.requests, self.tokens, 1)

    def _gathered(self, rows, groups, first, last, requests, tokens, group: int | None = None) -> DeviceBatch:
        g = self.graphs
        cache_mask, src_mask = self._mask[rows], self._src_mask[groups]
        caches, cross = cache_graphs.caches(g.layers), cache_graphs.cross(g.layers)
        feeds = dict(zip(caches, self.past)) | dict(zip(cross, self.cross))
        feeds |= {"rows": rows, "cross_rows": groups}
        feeds |= {"first": np.array([first], np.int64), "last": np.array([last], np.int64)}
        out = g.run(g.take, feeds, {f"{n}_out": None for n in caches + cross})
        return DeviceBatch(
            g,
            requests,
            tokens,
            [out[f"{n}_out"] for n in caches],
            cache_mask[:, first:],
            self.width - first,
            [out[f"{n}_out"] for n in cross],
            src_mask[:, :last],
            self.group if group is None else group,
        )

    def concatenate(self, other: DeviceBatch) -> DeviceBatch:
        """:func:`contract.decoding.concatenate` on the device: caches end at the wider width, room after."""
        if not isinstance(other, DeviceBatch):
            raise TypeError("a device batch joins device batches only")
        a, b, g = self, other, self.graphs
        if a.group != b.group:  # requests of another beam width: a cross-attention row for every row again
            a, b = a._per_row(), b._per_row()
        width, s = max(a.width, b.width), max(a._src_mask.shape[1], b._src_mask.shape[1])
        capacity = joined_capacity(a.width, a.capacity, b.width)
        mask = np.zeros((len(a) + len(b), capacity), dtype=bool)
        mask[: len(a), width - a.width : width] = a._mask[:, : a.width]
        mask[len(a) :, width - b.width : width] = b._mask[:, : b.width]
        src_mask = np.zeros((len(a._src_mask) + len(b._src_mask), s), dtype=bool)
        src_mask[: len(a._src_mask), : a._src_mask.shape[1]] = a._src_mask
        src_mask[len(a._src_mask) :, : b._src_mask.shape[1]] = b._src_mask
        caches, cross = cache_graphs.caches(g.layers), cache_graphs.cross(g.layers)
        feeds: dict[str, ort.OrtValue | np.ndarray] = {}
        for side, x in (("a", a), ("b", b)):
            feeds |= {f"{side}_{n}": v for n, v in zip(caches, x.past)}
            feeds |= {f"{side}_{n}": v for n, v in zip(cross, x.cross)}
            feeds[f"{side}_width"] = np.array([x.width], dtype=np.int64)
            feeds[f"{side}_pads"] = np.array([0, 0, width - x.width, 0, 0, 0, capacity - width, 0], dtype=np.int64)
            feeds[f"{side}_source_pads"] = np.array([0, 0, 0, 0, 0, 0, s - x._src_mask.shape[1], 0], dtype=np.int64)
        out = g.run(g.join, feeds, {f"{n}_out": None for n in caches + cross})
        return DeviceBatch(
            g,
            a.requests + b.requests,
            np.concatenate([a.tokens, b.tokens]),
            [out[f"{n}_out"] for n in caches],
            mask,
            width,
            [out[f"{n}_out"] for n in cross],
            src_mask,
            a.group,
        )
