"""Every ```python block of README.md and docs/*.md runs; the docs site builds with --strict;
every link and anchor of those pages resolves; their code lines fit the site's column.

The blocks of one file run in order in one namespace (like a notebook), in an empty temporary
folder of their own, offline: MNIST's download mirror is an unreachable local address and the
cache an empty folder, so a block that needs the network fails (blocks use the packaged
sample), and compiled quickly (``tests.helpers.QUICK_COMPILE``). The files that ask for the
same number of virtual CPU devices share one interpreter, one after the other, each in a fresh
namespace and environment (starting an interpreter, importing JAX and DALI, is a large part of
a small page's time); :data:`OWN_INTERPRETER` names those that show what happens before JAX starts. A file can
ask for virtual CPU devices with an HTML comment, invisible on the site:
``<!-- docs-test: devices=4 -->``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from functools import cache
from html import unescape
from pathlib import Path

import markdown
import pytest
import yaml

from tests.helpers import QUICK_COMPILE, ROOT

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
OFFLINE = "http://127.0.0.1:9/"  # the discard port: refused at once, as with no network
_BLOCK = re.compile(r"^([ \t]*)```python[^\n]*\n(.*?)^\1```[ \t]*$", re.M | re.S)
_DEVICES = re.compile(r"<!--\s*docs-test:\s*devices=(\d+)\s*-->")

#: Pages whose blocks show what easyfit does before JAX starts its backend (the XLA flags it
#: sets at import or in a Trainer): each runs in an interpreter of its own.
OWN_INTERPRETER = {"performance.md", "troubleshooting.md"}

# Runs each page's blocks, with their line numbers in the Markdown file (so tracebacks point
# there), in the page's own folder, namespace and environment; goes on with the next page after a
# failure; prints the failures as JSON on its last line.
_RUNNER = """
import gc, json, os, sys, traceback
pages = json.load(sys.stdin)
environ = dict(os.environ)
failed = {}
for page, folder, found in pages:
    os.makedirs(folder)
    os.chdir(folder)
    os.environ.clear()
    os.environ.update(environ, XDG_CACHE_HOME=os.path.join(folder, "cache"))
    namespace = {"__name__": "__main__"}
    print(f"=== {page}", flush=True)
    try:
        for line, code in found:
            print(f"--- {page}:{line}", flush=True)
            exec(compile("\\n" * line + code, page, "exec"), namespace)
    except BaseException:
        failed[page] = traceback.format_exc()
    del namespace
    gc.collect()
print(json.dumps(failed))
"""


def blocks(text: str) -> list[tuple[int, str]]:
    """``(line of the block's first code line - 1, dedented code)`` for every python block."""
    return [(text.count("\n", 0, m.start(2)), textwrap.dedent(m.group(2))) for m in _BLOCK.finditer(text)]


def test_blocks_are_found_with_their_lines():
    text = "intro\n```python\nx = 1\n```\n\n!!! note\n    ```python\n    y = x\n    ```\n"
    assert blocks(text) == [(2, "x = 1\n"), (7, "y = x\n")]


def _devices(text: str) -> int:
    return int(m.group(1)) if (m := _DEVICES.search(text)) else 1


#: Interpreters the pages of one device count share: several, so that no one test of the suite
#: runs for minutes. The pages are dealt out by the length of their code (a rough measure of
#: their time), the longest first, each to the interpreter with the least code so far.
SHARED_INTERPRETERS = 2


def _code_length(page: Path) -> int:
    return sum(len(code) for _, code in blocks(page.read_text()))


def _interpreters() -> dict[str, list[Path]]:
    """The pages with python blocks, by the interpreter they run in: :data:`SHARED_INTERPRETERS`
    per device count, and one for each page of :data:`OWN_INTERPRETER`."""
    groups: dict[str, list[Path]] = {}
    shared: dict[int, list[list[Path]]] = {}
    for page in sorted(PAGES, key=_code_length, reverse=True):
        if not blocks(page.read_text()):
            continue
        if page.name in OWN_INTERPRETER:
            groups[page.name] = [page]
            continue
        lists = shared.setdefault(_devices(page.read_text()), [[] for _ in range(SHARED_INTERPRETERS)])
        min(lists, key=lambda group: sum(map(_code_length, group))).append(page)
    for devices, lists in sorted(shared.items()):
        for i, group in enumerate(g for g in lists if g):
            groups[f"{devices}-device-pages-{i + 1}"] = sorted(group)
    return groups


def test_pages_of_their_own_interpreter_exist():
    assert OWN_INTERPRETER <= {p.name for p in PAGES if blocks(p.read_text())}


def run_pages(pages: list[Path], tmp_path: Path) -> tuple[dict[str, str], str]:
    """Runs the blocks of ``pages`` in one fresh interpreter (see the module's docstring):
    ``({page: traceback} of the pages that failed, everything printed)``."""
    devices = {_devices(p.read_text()) for p in pages}
    assert len(devices) == 1, f"pages of different device counts in one interpreter: {pages}"
    env = {k: v for k, v in os.environ.items() if k != "EASYFIT_MNIST_DIR"}
    env = {
        **env,
        "EASYFIT_MNIST_MIRROR": OFFLINE,
        "PYTHONUNBUFFERED": "1",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices.pop()} {QUICK_COMPILE}",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    found = [[str(p.relative_to(ROOT)), str(tmp_path / p.stem), blocks(p.read_text())] for p in pages]
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER],
        input=json.dumps(found),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), output


def test_a_failing_page_is_named_and_the_next_one_runs_in_its_own_namespace(tmp_path):
    """Two pages in one interpreter: the first fails, the second runs, sees none of the first's
    names, environment changes or folder."""
    first, second = tmp_path / "first.md", tmp_path / "second.md"
    first.write_text(
        "```python\nimport os\nos.environ['DOCS_TEST_LEAK'] = '1'\nopen('here', 'w').close()"
        "\nleaked = 1\n```\n\n```python\nraise ValueError('broken page')\n```\n"
    )
    second.write_text(
        "```python\nimport os\nassert 'leaked' not in globals() and 'DOCS_TEST_LEAK' not in os.environ"
        "\nassert not os.path.exists('here')\nprint('second ran')\n```\n"
    )
    # the runner takes paths relative to ROOT for the tracebacks: give it these as they are
    pages = [
        [str(first), str(tmp_path / "run" / "first"), blocks(first.read_text())],
        [str(second), str(tmp_path / "run" / "second"), blocks(second.read_text())],
    ]
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER], input=json.dumps(pages), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    failed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert list(failed) == [str(first)]
    assert "ValueError: broken page" in failed[str(first)] and f'"{first}", line 9' in failed[str(first)]
    assert "second ran" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("pages", list(_interpreters().values()), ids=list(_interpreters()))
def test_code_blocks_run(pages, tmp_path):
    failed, output = run_pages(pages, tmp_path)
    assert not failed, "\n\n".join(
        f"{page}:\n{_printed(output, page)[-3000:]}\n{trace}" for page, trace in failed.items()
    )


def _printed(output: str, page: str) -> str:
    """What the runner printed while it ran ``page``'s blocks."""
    start = output.find(f"=== {page}\n")
    end = output.find("\n=== ", start + 1)
    return output[start : end if end >= 0 else None]


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    """``mkdocs build --strict``, as a user runs it (only the site goes to a temporary folder),
    with every warning shown: any warning fails the build and the test."""
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)  # no colours
    warnings = [line for line in output.splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)]
    assert proc.returncode == 0 and not warnings, "\n".join(warnings) or output[-4000:]
    configs = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "site").rglob("*.toml"))
    assert not configs, f"the site publishes {configs}"
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "Trains a Flax model on data read by DALI" in api  # the docstrings made it in
    assert not re.findall(r":(?:meth|func|class|attr|mod|exc):", api)  # roles rendered as code
    ids = set(re.findall(r'id="(easyfit\.[\w.]+)"', api))
    assert {"easyfit.Trainer.fit", "easyfit.Trainer.evaluate", "easyfit.data.Source.num_samples"} <= ids
    missing = [n for n in _api_entries() if n not in ids and f"{n}.{n.rsplit('.', 1)[1]}" not in ids]
    assert not missing, f"public names the page does not render: {missing}"
    internal = {
        "easyfit.Trainer.checkpoint_meta",
        "easyfit.data.Source.feed",
        "easyfit.data.Source.graph",
        "easyfit.data.Plan.chunk",
        "easyfit.callbacks.Callback.set_params",
        *(f"easyfit.data.DataInputs.{m}" for m in ("fit_data", "adopt", "plan", "train_loader", "lease")),
        *(f"easyfit.data.Stream.{m}" for m in ("peek", "chunk_spec", "position")),
        *(
            f"easyfit.data.IndexedSource.{m}"
            for m in ("feed", "graph", "encoded_image", "prepare", "sample_problem")
        ),
    }
    assert not ids & internal
    # what a reader copies runs, and what it reads names public paths and links to pages
    text = unescape(re.sub(r"<[^>]+>", " ", api))
    for fixture in ("DOCS_TMP", "MNIST_IDX", "MNIST_FORMATS"):
        assert fixture not in text, f"the API page shows the test fixture {fixture}"
    internal_paths = re.findall(r"easyfit\.(?:training|persistence|parallel|data\.sources)\b[\w.]*", text)
    assert not internal_paths, internal_paths
    plain = re.findall(r"docs/[\w-]+\.md", text)
    assert not plain, f"cross-references as plain text instead of links: {plain}"


def test_site_publishes_pages_and_their_assets_only():
    """Of docs/, mkdocs publishes the pages and the site's stylesheets, scripts and images, and not
    docs/ruff.toml (the line length of the docs' code blocks, for ``ruff format``). Read from
    mkdocs' own list of the files a build copies, without building."""
    from mkdocs.config import load_config
    from mkdocs.structure.files import get_files

    files = get_files(load_config(str(ROOT / "mkdocs.yml")))
    assert "ruff.toml" in {f.src_uri for f in files}  # the list holds the file, excluded
    published = {f.src_uri for f in files if not f.inclusion.is_excluded()}
    others = sorted(p for p in published if not p.endswith((".md", ".css", ".js", ".png")))
    assert not others, f"mkdocs.yml's exclude_docs should leave out {others}"


def _nav_pages(items: list) -> list[str]:
    """The page files of a part of mkdocs.yml's ``nav``, its sections' pages included."""
    pages = []
    for item in items:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_contributor_pages_have_their_own_section():
    """The pages for those who change easyfit (CONTRIBUTOR_PAGES) are the site's "Contributing"
    section, and in no section of the user's guide."""
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    sections = {title: value for item in nav for title, value in item.items() if isinstance(value, list)}
    assert set(_nav_pages(sections["Contributing"])) == CONTRIBUTOR_PAGES
    elsewhere = [
        f"{title}: {page}"
        for title, value in sections.items()
        if title != "Contributing"
        for page in _nav_pages(value)
        if page in CONTRIBUTOR_PAGES
    ]
    assert not elsewhere, elsewhere


def _public_names() -> set[str]:
    """``easyfit.X`` for every class and function of ``easyfit.__all__``, and
    ``easyfit.module.X`` for every name of each public module's ``__all__`` (a name that
    ``easyfit`` re-exports from one of them counts under that module)."""
    import inspect

    import easyfit

    names, exported = set(), {}
    for name in easyfit.__all__:
        value = getattr(easyfit, name)
        if inspect.ismodule(value):
            for member in value.__all__:
                names.add(f"easyfit.{name}.{member}")
                exported.setdefault(id(getattr(value, member)), f"easyfit.{name}.{member}")
    for name in easyfit.__all__:
        value = getattr(easyfit, name)
        if not inspect.ismodule(value) and not name.startswith("__") and id(value) not in exported:
            names.add(f"easyfit.{name}")
    return names


def _api_entries() -> list[str]:
    """The names of the API page's ``::: name`` entries, in order."""
    return re.findall(r"^::: (\S+)", (ROOT / "docs" / "api.md").read_text(), re.M)


def test_api_page_has_every_public_name_and_nothing_else():
    """docs/api.md has one entry per public name (``__all__``, at its public import path), so a
    name added to an ``__all__`` fails here until the page shows it, and nothing internal."""
    entries = _api_entries()
    assert len(entries) == len(set(entries)), "an entry twice"
    public = _public_names()
    assert "easyfit.Trainer" in public and "easyfit.callbacks.CSVLogger" in public
    assert not public - set(entries), (
        f"public names missing from docs/api.md: {sorted(public - set(entries))}"
    )
    assert not set(entries) - public, f"entries that are not public names: {sorted(set(entries) - public)}"


def test_every_docstring_of_easyfit_parses_without_a_warning():
    """griffe reads every docstring as Google style, rendered on the API page or not: one name
    per ``Args:`` entry, each ``name: description``. In a fresh interpreter: CPython 3.11's AST
    compiler can fail with "recursion depth mismatch" in a process where an earlier test caught
    a RecursionError, which says nothing of the docstrings."""
    code = textwrap.dedent(
        """
        import json, logging, sys
        import griffe

        warned = []
        handler = logging.Handler()
        handler.emit = lambda record: warned.append(record.getMessage())
        logging.getLogger("griffe").addHandler(handler)
        package = griffe.load("easyfit", search_paths=[sys.argv[1]], docstring_parser="google")

        def parse(obj):
            if obj.is_alias:
                return
            if obj.docstring:
                obj.docstring.parsed  # parsing is what warns
            for member in obj.members.values():
                parse(member)

        parse(package)
        print(json.dumps(warned))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    warned = json.loads(done.stdout.strip().splitlines()[-1])
    assert not warned, warned


@cache
def _rendered(page: Path) -> str:
    """``page`` as HTML, by Python-Markdown with mkdocs.yml's extensions (the site's ids)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    names, options = [], {}
    for ext in config["markdown_extensions"]:
        name, opts = next(iter(ext.items())) if isinstance(ext, dict) else (ext, None)
        names.append(name)
        options[name] = opts or {}
    return markdown.Markdown(extensions=names, extension_configs=options).convert(page.read_text())


def _anchors(page: Path) -> set[str]:
    """The ids of ``page``'s headings (the toc extension's default slugify) and ``{#id}``s."""
    return set(re.findall(r'\sid="([^"]+)"', _rendered(page)))


def _resolves(target: Path, anchor: str) -> bool:
    """Whether ``target`` has the id ``anchor``: a heading's, or on the API page one of the
    objects mkdocstrings renders (a ``::: name`` line, its members included)."""
    documented = re.findall(r"^::: (\S+)", target.read_text(), re.M)
    return anchor in _anchors(target) or any(anchor == n or anchor.startswith(n + ".") for n in documented)


def _links(page: Path) -> list[str]:
    html = _rendered(page)
    return [unescape(h) for h in re.findall(r'<(?:a|img)\b[^>]*?\s(?:href|src)="([^"]*)"', html)]


def _broken(page: Path) -> list[str]:
    """The relative links of ``page`` that name no file, or no heading of that file (or, with
    ``#anchor`` alone, of ``page``)."""
    broken = []
    for link in _links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", link):  # https:, mailto: ...
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link}: no such file {target}")
        elif anchor and target.suffix == ".md" and not _resolves(target, anchor):
            broken.append(f"{link}: {target.name} has no heading #{anchor}")
    return broken


def test_anchors_and_links_are_read_as_mkdocs_makes_them(tmp_path):
    (tmp_path / "a.md").write_text("# Two GPUs (one run), 2026-11-2\n\n## `fit(cache=True)`?\n## X {#mine}\n")
    assert _anchors(tmp_path / "a.md") == {"two-gpus-one-run-2026-11-2", "fitcachetrue", "mine"}
    (tmp_path / "b.md").write_text(
        "[ok](a.md#fitcachetrue), [gone](a.md#two-gpus), [none](c.md), [self](#b), [web](https://x.org)\n"
        "\n```python\n# [in code](nowhere.md#not-a-link)\n```\n\n## B\n"
    )
    assert _broken(tmp_path / "b.md") == [
        "a.md#two-gpus: a.md has no heading #two-gpus",
        f"c.md: no such file {tmp_path / 'c.md'}",
    ]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_and_anchor_resolves(page):
    """Every relative link of a page names a file that exists and, with ``#anchor``, one of
    that file's headings."""
    assert not _broken(page), f"{page.name}: " + "; ".join(_broken(page))


def test_anchors_named_in_easyfit_messages_resolve():
    """Messages that send the user to a section (``docs/performance.md#am-i-input-bound``, or
    ``docs_url("performance.md#am-i-input-bound")``: its address on the docs site)."""
    named = {
        (m.group(1), m.group(2))
        for file in (ROOT / "easyfit").rglob("*.py")
        for m in re.finditer(r'(?:docs/|docs_url\(")([\w-]+\.md)#([\w-]+)', file.read_text())
    }
    assert named  # the pattern still finds them
    missing = [f"{p}#{a}" for p, a in sorted(named) if not _resolves(ROOT / "docs" / p, a)]
    assert not missing, missing


#: Code lines longer than this do not fit the site's content column (Material's code font at
#: the column's width between the two sidebars) and are cut off behind a scroll bar.
CODE_COLUMNS = 88
_FENCE = re.compile(r"^([ \t]*)(`{3,}|~{3,})([^\n]*)\n(.*?)^\1\2[ \t]*$", re.M | re.S)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_code_lines_fit_the_column(page):
    """Every line of a fenced code block is at most CODE_COLUMNS characters, except in
    ``text`` blocks: a program's output, quoted as it is printed."""
    text = page.read_text()
    long = []
    for m in _FENCE.finditer(text):
        if m.group(3).strip().startswith("text"):
            continue
        first = text.count("\n", 0, m.start(4)) + 1
        for i, line in enumerate(textwrap.dedent(m.group(4)).splitlines()):
            if len(line) > CODE_COLUMNS:
                long.append(f"{page.name}:{first + i} ({len(line)} characters)")
    assert not long, long


#: Words from the project's own work that mean nothing to a reader of the docs.
_INTERNAL = re.compile(
    r"nvidia-h200|\bissue \d+|\bissues? #?\d+|\b20\d\d-\d\d-\d\d\b|\bsession\b|\btranche\b"
    r"|REFERENCE\.md|reference program",
    re.I,
)


#: On the pages written for users (every page but the contributors'), also what belongs in a lab
#: notebook: commit hashes (words of 7-12 hex digits with a letter) and leased machines.
_NOTEBOOK = re.compile(r"\b(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}\b|\bleas(?:e|es|ed|ing)\b", re.I)
#: Pages for contributors: they may name commits.
CONTRIBUTOR_PAGES = {"architecture.md"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_pages_name_no_machine_kinds_issues_or_dates(page):
    patterns = [_INTERNAL] if page.name in CONTRIBUTOR_PAGES else [_INTERNAL, _NOTEBOOK]
    found = [
        f"{page.name}:{n}: {m.group(0)}"
        for n, line in enumerate(page.read_text().splitlines(), 1)
        for pattern in patterns
        for m in pattern.finditer(line)
    ]
    assert not found, found


def test_notebook_words_are_found():
    found = [m.group(0) for m in _NOTEBOOK.finditer("at 9d90715, 1234567, Two leases, release, facade")]
    assert found == ["9d90715", "leases"]
