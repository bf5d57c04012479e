"""Heatmaps a person can read, drawn by matplotlib (its object API and Agg canvas: no pyplot state).

- ViT: the chosen map over the patch grid, upsampled bilinearly onto the input image the model saw,
  with a colour scale. Always ``VIT_SIZE`` pixels.
- Translator: a token-labelled grid (rows: generated pieces, columns: source pieces or decoder
  inputs), one cell per token pair; the figure grows with the tokens (``grid_size``).

matplotlib is imported on the first heatmap, so a service that never draws one never loads it.
Drawing takes tens of milliseconds: callers run it in a thread; the lock keeps figures apart.
"""

from __future__ import annotations

import io
import threading

import numpy as np

DPI = 100
VIT_SIZE = (480, 400)  # width, height in pixels
CELL_INCHES, MIN_INCHES, MAX_INCHES = 0.32, 4.0, 40.0
_lock = threading.Lock()


def grid_size(rows: int, cols: int) -> tuple[int, int]:
    """Width and height in pixels of a token grid's PNG: room for labels plus a fixed cell size."""
    width = min(MAX_INCHES, max(MIN_INCHES, 2.4 + CELL_INCHES * cols))
    height = min(MAX_INCHES, max(MIN_INCHES, 1.6 + CELL_INCHES * rows))
    return round(width * DPI), round(height * DPI)


def _png(fig) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)  # no bbox_inches="tight": the size stays the documented one
    return buf.getvalue()


def vit_overlay(image: np.ndarray, heat: np.ndarray, title: str) -> bytes:
    """``image`` (H, W, C) uint8 under ``heat`` (grid_h, grid_w), stretched over the whole image."""
    from matplotlib.figure import Figure

    h, w = image.shape[:2]
    with _lock:
        fig = Figure(figsize=(VIT_SIZE[0] / DPI, VIT_SIZE[1] / DPI), dpi=DPI, layout="constrained")
        ax = fig.add_subplot()
        pixels = image[..., 0] if image.shape[-1] == 1 else image
        ax.imshow(pixels, cmap="gray", extent=(0, w, h, 0), interpolation="nearest")
        shown = ax.imshow(
            heat,
            cmap="inferno",
            alpha=0.55,
            extent=(0, w, h, 0),
            interpolation="bilinear",
            vmin=float(heat.min()),
            vmax=float(heat.max()),
        )
        ax.set_axis_off()
        ax.set_title(title, fontsize=10)
        fig.colorbar(shown, ax=ax, shrink=0.85, label="attention")
        return _png(fig)


def token_grid(
    matrix: np.ndarray, row_labels: list[str], col_labels: list[str], title: str, row_title: str, col_title: str
) -> bytes:
    """``matrix`` (rows, cols) as labelled cells; values in [0, 1] share one colour scale."""
    from matplotlib.figure import Figure

    rows, cols = matrix.shape
    width, height = grid_size(rows, cols)
    with _lock:
        fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
        ax = fig.add_subplot()
        shown = ax.imshow(
            matrix,
            cmap="viridis",
            vmin=0.0,
            vmax=max(1e-6, float(matrix.max())),
            aspect="auto",
            interpolation="nearest",
        )
        ax.set_xticks(range(cols), labels=col_labels, rotation=60, ha="right", rotation_mode="anchor", fontsize=8)
        ax.set_yticks(range(rows), labels=row_labels, fontsize=8)
        ax.set_xlabel(col_title)
        ax.set_ylabel(row_title)
        ax.set_title(title, fontsize=10)
        fig.colorbar(shown, ax=ax, shrink=0.85)
        return _png(fig)
