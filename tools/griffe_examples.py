"""Griffe extension for the docs site: Google-style ``Example:`` sections render as examples.

Griffe takes only ``Examples:`` for a section of doctest examples; the singular, which the
Google style guide and Napoleon accept as well, would render as a note in which every ``>>>``
line becomes a nested quote. Used by mkdocs.yml (mkdocstrings' ``extensions`` option).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^([ \t]*)Example:[ \t]*$", re.M)


class ExampleSections(griffe.Extension):
    """Renames ``Example:`` section titles to ``Examples:`` before docstrings are parsed."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
