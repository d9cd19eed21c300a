"""Arguments a user gets wrong: one line and exit 2, never a traceback or a silent no-op."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _cli import REPO, SAMPLE, one_error, owned_trace, run_cli, snapshot

PROFILE = REPO / "traces" / "profiles" / "h100-qwen3-0.6b-s22.profile.json"


def _whatif(tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    return run_cli(["whatif", str(SAMPLE), "--no-plots", "--jobs", "1",
                    "--out", str(tmp_path / "o"), *extra])


@pytest.mark.parametrize("spec", [",", "", " , "])
def test_profile_naming_no_file(tmp_path: Path, spec: str) -> None:
    """`whatif --profile ,` was an IndexError traceback (and `--profile ''` was ignored)."""
    code, _, err = _whatif(tmp_path, "--profile", spec)
    assert code == 2, err
    one_error(err, "names no file")


@pytest.mark.parametrize("edit, needle", [
    (lambda p: {**p, "rows": "x"}, "rows must be a list"),
    (lambda p: {**p, "rows": [1, 2]}, "profile row 0 must be a JSON object"),
    (lambda p: {**p, "rows": [{}]}, "kind must be one of"),
    (lambda p: {**p, "key": "x"}, "key must be a JSON object"),
    (lambda p: {**p, "rows": [{**p["rows"][0], "interval_s": "nan"}]}, "interval_s"),
    (lambda p: {**p, "rows": [{**p["rows"][0], "num_seqs": -1}]}, "num_seqs"),
    (lambda p: {**p, "rows": [{**p["rows"][0], "label": None}]}, "label"),
])
def test_profile_of_the_wrong_shape(tmp_path: Path, edit: object, needle: str) -> None:
    """A replayllm-profile file whose rows or key are of the wrong type was a TypeError /
    KeyError / ValueError traceback, and a row timed "nan" or with -1 sequences was fitted in
    silence. Now one line naming the file and the field, alone or pooled with a good one."""
    bad = tmp_path / "bad.profile.json"
    bad.write_text(json.dumps(edit(json.loads(PROFILE.read_text()))))  # type: ignore[operator]
    for spec in (str(bad), f"{PROFILE},{bad}"):
        code, _, err = _whatif(tmp_path, "--profile", spec)
        assert code == 2, err
        one_error(err, "bad.profile.json", needle)


@pytest.mark.parametrize("args, needle", [
    (["--grid", "max_num_seqs=1,,2"], "no empty value"),
    (["--grid", "max_num_seqs=4,"], "no empty value"),
    (["--grid", "max_num_seqs=2,4", "--grid", "max_num_seqs=8"], "given twice"),
    (["--set", "max_num_seqs=2", "--grid", "max_num_seqs=4,8"], "given twice"),
    (["--set", "max_num_seqs=2", "--set", "max_num_seqs=4"], "--set max_num_seqs is given twice"),
])
def test_a_variant_setting_given_twice_or_empty_is_refused(tmp_path: Path, args: list[str],
                                                           needle: str) -> None:
    """`--grid k=1,,2` ran two variants and dropped the empty one; a key in two --grid, in
    --set and --grid, or in two --set kept the last in silence. Each is now one line."""
    code, _, err = _whatif(tmp_path, *args)
    assert code == 2, err
    one_error(err, needle)


def test_num_seqs_with_a_trace_is_not_ignored(tmp_path: Path) -> None:
    """`whatif TRACE --num-seqs 2` (and `tune`) re-ran every request, saying nothing."""
    code, _, err = _whatif(tmp_path, "--num-seqs", "2")
    assert code == 2, err
    one_error(err, "--num-seqs takes --workload")
    code, _, err = run_cli(["tune", str(SAMPLE), "--num-seqs", "2", "--slo", "ttft_p99=1",
                            "--out", str(tmp_path / "t")])
    assert code == 2, err
    one_error(err, "--num-seqs takes --workload")


@pytest.mark.parametrize("content", [b"", b"\n\n"])
def test_an_empty_workload_is_refused(tmp_path: Path, content: bytes) -> None:
    """`run --workload empty.jsonl` recorded an empty trace and exited 0 (whatif printed a
    table of nothing); now one line, and no trace is made."""
    workload = tmp_path / "empty.jsonl"
    workload.write_bytes(content)
    for argv in (["run", "--workload", str(workload), "--out", str(tmp_path / "r")],
                 ["whatif", "--workload", str(workload), "--no-plots", "--set",
                  "num_kvcache_blocks=10", "--out", str(tmp_path / "w")]):
        code, _, err = run_cli(argv)
        assert code == 2, err
        one_error(err, "holds no requests")
    assert not (tmp_path / "r").exists() and not (tmp_path / "w").exists()


@pytest.mark.parametrize("command", ["verify", "inspect", "whatif"])
def test_a_deleted_last_commit_marker_is_damage_not_an_incomplete_trace(
        tmp_path: Path, command: str) -> None:
    """Deleting the last segment's commit marker (or all of _commits/) of a trace that closed
    cleanly made `verify` print "identical ... (incomplete trace)" and exit 0. The summary
    counts the segments it committed: now one line naming summary.json, exit 2."""
    for name in ("last", "all"):
        trace = tmp_path / name
        shutil.copytree(SAMPLE, trace)
        markers = sorted((trace / "_commits").glob("seg-*.json"))
        for marker in markers if name == "all" else markers[-1:]:
            marker.unlink()
        argv = [command, str(trace)] + (["--no-plots", "--out", str(tmp_path / "o")]
                                        if command == "whatif" else [])
        code, _, err = run_cli(argv)
        assert code == 2, err
        one_error(err, "summary.json", "commit marker")


def test_a_kv_cache_larger_than_memory(tmp_path: Path, tiny_workload: Path) -> None:
    """`run --set num_kvcache_blocks=2147483647 --force` was torch's RuntimeError traceback
    ("DefaultCPUAllocator: can't allocate memory"); now one line, and the old trace is whole.
    Since session 31 a pool over 2^22 blocks is a config error (engine.config.MAX_KV_BLOCKS);
    2^22 blocks of 65,536 tokens still reach the allocator: 512 TB, past any address space,
    so the allocation fails at once, never swaps."""
    trace = owned_trace(tmp_path / "t")
    before = snapshot(trace)
    for sets, needles in ((["num_kvcache_blocks=4194304", "kvcache_block_size=65536"],
                           ("out of memory", "num_kvcache_blocks")),
                          (["num_kvcache_blocks=2147483647"],
                           ("num_kvcache_blocks must be int in [1, 4194304]",))):
        code, _, err = run_cli(["run", "--workload", str(tiny_workload), "--out", str(trace),
                                "--force", *[a for s in sets for a in ("--set", s)]])
        assert code == 2, err
        one_error(err, *needles)
        assert snapshot(trace) == before


def test_whatif_refuses_a_pool_no_trace_could_describe(tmp_path: Path) -> None:
    """`whatif TRACE --set num_kvcache_blocks=2000000000` built two billion blocks for minutes
    (the bound was int32); now one line at once (engine.config.MAX_KV_BLOCKS, 2^22)."""
    code, _, err = run_cli(["whatif", str(SAMPLE), "--set", "num_kvcache_blocks=2000000000",
                            "--no-plots", "--out", str(tmp_path / "w")])
    assert code == 2, err
    one_error(err, "num_kvcache_blocks must be int in [1, 4194304]", "got 2000000000")
    assert not (tmp_path / "w").exists()


def test_out_of_memory_words_only_allocation_failures() -> None:
    """CUDA's and the CPU allocator's messages become one line; any other RuntimeError is
    left alone (a bug keeps its traceback)."""
    from replay.cli.main import out_of_memory

    cuda = RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79 GiB total)")
    assert "20.00 GiB" in (out_of_memory(cuda) or "")
    assert out_of_memory(MemoryError()) is not None
    assert out_of_memory(RuntimeError("shape mismatch")) is None


@pytest.mark.parametrize("argv, needle", [
    (["--repeat", "0"], "--repeat must be >= 1"),   # was: ran 3 repetitions in silence
    (["--repeat", "-1"], "--repeat must be >= 1"),  # was: an AssertionError traceback
    (["--json", "{dir}"], "not a regular file"),    # was: IsADirectoryError after the run
    (["--json", "{mine}"], "not an earlier benchmark result"),  # was: overwritten
    (["--json", ""], "--json is empty"),            # was: ran, and wrote no JSON in silence
])
def test_bench_arguments_checked_before_running(tmp_path: Path, argv: list[str],
                                                needle: str) -> None:
    """`replayllm bench scheduler` with a bad --repeat or --json: one line, before any run."""
    mine = tmp_path / "mine.txt"
    mine.write_text("mine")
    argv = [a.format(dir=tmp_path, mine=mine) for a in argv]
    code, out, err = run_cli(["bench", "scheduler", *argv])
    assert code == 2, err
    one_error(err, needle)
    assert out == "" and mine.read_text() == "mine"


@pytest.mark.parametrize("argv, needle", [
    (["--port", "70000"], "--port must be in"),  # was: served, on some other port
    (["--port", "-1"], "--port must be in"),     # was: uvicorn's own line, exit 3
    (["--grace", "nan"], "--grace must be"),     # was: a ValueError traceback at shutdown
    (["--max-request-bytes", "0"], "--max-request-bytes must be"),
    (["--max-waiting-prompts", "-1"], "--max-waiting-prompts must be"),
])
def test_serve_arguments_checked_before_the_model_loads(argv: list[str], needle: str) -> None:
    """`serve` with a port no socket can take or a NaN grace period: one line, exit 2, no
    server started."""
    code, out, err = run_cli(["serve", *argv, "--engine", "thread"])
    assert code == 2, err
    one_error(err, needle)
    assert out == ""
