"""The code in docs/trace-format.md runs on a recorded trace and agrees with the reader."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _trace_helpers import record, reference_like

from tracing import read_trace
from tracing.inspect import prefix_cache_hit_rate

DOC = Path(__file__).resolve().parents[2] / "docs" / "trace-format.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("docs") / "t"
    record(reference_like(), path, flush_steps=16)
    return path


def test_python_snippets_run(trace_dir: Path) -> None:
    """Every python block runs with TRACE pointing at a real trace; the hit rate it computes
    equals ``tracing.inspect.prefix_cache_hit_rate``."""
    blocks = _blocks("python")
    assert len(blocks) >= 2
    namespace: dict = {}
    for code in blocks:
        exec(code.replace('"TRACE', f'"{trace_dir}'), namespace)  # our own docs, not user input
    hits, looked_up = prefix_cache_hit_rate(read_trace(trace_dir))
    assert namespace["hit_rate"] == pytest.approx(hits / looked_up)
    trace = read_trace(trace_dir)
    assert len(namespace["ttft"]) == trace.table("request_added").num_rows
    assert (namespace["ttft"]["ttft_s"] > 0).all()
    assert namespace["preemptions"].sum() == trace.table("preempted").num_rows


def test_sql_snippets_run(trace_dir: Path) -> None:
    """Every duckdb query of the doc runs (skipped where the optional duckdb is not installed)."""
    duckdb = pytest.importorskip("duckdb")
    con = duckdb.connect()
    statements = [s for block in _blocks("sql") for s in block.split(";") if s.strip()]
    assert len(statements) >= 3
    for sql in statements:
        rows = con.execute(sql.replace("'TRACE/", f"'{trace_dir}/")).fetchall()
        assert rows


def _option_names(command: str) -> set[str]:
    """The options ``replayllm bench`` or ``python -m benchmarks.scheduler`` takes."""
    import argparse

    if command.startswith("replayllm"):
        from replay.cli.main import build_parser

        sub = next(a for a in build_parser()._actions
                   if isinstance(a, argparse._SubParsersAction))
        return {s for a in sub.choices["bench"]._actions for s in a.option_strings}
    source = (DOC.parents[1] / "benchmarks" / "scheduler.py").read_text()
    return set(re.findall(r'add_argument\("(--[\w-]+)"', source)) | {"-h", "--help"}


def test_benchmark_options_belong_to_the_command_named() -> None:
    """The doc said "`python -m benchmarks.scheduler` (`replayllm bench scheduler`) measures
    it (`--step-ms 3.6` ...)": `replayllm bench` has no `--step-ms` (only the module does).
    Every option the doc writes in a span of its own, or inside a command, is one the command
    it follows (the nearest before it in its paragraph) takes."""
    checked = 0
    for paragraph in DOC.read_text().split("\n\n"):
        command = None
        for span in re.findall(r"`([^`]+)`", paragraph):
            span = " ".join(span.split())
            if span.startswith(("replayllm bench", "python -m benchmarks.scheduler")):
                command = span
            elif not span.startswith("--"):
                continue
            if command is None:
                continue
            for option in re.findall(r"(?<![\w-])(--[\w-]+)", span):
                assert option in _option_names(command), (option, command)
                checked += 1
    assert checked >= 3
