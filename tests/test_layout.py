"""The layout is a fact, not a convention: these tests fail when an import breaks it.

- No import cycle among our modules (every import counts: module-level, function-local and
  ``TYPE_CHECKING`` ones, since each says one module needs the other).
- ``tracing`` imports nothing of ours; the engine core (``engine/*.py``) imports neither
  ``engine.model`` nor ``engine.runner`` (only ``engine.llm``, the top of the engine, starts a
  model runner).
- With ``torch`` made unimportable, the engine core, ``replay.verify`` and the what-if simulator
  import, and ``verify`` and ``whatif`` run on a committed trace.
- No module of ``engine``, ``tracing`` or ``replay`` is over 400 lines.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "tracing", "replay")
MAX_LINES = 400
# The engine's top: the user-facing LLM loads the model runner (lazily, on construction).
ENGINE_TOP = {"engine", "engine.llm"}


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _import_graph() -> dict[str, set[str]]:
    """Module -> our modules it imports (the longest module name each import names)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
                    break
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_among_our_modules() -> None:
    cycle = _find_cycle(_import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_tracing_imports_nothing_of_ours() -> None:
    upward = {(a, b) for a, targets in _import_graph().items() if a.startswith("tracing")
              for b in targets if not b.startswith("tracing")}
    assert not upward, f"tracing imports engine/replay: {sorted(upward)}"


def test_engine_core_imports_no_model_or_runner() -> None:
    graph = _import_graph()
    core = [m for m in graph if m.count(".") <= 1 and m.startswith("engine")
            and m not in ENGINE_TOP and not m.startswith(("engine.model", "engine.runner",
                                                          "engine.server"))]
    bad = {(m, t) for m in core for t in graph[m]
           if t.startswith(("engine.model", "engine.runner", "engine.server", "replay"))}
    assert core and not bad, f"engine core imports the model stack or replay: {sorted(bad)}"


_NO_TORCH = """
import importlib.abc, sys

class NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'triton', 'transformers', 'safetensors'):
            raise ImportError(f'{name} is blocked by the layout test')
        return None

sys.meta_path.insert(0, NoTorch())
"""


def _run_without_torch(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _NO_TORCH + code], cwd=REPO, text=True,
                          capture_output=True, timeout=300, check=False)


def test_core_verify_and_whatif_import_and_run_without_torch() -> None:
    trace = REPO / "traces" / "cpu-tiny-demo"
    result = _run_without_torch(f"""
import engine, engine.config, engine.scheduler, engine.block_manager, engine.engine_core
import engine.drive, engine.calibration, engine.graph_sizes, engine.llm
import replay, replay.verify, replay.whatif.simulate, replay.cli.main
from replay import simulate, verify
assert verify({str(trace)!r}).identical
assert simulate({str(trace)!r}, {{"num_kvcache_blocks": 20}}).ok
assert replay.cli.main.main(["verify", {str(trace)!r}]) == 0
assert not [m for m in sys.modules if m.split('.')[0] == 'torch']
print("ok")
""")
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr


def test_no_module_over_400_lines() -> None:
    long = {str(path.relative_to(REPO)): n for path in _modules().values()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split by ownership): {long}"
