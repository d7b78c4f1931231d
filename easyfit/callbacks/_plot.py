"""Learning curves: loss and every metric per epoch, training beside validation (matplotlib)."""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Mapping, Sequence
from typing import Any

from .._files import write_files

__all__ = ["plot_history"]

_VAL = "val_"
_DPI = 110


def _panels(history: Mapping[str, Sequence[float]], metrics: Sequence[str] | None) -> list[str]:
    """Quantities to draw, one panel each: ``metrics`` as given, or loss first, then the
    metrics in the logs' order, less what fit adds to them (``input_wait``, and a
    ``learning_rate`` that never changed)."""
    names = list(dict.fromkeys(k[len(_VAL) :] if k.startswith(_VAL) else k for k in history))
    if metrics is not None:
        unknown = [m for m in metrics if m not in names]
        if unknown:
            raise ValueError(f"metrics: {unknown} not in the history, which holds {names}")
        return list(metrics)
    lr = history.get("learning_rate", ())
    names = [n for n in names if n != "input_wait" and not (n == "learning_rate" and len(set(lr)) <= 1)]
    return sorted(names, key=lambda n: n != "loss")


@functools.cache
def _figure_class() -> type:
    """A matplotlib Figure that Jupyter displays as a PNG, once, with no ``%matplotlib``: it is
    made without pyplot (which would draw it again at the cell's end) and has ``_repr_png_``."""
    from matplotlib.figure import Figure

    class LearningCurves(Figure):
        def _repr_png_(self) -> bytes:
            buffer = io.BytesIO()
            self.savefig(buffer, format="png", dpi=_DPI)
            return buffer.getvalue()

    return LearningCurves


def plot_history(
    history: Mapping[str, Sequence[float]],
    epochs: Sequence[int],
    path: str | os.PathLike | None = None,
    metrics: Sequence[str] | None = None,
) -> Any:
    """Draws ``History.history`` as one panel per quantity, training and validation together.

    Args:
        history: ``{"loss": [...], "val_loss": [...], "accuracy": [...], ...}``.
        epochs: the epoch indices of the values (``History.epoch``, counted from 0); epochs are
            labelled from 1, as the progress bar counts them.
        path: where to save the figure as a PNG (None: do not save), or in the format its
            extension names (``.pdf``, ``.svg``); written whole or not at all.
        metrics: the quantities to draw, without ``val_`` (None: loss and the metrics, not
            ``input_wait`` nor a constant ``learning_rate``).

    Returns:
        A ``matplotlib.figure.Figure`` (shown once as a picture when a notebook cell ends
        with it).

    Raises:
        ImportError: matplotlib is missing (``pip install "easyfit-flax[plot]"``).
        ValueError: the history holds no values, or ``metrics`` names one it does not hold.

    Example:
        >>> import os
        >>> from easyfit.callbacks._plot import plot_history
        >>> history = {"loss": [0.9, 0.5, 0.4], "accuracy": [0.7, 0.85, 0.9],
        ...            "val_loss": [0.6, 0.45, 0.42], "val_accuracy": [0.8, 0.86, 0.88]}
        >>> figure = plot_history(history, [0, 1, 2], DOCS_TMP + "/curves.png")
        >>> [ax.get_title() for ax in figure.axes], os.path.getsize(DOCS_TMP + "/curves.png") > 0
        (['loss', 'accuracy'], True)
    """
    try:
        from matplotlib.ticker import MaxNLocator

        Figure = _figure_class()
    except ImportError as e:
        raise ImportError('History.plot needs matplotlib: pip install "easyfit-flax[plot]"') from e
    if not any(len(v) for v in history.values()):
        raise ValueError("history: nothing to plot (no epoch has ended yet)")
    panels = _panels(history, metrics)
    if not panels:
        raise ValueError(f"history: nothing to plot with metrics={metrics!r}")
    figure = Figure(figsize=(5.0 * len(panels), 4.0), layout="constrained")
    for ax, name in zip(figure.subplots(1, len(panels), squeeze=False)[0], panels, strict=True):
        for key, label, style in ((name, "training", "-o"), (_VAL + name, "validation", "--s")):
            values = history.get(key)
            if not values:
                continue
            x = [e + 1 for e in epochs] if len(epochs) == len(values) else list(range(1, len(values) + 1))
            ax.plot(x, values, style, label=label, linewidth=2, markersize=5)
        ax.set_title(name, fontsize=13)
        ax.set_xlabel("epoch", fontsize=11)
        ax.set_ylabel(name.replace("_", " "), fontsize=11)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=10)
    if path is not None:
        _save(figure, os.fspath(path))
    return figure


def _save(figure: Any, path: str) -> None:
    """Saves ``figure`` at ``path`` as matplotlib would (the format its extension names, else
    PNG, with ``.png`` added), but drawn whole first, then written to a staging name and renamed:
    a failed save leaves the previous image as it was."""
    fmt = os.path.splitext(path)[1][1:]
    if not fmt:
        fmt = figure.canvas.get_default_filetype()
        path = path.rstrip(".") + "." + fmt
    buffer = io.BytesIO()
    figure.savefig(buffer, format=fmt, dpi=_DPI)
    write_files({path: buffer.getvalue()})
