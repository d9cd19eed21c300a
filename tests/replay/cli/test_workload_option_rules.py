"""``replayllm workload import|generate`` with an option that cannot apply or a time scale of
0 or below: one line, exit 2, no file, no traceback; the time scale of a conversation workload
reaches its think times."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.cli.main import main

AZURE = Path(__file__).parents[3] / "traces/workloads/AzureLLMInferenceTrace_code.csv"


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("scale", ["-1", "nan", "inf"])
def test_import_refuses_a_negative_or_infinite_time_scale(tmp_path: Path, scale: str,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    out = tmp_path / "w.jsonl"
    assert main(["workload", "import", str(AZURE), "--format", "azure", "--out", str(out),
                 f"--time-scale={scale}", "--limit", "2"]) == 2
    assert _error_line(capsys).startswith(
        "replayllm workload: error: --time-scale must be a finite number >= 0, got ")
    assert not out.exists()


def test_import_time_scale_minus_zero_is_zero(tmp_path: Path) -> None:
    """-0.0 is 0, everything at once (before: arrivals written as -0.0)."""
    out = tmp_path / "w.jsonl"
    assert main(["workload", "import", str(AZURE), "--format", "azure", "--out", str(out),
                 "--time-scale=-0.0", "--limit", "2"]) == 0
    assert '"arrival_s": -0.0' not in out.read_text()
    rows = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    assert [row.get("arrival_s", 0.0) for row in rows] == [0.0, 0.0]


def test_import_time_scale_reaches_think_times(tmp_path: Path) -> None:
    source = _write(tmp_path / "c.jsonl", [
        {"prompt_len": 4, "max_tokens": 2, "arrival_s": 4.0, "conversation_id": "a"},
        {"prompt_len": 4, "max_tokens": 2, "conversation_id": "a", "turn": 1,
         "think_time_s": 10.0}])
    out = tmp_path / "w.jsonl"
    assert main(["workload", "import", str(source), "--format", "replayllm", "--out", str(out),
                 "--time-scale", "0.5"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    assert (rows[0]["arrival_s"], rows[1]["think_time_s"]) == (2.0, 5.0)


@pytest.mark.parametrize("fmt,name,text", [
    ("azure", "a.csv", None),
    ("burstgpt", "b.csv", "Timestamp,Model,Request tokens,Response tokens\n0,GPT-4,3,4\n"),
    ("sharegpt", "s.json", '[{"id": "x", "conversations": [{"from": "human", "value": "hi"}]}]'),
])
def test_import_refuses_ignore_unknown_fields_where_it_cannot_apply(
        tmp_path: Path, fmt: str, name: str, text: str | None,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Before: accepted with CSV and ShareGPT sources, without effect."""
    source = AZURE if text is None else tmp_path / name
    if text is not None:
        source.write_text(text)
    out = tmp_path / "w.jsonl"
    assert main(["workload", "import", str(source), "--format", fmt, "--out", str(out),
                 "--ignore-unknown-fields"]) == 2
    assert _error_line(capsys) == ("replayllm workload: error: --ignore-unknown-fields applies "
                                   f"to --format mooncake and replayllm only, not {fmt}")
    assert not out.exists()


@pytest.mark.parametrize("options,message", [
    (["--user-len", "fixed:5"], "--user-len applies to later turns only, and --turns fixed:1 "
     "gives every conversation one turn"),
    (["--think-time", "fixed:3"], "--think-time applies to later turns only, and --turns "
     "fixed:1 gives every conversation one turn"),
    (["--popularity", "0"], "--popularity applies to system prompts only: give "
     "--system-prompts N (N >= 1) too"),
    (["--hash-block-size", "8"], "--hash-block-size applies to system prompts only: give "
     "--system-prompts N (N >= 1) too"),
    (["--system-prompt-len", "fixed:8"], "--system-prompt-len applies to system prompts only: "
     "give --system-prompts N (N >= 1) too"),
    (["--arrivals", "constant"], "--arrivals constant needs --rate (without one every request "
     "arrives at 0)"),
    # before: accepted, every request at 0 (the CLI could not tell it from the default)
    (["--arrivals", "poisson"], "--arrivals poisson needs --rate (without one every request "
     "arrives at 0)"),
    (["--burstiness", "0.5"], "--burstiness applies to --arrivals gamma"),
    (["--schedule", "times.txt"], "--schedule needs --arrivals schedule"),
])
def test_generate_refuses_options_that_cannot_apply(tmp_path: Path, options: list[str],
                                                    message: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Before: each accepted, exit 0, the file as without it."""
    out = tmp_path / "w.jsonl"
    assert main(["workload", "generate", "--num-requests", "2", "--out", str(out),
                 *options]) == 2
    assert _error_line(capsys) == f"replayllm workload: error: {message}"
    assert not out.exists()


def test_generate_records_the_system_prompt_defaults(tmp_path: Path) -> None:
    from replay.workloads.store import read_metadata

    out = tmp_path / "w.jsonl"
    assert main(["workload", "generate", "--num-requests", "2", "--out", str(out),
                 "--system-prompts", "2"]) == 0
    command = read_metadata(out)["generated"]["command"]
    assert (command["system_prompt_len"], command["popularity"],
            command["hash_block_size"]) == ("fixed:512", 1.0, 16)


@pytest.mark.parametrize("options,arrivals", [([], None), (["--rate", "50"], "poisson"),
                                              (["--arrivals", "poisson", "--rate", "50"],
                                               "poisson")])
def test_generate_without_arrivals_keeps_the_default(tmp_path: Path, options: list[str],
                                                     arrivals: str | None) -> None:
    """No --arrivals: Poisson, and without --rate everything at 0, as before; the header's
    command names the process only where one ran (null: everything at 0)."""
    from replay.workloads.store import read_metadata

    out = tmp_path / "w.jsonl"
    assert main(["workload", "generate", "--num-requests", "4", "--out", str(out),
                 *options]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    times = [row.get("arrival_s", 0.0) for row in rows]
    assert (max(times) > 0) == bool(options)
    assert read_metadata(out)["generated"]["command"]["arrivals"] == arrivals


@pytest.mark.parametrize("options,labels", [
    ([], {"prompt_len"}),  # before: the later turns' clips were labelled user_len
    (["--user-len", "normal:1,40"], {"prompt_len", "user_len"}),
])
def test_generate_labels_clips_by_the_option_that_drew_them(
        tmp_path: Path, options: list[str], labels: set[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    from replay.workloads.store import read_metadata

    out = tmp_path / "w.jsonl"
    assert main(["workload", "generate", "--num-requests", "200", "--out", str(out),
                 "--prompt-len", "normal:1,40", "--turns", "fixed:3", *options]) == 0
    clipped = read_metadata(out)["generated"]["clipped"]
    assert set(clipped) == labels
    printed = capsys.readouterr().out
    assert ("user_len values clipped" in printed) == ("user_len" in labels)
