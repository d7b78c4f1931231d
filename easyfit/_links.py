"""Where easyfit is found: its distribution's name on the package index, and its documentation.

The import name is ``easyfit``; the distribution is ``easyfit-flax``, since ``easyfit`` on the
package index is another project (``pip install easyfit`` installs that one). Whatever reads
easyfit's installed metadata, or tells a user what to ``pip install``, takes the name from here.
"""

from __future__ import annotations

__all__ = ["DISTRIBUTION", "DOCS_URL", "docs_url"]

#: easyfit's name on the package index (``[project] name`` in pyproject.toml).
DISTRIBUTION = "easyfit-flax"
#: The documentation site (``site_url`` in mkdocs.yml, ``Documentation`` in pyproject.toml).
DOCS_URL = "https://easyfit-flax.readthedocs.io/en/latest/"


def docs_url(page: str) -> str:
    """The address of a docs page (``"performance.md#am-i-input-bound"``) on the site, which a
    user who installed easyfit with pip can open (the repository's ``docs/`` is not installed).

    Example:
        >>> from easyfit._links import docs_url
        >>> docs_url("performance.md#am-i-input-bound")
        'https://easyfit-flax.readthedocs.io/en/latest/performance/#am-i-input-bound'
    """
    name, _, anchor = page.partition("#")
    path = name.removesuffix(".md")
    path = "" if path == "index" else path + "/"
    return DOCS_URL + path + (f"#{anchor}" if anchor else "")
