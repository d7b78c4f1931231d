"""Griffe extension for the docs site: docstrings render as Markdown.

- Google-style ``Example:`` sections render as examples. Griffe takes only ``Examples:`` for a
  section of doctest examples; the singular, which the Google style guide and Napoleon accept
  as well, would render as a note in which every ``>>>`` line becomes a nested quote.
- Sphinx roles (``:meth:`save```, ``:func:`~easyfit.data.detect.detect```), which Markdown
  shows raw, render as inline code: the name as written, or its last part after ``~``.

Used by mkdocs.yml (mkdocstrings' ``extensions`` option).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^([ \t]*)Example:[ \t]*$", re.M)
_ROLE = re.compile(
    r":(?:py:)?(?:meth|func|class|attr|mod|data|exc|obj):`(~?)([^`<]*?)"
    r"(?:\s*<([^>]+)>)?`"
)


def _code(match: re.Match) -> str:
    tilde, text, target = match.groups()
    if not target and tilde:
        text = text.split(".")[-1]
    return f"`{text.strip()}`"


def markdown(docstring: str) -> str:
    """``docstring`` with ``Example:`` titles as ``Examples:`` and Sphinx roles as code.

    Example:
        >>> markdown("Written by :meth:`save`, read by :func:`~easyfit.checkpoint.load`.")
        'Written by `save`, read by `load`.'
    """
    return _ROLE.sub(_code, _EXAMPLE.sub(r"\1Examples:", docstring))


class ExampleSections(griffe.Extension):
    """Rewrites docstrings (see ``markdown``) before they are parsed."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
