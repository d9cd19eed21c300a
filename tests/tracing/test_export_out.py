"""``replayllm export --out``: ``-`` is standard output (the perfetto JSON; the binary KV format
refuses it), an empty path is refused; each refusal one line, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _trace_helpers import record, reference_like

from replay.cli.main import main


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("out") / "t"
    record(reference_like(6), path)
    return path


def _entries(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def test_dash_writes_the_json_to_stdout(trace_dir: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """`--out -` wrote a file named `-` in the working directory (and said so)."""
    monkeypatch.chdir(tmp_path)
    before = _entries(trace_dir)
    assert main(["export", str(trace_dir), "--out", "-"]) == 0
    out = capsys.readouterr().out
    document = json.loads(out)  # the JSON alone: no "wrote ..." line after it
    assert document["traceEvents"] and document["otherData"]["complete"] is True
    assert _entries(tmp_path) == [] and _entries(trace_dir) == before
    assert main(["export", str(trace_dir), "--out", str(tmp_path / "x.json")]) == 0
    capsys.readouterr()
    assert json.loads((tmp_path / "x.json").read_text()) == document


@pytest.mark.parametrize("argv,message", [
    (["--out", ""], "--out is empty: give the export's file name (or - for standard output, "
                    "perfetto only)"),
    (["--format", "vllm-kv-events", "--out", ""], "--out is empty"),
    (["--format", "vllm-kv-events", "--out", "-"],
     "--out - (standard output) takes the JSON format (perfetto); vllm-kv-events is binary "
     "msgpack: give a file name"),
])
def test_an_empty_path_or_dash_for_msgpack_is_refused(
        trace_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    """`--out ""` silently wrote TRACE/trace.json (the default); `-` with the KV format wrote
    msgpack to a file named `-`. Both are one line, exit 2, and nothing is written."""
    monkeypatch.chdir(tmp_path)
    before = _entries(trace_dir)
    assert main(["export", str(trace_dir), *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"replayllm export: error: {message}")
    assert captured.err.count("\n") == 1
    assert _entries(tmp_path) == [] and _entries(trace_dir) == before
