"""``replayllm workload generate|import|describe``: files written, counts printed, the Mooncake
trace described as 65.0% reusable at 512-token blocks with a PNG, bad input one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

from replay.cli.main import main
from replay.workloads.store import read_metadata, read_workload

MOONCAKE = Path(__file__).parents[3] / "traces/workloads/mooncake_synthetic_trace.jsonl"


def test_generate_then_describe(tmp_path: Path, capsys) -> None:
    out = tmp_path / "gen.parquet"
    assert main(["workload", "generate", "--out", str(out), "--num-requests", "200",
                 "--arrivals", "gamma", "--rate", "20", "--burstiness", "0.5",
                 "--system-prompts", "3", "--turns", "fixed:2", "--think-time", "fixed:1",
                 "--seed", "4"]) == 0
    assert "wrote 400 requests (200 conversations)" in capsys.readouterr().out
    requests = list(read_workload(out))
    assert len(requests) == 400 and sum(r.follows_previous_turn for r in requests) == 200
    assert read_metadata(out)["generated"]["command"]["burstiness"] == 0.5
    png = tmp_path / "gen.png"
    assert main(["workload", "describe", str(out), "--block-size", "16", "--plots",
                 str(png)]) == 0
    text = capsys.readouterr().out
    assert "200 (200 later turns)" in text and png.stat().st_size > 0


def test_import_mooncake_and_describe_its_reuse(tmp_path: Path, capsys) -> None:
    out = tmp_path / "mooncake.jsonl"
    assert main(["workload", "import", str(MOONCAKE), "--format", "mooncake", "--out",
                 str(out), "--max-prompt-len", "100000", "--over-length", "drop"]) == 0
    printed = capsys.readouterr().out
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines()]
    long = sum(r["input_length"] > 100000 for r in rows)
    assert f"kept {len(rows) - long:,}" in printed
    assert f"dropped {long} (prompt over 100000 tokens)" in printed
    assert read_metadata(out)["imported"]["dropped"] == {"prompt over 100000 tokens": long}
    full = tmp_path / "full.parquet"
    assert main(["workload", "import", str(MOONCAKE), "--format", "mooncake", "--out",
                 str(full)]) == 0
    capsys.readouterr()
    assert main(["workload", "describe", str(full), "--block-size", "512"]) == 0
    text = capsys.readouterr().out
    assert "prefix reuse @512      65.0%" in text and f"{'requests':<22} {len(rows):,}\n" in text


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_token_ids": [1], "max_tokens": 1}\n{"prompt_token_ids": [1.5], '
                   '"max_tokens": 1}\n')
    assert main(["workload", "describe", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("replayllm workload: error: ") and f"{bad}:2: field " \
        "'prompt_token_ids'" in err
    assert main(["workload", "generate", "--out", str(tmp_path / "x.jsonl"), "--num-requests",
                 "5", "--prompt-len", "uniform:9"]) == 2
    assert "uniform takes 2" in capsys.readouterr().err


def test_burstgpt_filter_model_through_the_cli(tmp_path: Path, capsys) -> None:
    """``--filter-model`` keeps one BurstGPT model, counted in the output and the header; a
    model with no rows is one line naming the models present, exit 2, no file (session 32)."""
    trace = tmp_path / "BurstGPT_1.csv"
    trace.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     "0,ChatGPT,10,5,15,Conversation log\n1,GPT-4,20,6,26,API log\n")
    out = tmp_path / "w.jsonl"
    assert main(["workload", "import", str(trace), "--format", "burstgpt", "--filter-model",
                 "GPT-4", "--out", str(out)]) == 0
    assert "kept 1, dropped 1 (Model not GPT-4)" in capsys.readouterr().out
    assert [(r.arrival_s, len(r.prompt)) for r in read_workload(out)] == [(1.0, 20)]
    assert read_metadata(out)["imported"]["command"]["filter_model"] == "GPT-4"
    out.unlink()
    assert main(["workload", "import", str(trace), "--format", "burstgpt", "--filter-model",
                 "Claude", "--out", str(out)]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (f"replayllm workload: error: {trace}: no row has Model 'Claude' (the models "
                    "present: ChatGPT (1 row), GPT-4 (1 row))")
    assert not out.exists()


def test_describe_refuses_an_empty_workload(tmp_path: Path, capsys) -> None:
    """An empty workload (no bytes, blank lines, a header only) is one line, exit 2, as ``run``
    refuses it (before: exit 0 and a table of 'requests 0'); no plot is written."""
    from replay.workloads.store import WorkloadWriter

    empty = tmp_path / "empty.parquet"
    WorkloadWriter(empty).close({"generated": {}})
    for path, text in [(tmp_path / "e.jsonl", ""), (tmp_path / "b.jsonl", "\n\n"),
                       (tmp_path / "h.jsonl", '{"replayllm_workload": 1}\n'), (empty, None)]:
        if text is not None:
            path.write_text(text)
        png = tmp_path / "p.png"
        assert main(["workload", "describe", str(path), "--plots", str(png)]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and not png.exists()
        assert captured.err.strip().splitlines()[-1] == (
            f"replayllm workload: error: {path}: the workload holds no requests")


def test_an_option_of_another_format_is_refused(tmp_path: Path, capsys) -> None:
    """``--rate`` and ``--model`` (sharegpt), ``--block-size`` (mooncake) and
    ``--filter-model`` (burstgpt) given with another format are one line, exit 2, no file
    (before: ignored, exit 0: ``--rate 5`` on a Mooncake trace wrote its own arrivals)."""
    out = tmp_path / "w.jsonl"
    for option, value, owner in [("--rate", "5", "sharegpt"), ("--model", "/tmp/m", "sharegpt"),
                                 ("--block-size", "16", "mooncake"),
                                 ("--filter-model", "GPT-4", "burstgpt")]:
        assert main(["workload", "import", str(MOONCAKE) if owner != "mooncake" else
                     str(MOONCAKE.parent / "AzureLLMInferenceTrace_code.csv"), "--format",
                     "mooncake" if owner != "mooncake" else "azure", "--out", str(out), option,
                     value]) == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line.startswith(f"replayllm workload: error: {option} applies to --format "
                               f"{owner} only, not ") and not out.exists()
    assert main(["workload", "import", str(MOONCAKE), "--format", "mooncake", "--out", str(out),
                 "--block-size", "512", "--limit", "3"]) == 0
