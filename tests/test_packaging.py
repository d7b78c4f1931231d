"""What a release carries: a name of its own on the package index, one version, its licences,
the typing marker, a changelog entry; and the install the README and CI describe."""

from __future__ import annotations

from importlib import metadata

import pytest

import easyfit
from easyfit._links import DISTRIBUTION, DOCS_URL
from easyfit.cli import main
from tests.helpers import ROOT

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_is_written_once_and_everything_reports_it(pyproject, capsys):
    project = pyproject["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "easyfit.__version__"}
    assert metadata.version(DISTRIBUTION) == easyfit.__version__, (
        "the installed metadata is stale: reinstall with pip install -e '.[dev]'"
    )
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"easyfit {easyfit.__version__}\n"


def test_the_distribution_is_easyfit_flax_and_imports_as_easyfit(pyproject):
    # "easyfit" on the package index is another project (pip install easyfit installs it)
    assert pyproject["project"]["name"] == DISTRIBUTION == "easyfit-flax"
    assert pyproject["tool"]["setuptools"]["packages"]["find"]["include"] == ["easyfit*"]
    assert pyproject["project"]["scripts"] == {"easyfit": "easyfit.cli:main"}
    assert pyproject["project"]["urls"]["Documentation"] == DOCS_URL
    assert f"\nsite_url: {DOCS_URL} " in (ROOT / "mkdocs.yml").read_text()
    assert (metadata.distribution(DISTRIBUTION).read_text("top_level.txt") or "").split() == ["easyfit"]


def test_ci_runs_what_the_readme_says():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    section = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    assert "python3 -m venv .venv && . .venv/bin/activate" in section
    assert '```bash\npip install -e ".[dev]" && python -m pytest -n 2\neasyfit demo\n```' in section
    assert "python3 -m venv .venv\n. .venv/bin/activate\n" in ci
    assert 'python -m pip install -q -e ".[dev]"\n' in ci and ci.rstrip().endswith("python -m pytest -n 2")


def test_the_changelog_has_the_current_version_and_an_unreleased_section():
    headings = [line for line in (ROOT / "CHANGELOG.md").read_text().splitlines() if line.startswith("## ")]
    assert headings[0] == "## [Unreleased]"
    assert any(h.startswith(f"## [{easyfit.__version__}] - ") for h in headings), headings


def test_the_licences_are_shipped(pyproject):
    project = pyproject["project"]
    assert project["license"] == "Apache-2.0"
    assert (
        "Apache License\n                           Version 2.0, January 2004"
        in (ROOT / "LICENSE").read_text()
    )
    for name in project["license-files"]:
        assert (ROOT / name).is_file(), name
    assert "easyfit/_sample/LICENSE-MNIST.txt" in project["license-files"]


def test_the_package_says_it_is_typed(pyproject):
    assert (ROOT / "easyfit" / "py.typed").is_file()
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["easyfit"]
