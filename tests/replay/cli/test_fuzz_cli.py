"""Fuzzing the CLI: broken workloads and corrupted traces never give a traceback or lose data.

Hypothesis generates workloads with bad fields and traces corrupted in every way the issue lists
(truncation at a random offset, flipped bytes, random JSON in run.json and in commit markers,
deleted and duplicated segments, planted symlinks), then runs ``run``, ``verify``, ``inspect``,
``export`` and ``whatif`` on them in-process. Every run must end with exit 0, 1 or 2 and at most
one line on stderr, never an exception, and no file outside the command's own output may change
(the trace, the workload, and a bystander file symlinks point at). Example counts come from the
Hypothesis profile (tests/conftest.py): quick under ``ci``, thorough with
``HYPOTHESIS_PROFILE=deep``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

from _cli import message_lines, owned_trace, run_cli, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

OUT = "out"
BYSTANDER = "bystander"


def _scaled(factor: float) -> int:
    return max(5, int(settings.default.max_examples * factor))


def _trace_files(trace: Path) -> list[Path]:
    return sorted(p for p in trace.rglob("*") if p.is_file() and not p.is_symlink())


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=12,
)
header_keys = st.sampled_from(["schema_version", "config", "num_blocks", "block_size",
                               "calibration", "executor", "model", "engine_starts_before"])
marker_keys = st.sampled_from(["segment", "through_step", "first_event_id", "last_event_id",
                               "num_events", "files"])

corruptions = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 10**6), st.floats(0, 1)),
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.floats(0, 1), st.integers(1, 255)),
    st.tuples(st.just("header_value"), header_keys, json_values),
    st.tuples(st.just("header_replace"), json_values),
    st.tuples(st.just("marker_value"), st.integers(0, 1), marker_keys, json_values),
    st.tuples(st.just("marker_replace"), st.integers(0, 1), json_values),
    st.tuples(st.just("delete"), st.integers(0, 10**6)),
    st.tuples(st.just("delete_marker"), st.integers(0, 1)),
    st.tuples(st.just("duplicate_segment"), st.integers(0, 1)),
    st.tuples(st.just("symlink_file"), st.integers(0, 10**6)),
    st.tuples(st.just("symlink_dir"), st.sampled_from(["model_step", "_commits",
                                                       "request_added"])),
    st.tuples(st.just("drop_summary")),
)


def _corrupt(root: Path, trace: Path, action: tuple) -> None:
    """Apply one corruption to ``trace``; ``root / BYSTANDER`` is what symlinks point at."""
    kind = action[0]
    files = _trace_files(trace)
    if kind == "truncate":
        path = files[action[1] % len(files)]
        size = path.stat().st_size
        os.truncate(path, int(size * action[2]))
    elif kind == "flip":
        path = files[action[1] % len(files)]
        data = bytearray(path.read_bytes())
        if data:
            at = min(int(len(data) * action[2]), len(data) - 1)
            data[at] ^= action[3]
            path.write_bytes(bytes(data))
    elif kind in ("header_value", "header_replace"):
        path = trace / "run.json"
        if kind == "header_replace":
            path.write_text(json.dumps(action[1]))
            return
        try:
            header = json.loads(path.read_text())
        except (ValueError, OSError):  # unreadable, or deleted by an earlier action
            return
        if isinstance(header, dict):
            header[action[1]] = action[2]
            path.write_text(json.dumps(header))
    elif kind in ("marker_value", "marker_replace"):
        path = trace / "_commits" / f"seg-{action[1]:06d}.json"
        if not path.is_file():
            return
        if kind == "marker_replace":
            path.write_text(json.dumps(action[2]))
            return
        try:
            marker = json.loads(path.read_text())
        except ValueError:
            return
        if isinstance(marker, dict):
            marker[action[2]] = action[3]
            path.write_text(json.dumps(marker))
    elif kind == "delete":
        files[action[1] % len(files)].unlink()
    elif kind == "delete_marker":
        (trace / "_commits" / f"seg-{action[1]:06d}.json").unlink(missing_ok=True)
    elif kind == "duplicate_segment":
        source = trace / "_commits" / f"seg-{action[1]:06d}.json"
        taken = [int(p.stem[4:]) for p in (trace / "_commits").glob("seg-*.json")
                 if p.stem[4:].isdigit()]
        if source.is_file():
            shutil.copy(source, trace / "_commits" / f"seg-{max(taken) + 1:06d}.json")
    elif kind == "symlink_file":
        path = files[action[1] % len(files)]
        path.unlink()
        path.symlink_to(root / BYSTANDER / "file")
    elif kind == "symlink_dir":
        target = trace / action[1]
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
            target.symlink_to(root / BYSTANDER)
    elif kind == "drop_summary":
        (trace / "summary.json").unlink(missing_ok=True)


def _check(root: Path, argv: list[str]) -> None:
    before = snapshot(root, skip=(OUT,))
    code, _, err = run_cli(argv)
    assert code in (0, 1, 2), (argv, code, err)
    assert "Traceback" not in err, err
    lines = message_lines(err)
    assert len(lines) <= 1, lines
    if code == 2:
        assert lines and lines[0].startswith("replayllm "), lines
    assert snapshot(root, skip=(OUT,)) == before, argv


def _setup(root: Path) -> Path:
    (root / BYSTANDER).mkdir()
    (root / BYSTANDER / "file").write_text("not part of any trace")
    return owned_trace(root / "t")


def _commands(root: Path, trace: Path, command: str) -> list[str]:
    out = root / OUT
    return {
        "verify": ["verify", str(trace)],
        "inspect": ["inspect", str(trace)],
        "export": ["export", str(trace), "--out", str(out)],
        "whatif": ["whatif", str(trace), "--no-plots", "--jobs", "1", "--out", str(out)],
    }[command]


@settings(max_examples=_scaled(0.6))
@given(
    actions=st.lists(corruptions, min_size=1, max_size=3),
    command=st.sampled_from(["verify", "inspect", "export", "whatif"]),
)
def test_corrupted_traces(actions: list[tuple], command: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        trace = _setup(root)
        for action in actions:
            _corrupt(root, trace, action)
        _check(root, _commands(root, trace, command))


bad_numbers = st.one_of(
    st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4), st.booleans(), st.none(), st.lists(st.integers(), max_size=2),
)
token_lists = st.lists(st.one_of(st.integers(-(2**40), 2**40), st.floats(), st.text(max_size=3),
                                 st.booleans(), st.none()), max_size=5)
good_row = st.fixed_dictionaries(
    {"prompt_token_ids": st.lists(st.integers(0, 1000), min_size=1, max_size=4),
     "max_tokens": st.integers(1, 4)},
    optional={"arrival_s": st.floats(0, 0.01), "temperature": st.just(0.0)},
)
bad_row = st.one_of(
    good_row.flatmap(lambda row: st.sampled_from(sorted(row)).flatmap(
        lambda key: bad_numbers.map(lambda value: {**row, key: value}))),
    good_row.flatmap(lambda row: token_lists.map(lambda t: {**row, "prompt_token_ids": t})),
    good_row.map(lambda row: {k: v for k, v in row.items() if k != "max_tokens"}),
    json_values,
)
# A row certain to be refused, so no example loads a model: the case under test is the parsing.
REFUSED = {"prompt_token_ids": [1], "max_tokens": -1}


def _encode(row: object) -> bytes:
    text = json.dumps(row)
    return text.encode() if not isinstance(row, float) or math.isfinite(row) else b"NaN"


@settings(max_examples=_scaled(0.6))
@given(
    rows=st.lists(st.one_of(bad_row, good_row), max_size=4),
    raw=st.one_of(st.just(b""), st.binary(max_size=8), st.just(b"\xff\xfe\n"), st.just(b"[]\n")),
    at=st.integers(0, 4),
    command=st.sampled_from(["run", "whatif"]),
)
def test_workloads_with_bad_fields(rows: list[object], raw: bytes, at: int, command: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        lines = [_encode(r) for r in rows]
        lines.insert(min(at, len(lines)), json.dumps(REFUSED).encode())
        workload = root / "w.jsonl"
        workload.write_bytes(b"\n".join(lines) + b"\n" + raw)
        argv = {
            "run": ["run", "--workload", str(workload), "--out", str(root / OUT)],
            "whatif": ["whatif", "--workload", str(workload), "--no-plots", "--jobs", "1",
                       "--set", "num_kvcache_blocks=64", "--out", str(root / OUT)],
        }[command]
        _check(root, argv)
        assert not (root / OUT).exists()  # refused before anything was written
