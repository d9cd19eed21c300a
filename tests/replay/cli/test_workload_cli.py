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
