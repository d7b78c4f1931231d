"""The recipe pretrained weights were trained with, as fit's default reading of a folder."""

from __future__ import annotations

import os
from typing import Any

from ..data.detect import detect
from ..data.resolve import split_layout
from ..data.sources.folder import ImageFolder


def recipe_source(model: Any, x: Any, validation_data: Any, validation_split: float) -> tuple[Any, Any]:
    """``(x, validation_data)`` for fit: a folder path given for a model that carries its
    weights' preprocessing (``model.preprocessing``, set by ``ef.models.load_weights``) becomes
    an ``ImageFolder`` read with it (input size, mean and std, evaluation crop, colour mode),
    and a ``root/train`` + ``root/val`` layout keeps its validation folder, read alike. A source
    the user built, another format, or a model without it: as given."""
    pre: Any = getattr(model, "preprocessing", None)
    if not hasattr(pre, "image_folder_kwargs") or not isinstance(x, (str, os.PathLike)):
        return x, validation_data
    layout = split_layout(x)
    train, val = layout if layout is not None else (x, None)
    if (val is not None and validation_split) or detect(train) is not ImageFolder:
        return x, validation_data  # fit_sources says what is wrong, or reads the format
    source = ImageFolder(train, **pre.image_folder_kwargs())
    return source, validation_data if validation_data is not None else val
