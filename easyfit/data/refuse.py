"""Inputs easyfit does not take, refused with a message that says what it does take.

easyfit reads a dataset by sample index: its sampler picks which samples make up each batch, so
that it can shuffle the whole dataset, shard it over devices and resume exactly. Inputs that
can only be iterated (a generator of batches, a ``tf.data.Dataset``, a torch ``DataLoader``)
or that are already cut into batches (a list of ``(x, y)`` batches) cannot be read that way.
"""

from __future__ import annotations

import collections.abc
import inspect
from typing import Any

__all__ = ["SUPPORTED", "refuse", "unsupported"]

#: What every refusal says is supported.
SUPPORTED = (
    "Supported: a folder or file path (image folders, .npy folders, RecordIO, TFRecord, "
    "WebDataset, Caffe2 LMDB), arrays x and y (or dicts or tuples of arrays), or an easyfit.data "
    "source; see 'What fit accepts' in docs/data.md"
)

_INDEX = "easyfit reads samples by index, to shuffle, shard and resume exactly"


def _module(data: Any) -> str:
    return type(data).__module__ or ""


def _kind(data: Any) -> tuple[str, str] | None:
    """``(what it is, what to do instead)`` for an input easyfit refuses, else None."""
    module, name = _module(data), type(data).__name__
    if module.startswith("tensorflow") or (
        hasattr(data, "element_spec") and hasattr(data, "as_numpy_iterator")
    ):
        return (
            f"a tf.data.Dataset ({name})",
            "collect it into arrays (np.stack over dataset.unbatch().as_numpy_iterator()), or "
            "write its images to an image folder or TFRecord files",
        )
    if module.startswith("torch.utils.data") or (
        hasattr(data, "dataset") and hasattr(data, "batch_size") and hasattr(data, "__iter__")
    ):
        return (
            f"a torch {name}",
            "pass the arrays or the folder its dataset reads from",
        )
    if inspect.isgenerator(data) or isinstance(data, collections.abc.Iterator):
        return (
            f"a Python {'generator' if inspect.isgenerator(data) else 'iterator'} of batches ({name})",
            "collect its batches into arrays first (np.concatenate), or write the samples to a folder",
        )
    if isinstance(data, list) and data:
        first = data[0]
        if isinstance(first, dict) or (isinstance(first, tuple) and any(hasattr(v, "shape") for v in first)):
            return (
                f"a list of batches ({type(first).__name__}s)",
                "concatenate them: x = np.concatenate([b[0] for b in batches]), y likewise",
            )
        shapes = {getattr(a, "shape", None) for a in data}
        if all(hasattr(a, "__array__") and getattr(a, "ndim", 0) >= 1 for a in data) and len(shapes) > 1:
            return (
                f"a list of {len(data)} arrays of different shapes (a list of batches?)",
                "concatenate the batches with np.concatenate; for several inputs, pass a dict "
                "or tuple of arrays",
            )
    if hasattr(data, "__getitem__") and hasattr(data, "__len__") and not hasattr(data, "__array__"):
        if not isinstance(data, (list, tuple, dict, str, bytes)):
            return (f"a dataset object ({name})", "pass its arrays, or the folder it reads from")
    return None


def refuse(data: Any, argument: str = "x") -> None:
    """Raises TypeError, saying what is supported, for the inputs easyfit cannot read: a
    generator or iterator of batches, a ``tf.data.Dataset``, a torch ``DataLoader`` or
    ``Dataset``, a list of batches, another dataset object.

    Example:
        >>> from easyfit.data.refuse import refuse
        >>> refuse((b for b in []))
        Traceback (most recent call last):
        ...
        TypeError: x: a Python generator of batches (generator) is not supported (...
    """
    kind = _kind(data)
    if kind is not None:
        what, instead = kind
        raise TypeError(f"{argument}: {what} is not supported ({_INDEX}): {instead}. {SUPPORTED}.")


def unsupported(data: Any, argument: str = "x") -> TypeError:
    """The error for an input of a type easyfit does not know."""
    return TypeError(f"{argument}: {type(data).__name__} is not supported. {SUPPORTED}.")
