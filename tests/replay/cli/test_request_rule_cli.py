"""One rule for a workload's requests (``replay.workloads.fields.check_request``): ``run``,
``whatif``, ``tune`` and ``loadgen`` refuse a request that arrives (or thinks) past a week or
asks for more than int32 tokens, and ``workload generate`` and ``workload import`` never write
one (before: they wrote files the other commands then refused, or waited on for ever)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from _cli import TINY_REQUEST, one_error, run_cli, write_jsonl

from engine.errors import InvalidRequestError
from replay.workloads.fields import MAX_ARRIVAL_S, check_request
from replay.workloads.request import Request


def _workload_error(err: str, *needles: str) -> None:
    """``one_error`` past the workload commands' progress bars (`generate: 1 req [...]`)."""
    one_error("\n".join(line for line in err.replace("\r", "\n").split("\n")
                        if " req [" not in line), *needles)


def test_check_request_bounds_arrivals_think_times_and_max_tokens() -> None:
    check_request(Request([1], 1, arrival_s=MAX_ARRIVAL_S), "w")
    check_request(Request([1], 2**31 - 1, conversation_id="c", turn=1,
                          think_time_s=MAX_ARRIVAL_S), "w")
    for request, field in ((Request([1], 1, arrival_s=math.nextafter(MAX_ARRIVAL_S, math.inf)),
                            "arrival_s"),
                           (Request([1], 1, arrival_s=math.nan), "arrival_s"),
                           (Request([1], 1, arrival_s=-1.0), "arrival_s"),
                           (Request([1], 1, conversation_id="c", turn=1, think_time_s=1e12),
                            "think_time_s"),
                           (Request([1], 2**31), "max_tokens"),
                           (Request([1], True), "max_tokens")):  # type: ignore[arg-type]
        with pytest.raises(InvalidRequestError, match=f"^w: {field} must be"):
            check_request(request, "w")


@pytest.mark.parametrize("options,field", [
    (["--rate", "1e-300"], "arrival_s"),   # before: wrote arrival_s 1e300, refused by run
    (["--rate", "1e-6"], "arrival_s"),     # ~11.6 days: finite, still past a week
    (["--rate", "10", "--turns", "fixed:2", "--think-time", "fixed:1e9"], "think_time_s"),
])
def test_generate_refuses_what_run_would_refuse(tmp_path: Path, options: list[str],
                                                field: str) -> None:
    out = tmp_path / "w.jsonl"
    code, _, err = run_cli(["workload", "generate", "--num-requests", "3", "--out", str(out),
                            *options])
    assert code == 2, err
    _workload_error(err, "generated request 2", f"{field} must be a finite number of seconds in "
              "[0, 604800]")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no file, no .partial


def test_generate_writes_arrivals_up_to_a_week(tmp_path: Path) -> None:
    out = tmp_path / "w.jsonl"
    code, _, err = run_cli(["workload", "generate", "--num-requests", "2", "--arrivals",
                            "constant", "--rate", str(1 / MAX_ARRIVAL_S), "--out", str(out)])
    assert code == 0, err
    code, _, err = run_cli(["whatif", "--workload", str(out), "--no-plots", "--set",
                            "num_kvcache_blocks=100", "--out", str(tmp_path / "o")])
    assert code == 0, err


@pytest.mark.parametrize("options,needle", [
    # before: wrote arrival_s 1.5e300 (finite), which run and whatif then refused
    (["--time-scale", "1e300"], "--time-scale 1e+300 puts the request at 1.5 s of the trace"),
    ([], "request 2 (at 1e+06 s of the trace): arrival_s must be"),  # a source over a week
])
def test_import_refuses_what_run_would_refuse(tmp_path: Path, options: list[str],
                                              needle: str) -> None:
    late = 1.5 if options else 1e6
    source = write_jsonl(tmp_path / "src.jsonl", [TINY_REQUEST, {**TINY_REQUEST,
                                                                 "arrival_s": late}])
    out = tmp_path / "out.jsonl"
    code, _, err = run_cli(["workload", "import", str(source), "--format", "replayllm",
                            "--out", str(out), *options])
    assert code == 2, err
    _workload_error(err, needle, "[0, 604800]", "--time-scale, --end or --limit")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.jsonl"]
    # The same source within a week: written, and run's rule takes it.
    code, _, err = run_cli(["workload", "import", str(source), "--format", "replayllm",
                            "--out", str(out), "--time-scale", "0.5" if options else "1e-3"])
    assert code == 0, err


def test_loadgen_refuses_before_sending(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """loadgen waits for a request's arrival on the wall clock as a run does: 1e12 s waited
    for ever (before), now it is run's one line, before any request is sent."""
    import replay.loadgen.runner as runner

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the load started")

    monkeypatch.setattr(runner, "run_load", never)
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps(TINY_REQUEST) + "\n"
                        + json.dumps({**TINY_REQUEST, "arrival_s": 1e12}) + "\n")
    code, _, err = run_cli(["loadgen", str(workload), "--url", "http://127.0.0.1:9",
                            "--out", str(tmp_path / "r.parquet")])
    assert code == 2, err
    one_error(err, "w.jsonl: request 1: arrival_s must be a finite number of seconds")


def test_run_and_whatif_refuse_a_think_time_past_a_week(tmp_path: Path) -> None:
    """A later turn thinking 1e12 s made a run wait for ever after its first turn."""
    workload = write_jsonl(tmp_path / "w.jsonl", [
        {**TINY_REQUEST, "conversation_id": "c"},
        {**TINY_REQUEST, "conversation_id": "c", "turn": 1, "think_time_s": 1e12}])
    for argv in (["run", "--workload", str(workload), "--out", str(tmp_path / "o")],
                 ["whatif", "--workload", str(workload), "--no-plots", "--set",
                  "num_kvcache_blocks=100", "--out", str(tmp_path / "w")]):
        code, _, err = run_cli(argv)
        assert code == 2, err
        one_error(err, "request 1: think_time_s must be a finite number of seconds")
