"""The house rules that a reader can check by walking the package: the layers of
docs/architecture.md, read from the page itself (every import points down them, type-only
imports included), and no import cycles in easyfit/ (imports inside functions count;
``if TYPE_CHECKING:`` imports do not). There is no cap on a module's length: a module is one
idea, however long."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import easyfit

PACKAGE = Path(easyfit.__file__).resolve().parent
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(name: str, path: Path, modules: dict[str, Path], type_only: bool = False) -> set[str]:
    """The easyfit modules ``name`` imports, at any depth of its code; under ``TYPE_CHECKING``
    only with ``type_only``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def add(target: str, names: list[str]) -> None:
        for n in names:  # ``from .pkg import module`` imports the module
            if f"{target}.{n}" in modules:
                found.add(f"{target}.{n}")
            elif target in modules:
                found.add(target)

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child) and not type_only:
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name in modules:
                        found.add(alias.name)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                if target.split(".")[0] == "easyfit":
                    add(target, [a.name for a in child.names])
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    found.discard(name)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := walk(node)):
            return found
    return None


def test_the_import_graph_is_found_with_function_level_imports():
    """The checker sees what it must (the first commit of issue 16 had two cycles it names:
    data.base <-> data.diagnose through a function-level import, data.loader <-> data.reader)."""
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert "easyfit.data.inputs" in graph["easyfit.training.trainer"]
    assert "easyfit.data.diagnose" in graph["easyfit.data.pipelines"]
    # checkpoint imports easyfit.data.plan only under TYPE_CHECKING
    assert "easyfit.data.plan" not in graph["easyfit.persistence.checkpoint"]
    # a cycle through an import inside a function is found
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycles_in_easyfit():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def _layers(text: str) -> list[list[str]]:
    """The layers the page lists under "## The layers", top first: each a list of parts (a
    package under easyfit/, a top-level module, or ``easyfit``, the package's ``__init__``)."""
    section = text.split("\n## The layers\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\d+\. (.+)$", section, flags=re.M)
    return [re.findall(r"`([\w.]+)`", row.split(":")[0]) for row in rows]


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_the_layers_are_read_from_the_page():
    layers = _layers(ARCHITECTURE.read_text())
    assert ["training"] in layers and ["core"] in layers, layers
    assert layers.index(["training"]) < layers.index(["core"])
    assert _layers("\n## The layers\n\n1. `a`, `b`: top\n2. `c`\n\n## Next\n3. `d`\n") == [
        ["a", "b"],
        ["c"],
    ]


def test_every_import_points_down_the_layers_of_the_architecture_page():
    """Every module belongs to a part the page lists, and imports (type-only imports too) only
    its own part's modules and those of parts on lower layers: none on its own layer or above."""
    layers = _layers(ARCHITECTURE.read_text())
    floor = {part: i for i, row in enumerate(layers) for part in row}
    modules = _modules()
    unlisted = sorted({_part(m) for m in modules} - set(floor))
    assert not unlisted, f"docs/architecture.md's layers do not list {unlisted}"
    assert not set(floor) - {_part(m) for m in modules}, "the page lists parts that do not exist"
    upward = []
    for name, path in modules.items():
        for target in _imports(name, path, modules, type_only=True):
            a, b = _part(name), _part(target)
            if a != b and floor[a] >= floor[b]:
                upward.append(f"{name} -> {target}")
    assert not upward, "imports that do not point down the layers: " + ", ".join(sorted(upward))


def test_callbacks_declare_what_they_use_of_the_trainer_and_the_resume_protocol(tmp_path):
    """Callbacks sit below the trainer: they know it by ``TrainerLike`` (mypy holds ``Trainer``
    to it where fit attaches the callbacks) and resume by ``Resumable``, both declared in
    callbacks; ``BackupAndRestore`` is resumable, a plain callback is not."""
    from easyfit.callbacks import BackupAndRestore, History, Resumable, TrainerLike
    from easyfit.training.trainer import Trainer

    assert isinstance(BackupAndRestore(str(tmp_path / "backup")), Resumable)
    assert not isinstance(History(), Resumable)
    members = {"progress", "checkpoint_meta", "metric_direction", "save"}
    assert members <= set(vars(TrainerLike)) and all(hasattr(Trainer, m) for m in members)


@pytest.mark.parametrize("name", ["state", "steps", "losses", "precision", "learning_rate"])
def test_the_old_paths_of_the_core_still_import_with_a_warning(name):
    """The core moved from ``easyfit.training`` to ``easyfit.core``: the old module paths users
    may hold give the same module, with a DeprecationWarning, for one release."""
    import importlib
    import sys

    sys.modules.pop(f"easyfit.training.{name}", None)
    with pytest.warns(DeprecationWarning, match=f"easyfit.training.{name} moved to easyfit.core.{name}"):
        old = importlib.import_module(f"easyfit.training.{name}")
    assert old is importlib.import_module(f"easyfit.core.{name}")
