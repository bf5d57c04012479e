"""Where a decode batch's arrays live: buffers with rows to spare, so that joining and leaving rarely copy.

A :class:`contract.decoding.DecodeBatch`'s caches, masks and cross-attention arrays are the first
``n`` rows of larger buffers (:class:`Rows`). A request joins by writing its rows into the spare ones
(the running rows stay where they are); a request that leaves is replaced by the last one (``plan`` in
``contract/decoding.py``), so only that request's rows move, and of their caches only the columns in use;
neither allocates. A buffer is laid out anew (allocated, the rows copied) only when its columns change:
the cache grows by ``GROW`` columns, a joining source is longer than the batch's, or at least
``GROW`` cache or source columns fell out of use (:func:`trim_points`). Fresh buffers are what made
joining 64 rows cost 7.6 to 8.5 ms against a 12 ms step: most of it the page faults of touching
memory the allocator had just mapped.

The geometry rules (:func:`joined_capacity`, :func:`trim_points`) are shared with the device-resident
batch (``service/engine/resident.py``) so both paths show the decoder the same shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GROW = 16  # cache columns added when a batch's buffers are full; also the least trimmed


def spare_rows(rows: int, room: int | None) -> int:
    """Rows to allocate for ``rows`` in use: ``room`` (the most the batch will hold) when given, else half
    again. Rows never touched cost address space only (the pages of a large allocation are mapped on first write)."""
    return max(rows, room) if room else rows + max(GROW, rows // 2)


def joined_capacity(a_width: int, a_capacity: int, b_width: int) -> int:
    """Cache columns of batch a joined by batch b: a's own when b fits in its columns (so a's rows stay in place)."""
    return a_capacity if b_width <= a_width else b_width + GROW


def trim_points(cache_mask: np.ndarray, src_mask: np.ndarray, width: int) -> tuple[int, int]:
    """(first, last): the batch of these rows keeps cache columns from ``first`` and source columns up to
    ``last``; columns no row uses are dropped only when there are at least ``GROW`` of them."""
    used = cache_mask[:, :width].any(0)
    first = int(np.argmax(used)) if used.any() else width
    s = src_mask.shape[1]
    last = int(s - np.argmax(src_mask.any(0)[::-1])) if len(src_mask) else 0
    return (first if first >= GROW else 0), (last if s - last >= GROW else s)


@dataclass
class Rows:
    """The whole buffers a batch's arrays are the leading rows of: per layer (rows, H, C, Dh) caches and
    (rows / group, H, S, Dh) cross-attention keys/values, the (rows, C) cache mask and the (rows / group, S)
    source mask (``group`` rows share a cross-attention row: a request's beams). Rows past the batch's are
    never read before they are written."""

    past_keys: list[np.ndarray]
    past_values: list[np.ndarray]
    cache_mask: np.ndarray
    cross_keys: list[np.ndarray]
    cross_values: list[np.ndarray]
    src_mask: np.ndarray
    group: int = 1

    def __len__(self) -> int:
        return len(self.cache_mask)

    @property
    def capacity(self) -> int:
        return self.cache_mask.shape[1]

    @property
    def source(self) -> int:
        return self.src_mask.shape[1]

    @classmethod
    def allocate(cls, like, rows: int, capacity: int, source: int, group: int = 1) -> Rows:
        """Uninitialised buffers shaped like batch ``like``'s, for ``rows`` rows, ``capacity`` cache and ``source`` columns."""
        keys = like.past_keys[0]
        return cls.empty(len(like.past_keys), keys.shape[1], keys.shape[3], keys.dtype, rows, capacity, source, group)

    @classmethod
    def empty(
        cls, layers: int, heads: int, head_dim: int, dtype, rows: int, capacity: int, source: int, group: int = 1
    ) -> Rows:
        """Uninitialised buffers for ``layers`` layers of ``heads`` x ``head_dim``."""
        crosses = -(-rows // group)

        def shaped(n: int, columns: int) -> list[np.ndarray]:
            return [np.empty((n, heads, columns, head_dim), dtype) for _ in range(layers)]

        return cls(
            shaped(rows, capacity),
            shaped(rows, capacity),
            np.empty((rows, capacity), bool),
            shaped(crosses, source),
            shaped(crosses, source),
            np.empty((crosses, source), bool),
            group,
        )

    def caches(self) -> list[np.ndarray]:
        return [*self.past_keys, *self.past_values]

    def crosses(self) -> list[np.ndarray]:
        return [*self.cross_keys, *self.cross_values]

    def write(self, at: int, batch, width: int) -> None:
        """Batch ``batch``'s rows into rows ``at`` on, their cache columns ending at ``width`` (left-padded
        with zeros and masked), their sources right-padded; the rest of those rows zero. ``batch`` has this
        group, and ``at`` is a multiple of it."""
        end, start = at + len(batch), width - batch.width
        first, last = at // self.group, end // self.group  # its cross-attention rows
        for full, x in zip(self.caches(), [*batch.past_keys, *batch.past_values]):
            full[at:end, :, :start] = 0
            full[at:end, :, start:width] = x[:, :, : batch.width]
            full[at:end, :, width:] = 0
        self.cache_mask[at:end] = False
        self.cache_mask[at:end, start:width] = batch.cache_mask[:, : batch.width]
        s = batch.src_mask.shape[1]
        for full, x in zip(self.crosses(), [*batch.cross_keys, *batch.cross_values]):
            full[first:last, :, :s] = x[:, :, :s]
            full[first:last, :, s:] = 0
        self.src_mask[first:last, :s] = batch.src_mask[:, :s]
        self.src_mask[first:last, s:] = False

    def grown(self, n: int, columns: int) -> Rows:
        """Buffers with ``columns`` more cache columns, zero and masked, holding the first ``n`` rows of these
        (the cross-attention buffers are shared: their columns do not change)."""

        def grow(old: np.ndarray) -> np.ndarray:
            new = np.empty((len(self), old.shape[1], old.shape[2] + columns, old.shape[3]), old.dtype)
            new[:n, :, : old.shape[2]] = old[:n]
            new[:n, :, old.shape[2] :] = 0
            return new

        mask = np.zeros((len(self), self.capacity + columns), bool)
        mask[:n, : self.capacity] = self.cache_mask[:n]
        keys, values = [grow(k) for k in self.past_keys], [grow(v) for v in self.past_values]
        return Rows(keys, values, mask, self.cross_keys, self.cross_values, self.src_mask, self.group)

    def gather(self, rows: np.ndarray, groups: np.ndarray | None = None, width: int | None = None) -> None:
        """Row ``i`` becomes row ``rows[i]`` in place, and cross-attention row ``j`` row ``groups[j]`` (default:
        ``rows``, for group 1); only rows that change are copied, and of the caches only the first ``width``
        columns (default: all): past a batch's width every row in use is zero and masked already."""
        w = self.capacity if width is None else width
        for index, buffers in (
            (rows, [c[:, :, :w] for c in self.caches()] + [self.cache_mask[:, :w]]),
            (rows if groups is None else groups, [*self.crosses(), self.src_mask]),
        ):
            moved = np.flatnonzero(index != np.arange(len(index)))
            if len(moved):
                sources = index[moved]
                for full in buffers:
                    full[moved] = full[sources]  # the right side is gathered before anything is written
