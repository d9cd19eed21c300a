"""engine/runner's import graph: model_runner on top, nothing importing it back, no circle.

Read from the source (no import needed), ``TYPE_CHECKING`` and function-local imports included.
"""

from __future__ import annotations

import ast
from pathlib import Path

RUNNER = Path(__file__).resolve().parents[3] / "engine" / "runner"
PACKAGE = "engine.runner"


def runner_imports() -> dict[str, set[str]]:
    """module name -> the engine.runner modules it imports, anywhere in its source."""
    graph: dict[str, set[str]] = {}
    for path in sorted(RUNNER.glob("*.py")):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == PACKAGE:
                    deps.update(alias.name for alias in node.names)
                elif node.module.startswith(PACKAGE + "."):
                    deps.add(node.module.removeprefix(PACKAGE + "."))
            elif isinstance(node, ast.Import):
                deps.update(a.name.removeprefix(PACKAGE + ".") for a in node.names
                            if a.name.startswith(PACKAGE + "."))
        graph[path.stem] = deps
    return graph


def test_nothing_imports_the_model_runner() -> None:
    graph = runner_imports()
    assert "model_runner" in graph
    assert [name for name, deps in graph.items() if "model_runner" in deps] == []
    assert {"cuda_setup", "cuda_step", "step_inputs", "tp"} <= graph["model_runner"]


def test_no_circles() -> None:
    graph = runner_imports()
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, "import circle: " + " -> ".join((*path, name))
        if name in done:
            return
        for dep in graph.get(name, ()):
            visit(dep, (*path, name))
        done.add(name)

    for name in graph:
        visit(name, ())
