"""The data checked against the model before any step is traced: the loss inferred from the
labels, the labels checked against the loss and the model's outputs, and the inputs against the
shape the model was built for.

A label outside the model's outputs (a class index, or a class id of a segmentation mask's
pixel) or a float label under a sparse loss does not fail in the step: ``one_hot`` gives zeros,
the integer cross-entropy gathers garbage, and training goes on to a silently wrong result. So
each source's labels are checked once, on the host: all of them when the source knows them
without decoding (``Source.known_labels``), else those of the first batch, and then each label
as its record is fed (``Source.limit_labels``). Inputs of another shape are refused naming both
shapes, before the model sees them. The trainer calls these with what the data side exposes (the
source's labels and label dtype, a first batch) and the model's shapes; the data side never
calls the model.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from ..core.losses import infer_losses, is_structured
from ..core.multi_output import losses_by_output
from ..data.sources.base import Source
from ..data.sources.capabilities import FedLabels, InMemory, base_of, known_labels
from ..errors import DataError
from ..parallel import local_rows

__all__ = [
    "LabelChecks",
    "check_input_shape",
    "check_labels",
    "check_source_labels",
    "infer_loss_for",
    "labels_of",
]

_SPARSE = ("sparse_categorical_crossentropy",)
_CLASS_INDICES = ("sparse_categorical_crossentropy", "categorical_crossentropy")
_ELEMENTWISE = ("binary_crossentropy", "mse", "mean_squared_error", "mae", "mean_absolute_error")


def _takes(loss: str, integer: bool, label: tuple[int, ...], out: tuple[int, ...]) -> str | None:
    """What ``loss`` takes as labels for outputs of shape ``out`` per sample, when labels of
    shape ``label`` per sample are not that (None when they fit, or the loss is not known)."""
    if not out:
        out = (1,)
    indices = label in (out[:-1], (*out[:-1], 1))  # a class index per sample (or pixel)
    per = "pixel" if len(out) > 1 else "sample"
    if loss in _SPARSE:
        return None if indices else f"one integer class index per {per} (shape {out[:-1]} per sample)"
    if loss in _CLASS_INDICES:  # one-hot rows or probabilities, or integer class indices
        if label == out or (indices and integer):
            return None
        return f"{out[-1]} class probabilities per {per} (shape {out} per sample) or integer class indices"
    if loss in _ELEMENTWISE:
        size = int(np.prod(out))
        return None if int(np.prod(label)) == size else f"{size} targets per sample (shape {out})"
    return None


def _origin(source: Source) -> str:
    return "y" if isinstance(base_of(source), InMemory) else source.describe()


def check_labels(
    source: Source,
    loss: Any,
    num_outputs: int,
    batch_labels: np.ndarray,
    batch_mask: np.ndarray,
    output: Any = None,
    output_shape: tuple[int, ...] | None = None,
    inferred: str | None = None,
) -> None:
    """Raises DataError if ``source``'s labels do not fit ``loss`` and ``num_outputs``, or
    their shape the model's ``output_shape``, before any step is traced (where the mismatch
    would come out of JAX as a reshape error naming neither).

    Args:
        source: the data.
        loss: the loss (only Keras loss names are checked).
        num_outputs: size of the model's last output axis.
        batch_labels: the labels of a first batch, used when the source does not know its
            labels.
        batch_mask: that batch's validity mask.
        output: for a dict or a tuple of labels (several outputs), the key of the output
            checked: ``batch_labels`` and ``num_outputs`` are that output's.
        output_shape: one sample's output shape (the batch axis left out); None: not checked.
        inferred: why ``loss`` was inferred, when it was not given (said in a shape error).

    Example:
        >>> import numpy as np, easyfit as ef
        >>> from easyfit.training.checks import check_labels
        >>> data = ef.data.Arrays(np.zeros((3, 2)), np.array([0, 4, 12]))
        >>> check_labels(data, "sparse_categorical_crossentropy", 10, None, None)
        Traceback (most recent call last):
        ...
        easyfit.errors.DataError: y: label 12 (at x[2]) is outside the model's 10 outputs; ...
    """
    if not isinstance(loss, str):
        return
    dtype = source.label_dtype if output is None else np.asarray(batch_labels).dtype
    origin = _origin(source) if output is None else f"y[{output!r}]"
    integer = np.issubdtype(dtype, np.integer)
    if loss in _SPARSE and not integer:
        raise DataError(
            f"{origin}: {dtype} labels given to loss={loss!r}, "
            "which takes integer class indices; pass integer labels (e.g. "
            "y.astype('int32')), or choose a loss for float targets such as 'mse'"
        )
    if output_shape is not None and batch_labels is not None:
        rows = np.asarray(batch_labels)
        label_shape = tuple(rows.shape[np.ndim(batch_mask) :])
        takes = _takes(loss, integer, label_shape, tuple(output_shape))
        if takes is not None:
            hint = (
                f"; {inferred}: pass loss= explicitly, or integer class indices "
                "(y.astype('int32')), for which 'sparse_categorical_crossentropy' is inferred"
                if inferred
                else "; give labels of that shape, or a model whose output fits them"
            )
            raise DataError(
                f"{origin}: labels of shape {label_shape} per sample do not fit the model's "
                f"output of shape {tuple(output_shape)} per sample: loss={loss!r} takes {takes}{hint}"
            )
    if loss not in _CLASS_INDICES or not integer:
        return
    labels = known_labels(source)
    if labels is not None and output is not None:
        labels = labels[output]
    known = labels is not None
    if labels is None:
        labels = np.asarray(batch_labels)[np.asarray(batch_mask, bool)]
    if np.ndim(labels) == 2 and np.shape(labels)[1] == 1:  # (n, 1): class indices too
        labels = np.asarray(labels)[:, 0]
    dense = np.ndim(labels) > 1 and loss in _SPARSE  # a class index per pixel (masks)
    if (np.ndim(labels) != 1 and not dense) or len(labels) == 0:  # one-hot, multi-label: not indices
        return
    if not known and output is None and isinstance(source, FedLabels):
        source.limit_labels(num_outputs)  # every later label is checked too, naming its record
    rows = np.asarray(labels).reshape(len(labels), -1)
    bad = np.flatnonzero(((rows < 0) | (rows >= num_outputs)).any(axis=1))
    if len(bad):
        i = int(bad[0])
        where = f" (at {source.locate(i)})" if known else " (in the first batch)"
        if dense:
            value = rows[i][(rows[i] < 0) | (rows[i] >= num_outputs)][0]
            raise DataError(
                f"{_origin(source)}: class id {int(value)}{where} is outside the model's "
                f"{num_outputs} outputs per pixel; class ids must be in 0..{num_outputs - 1}"
            )
        raise DataError(
            f"{origin}: label {int(labels[i])}{where} is outside the "
            f"model's {num_outputs} outputs; class indices must be in "
            f"0..{num_outputs - 1}"
        )


def _is_shape(node: Any) -> bool:
    """Whether ``node`` is one output's shape (a tuple of ints), not a dict or tuple of them."""
    return isinstance(node, tuple) and all(isinstance(d, int) for d in node)


def labels_of(source: Source, chunk: Mapping[str, Any]) -> Any:
    """Every label of ``source`` when it knows them, else those of a first batch (valid rows of
    this process): what a loss is inferred from (for several outputs, a dict or a tuple of
    arrays)."""
    labels = known_labels(source)
    if labels is None:
        mask = np.asarray(local_rows(chunk["mask"])).astype(bool)
        labels = jax.tree_util.tree_map(lambda y: np.asarray(local_rows(y))[mask], chunk["y"])
    return labels


def infer_loss_for(source: Source, chunk: Mapping[str, Any]) -> tuple[Any, str]:
    """The loss inferred from ``source``'s labels (``easyfit.core.losses.infer_losses``)
    and a sentence saying which and why, for a trainer given ``loss=None``."""
    known = labels_of(source, chunk)
    loss, why = infer_losses(None, chunk["y"], known, source.label_dtype, source.default_loss)
    return loss, f"loss={loss!r} (none given; {why})"


def check_source_labels(
    source: Source,
    loss: Any,
    output_shapes: Callable[[], Any],
    chunk: Mapping[str, Any],
    inferred: str | None = None,
) -> None:
    """Checks ``source``'s labels against ``loss`` and the model's ``output_shapes()`` (one
    sample's shape per output: ``ModelAdapter.output_shapes``); ``chunk`` gives a first batch's
    labels. For a dict or tuple ``y``, each output is checked against its own loss and shape.
    ``inferred``: why the loss was inferred, when it was (named in an error)."""
    y, mask = chunk["y"], np.asarray(local_rows(chunk["mask"]))
    shapes = output_shapes()
    if not is_structured(y):
        shape = shapes if _is_shape(shapes) else None
        size = (shape[-1] if shape else 1) if shape is not None else shapes
        rows = np.asarray(local_rows(y))
        check_labels(source, loss, size, rows, mask, output_shape=shape, inferred=inferred)
        return
    for key, output_loss in losses_by_output(loss, y).items():
        try:
            shape = shapes[key]
        except (KeyError, IndexError, TypeError):
            continue  # the model's outputs are not laid out as y: the loss says so
        if not _is_shape(shape):
            continue
        rows = np.asarray(local_rows(y[key]))
        size = shape[-1] if shape else 1
        check_labels(source, output_loss, size, rows, mask, output=key, output_shape=shape, inferred=inferred)


class LabelChecks:
    """A trainer's labels: the loss inferred from them when none was given (``note`` says which
    and why, and the log), and each source's labels checked against the loss once."""

    def __init__(self) -> None:
        self.note: str | None = None
        self._checked: weakref.WeakSet[Any] = weakref.WeakSet()

    def infer(self, source: Source, chunk: Mapping[str, Any]) -> Any:
        """The loss inferred from ``source``'s labels (``infer_loss_for``)."""
        loss, self.note = infer_loss_for(source, chunk)
        logging.getLogger("easyfit").info("easyfit: %s", self.note)
        return loss

    def check(
        self, source: Source, loss: Any, output_shapes: Callable[[], Any], chunk: Mapping[str, Any]
    ) -> None:
        """``check_source_labels``, the first time ``source`` is seen."""
        if source in self._checked:
            return
        self._checked.add(source)
        check_source_labels(source, loss, output_shapes, chunk, inferred=self.note)


def _is_spec_shape(spec: Any) -> bool:
    """Whether ``spec`` (from ``input_spec``) is one input's shape, not a dict or list of them."""
    return isinstance(spec, (list, tuple)) and all(isinstance(d, int) for d in spec)


def _shown(spec: Any) -> str:
    """A shape from ``input_spec`` as Python writes shapes: ``(28, 28, 1)``."""
    if _is_spec_shape(spec):
        return str(tuple(spec))
    if isinstance(spec, dict):
        return "{" + ", ".join(f"{k!r}: {_shown(v)}" for k, v in spec.items()) + "}"
    return "(" + ", ".join(_shown(v) for v in spec) + ("," if len(spec) == 1 else "") + ")"


def check_input_shape(built: Any, received: Any, try_model: Callable[[Any], Any], what: str) -> None:
    """Raises DataError naming both shapes when samples of shape ``received`` cannot go into a
    model built for samples of shape ``built`` (both from ``easyfit.core.models.input_spec``), before the
    model sees them.

    Samples of one axis fewer are refused outright (one image given without its batch axis
    reads as that many rows); other shapes are refused when ``try_model(received)`` (the model
    traced on abstract inputs: shapes only, no computation) raises, so that a model that takes
    several sizes (a fully convolutional one) still does.

    Args:
        built: the sample shape the model's parameters were made for.
        received: the sample shape of the batch at hand.
        try_model: traces the model on samples of a given shape, raising if it cannot.
        what: the data, for the message (a source's ``describe()``).

    Raises:
        easyfit.errors.DataError: the shapes do not fit.

    Example:
        >>> from easyfit.training.checks import check_input_shape
        >>> check_input_shape([28, 28, 1], [28, 1], print, "x")
        Traceback (most recent call last):
        ...
        easyfit.errors.DataError: x: the model was built for samples of shape (28, 28, 1) and ...
    """
    if received == built:
        return
    fewer = _is_spec_shape(built) and _is_spec_shape(received) and len(received) == len(built) - 1
    failure: Exception | None = None
    if not fewer:
        try:
            try_model(received)
            return  # the model takes these samples too
        except Exception as e:  # noqa: BLE001 - any failure of the model on this shape
            failure = e
    message = (
        f"{what}: the model was built for samples of shape {_shown(built)} and received samples "
        f"of shape {_shown(received)}"
    )
    if fewer:
        message += (
            ": a single image? add a batch axis (x[None], or np.expand_dims(x, 0)); an array's "
            "first axis counts the samples"
        )
    else:
        message += f" ({type(failure).__name__} in the model); resize or reshape the inputs"
    raise DataError(message) from failure
