"""``whatif --workload FILE`` with a request the configuration can never serve: the run goes on
with that request rejected as a live run rejects it (it refused the whole variant, exit 2).

What these tests prove: streamed or not, the exit status is 0, the summary's row is ``ok`` with
``rejected`` 1 of 4 requests and a note naming the request and the engine's reason; ``tune``'s
table marks a configuration that rejects requests ``rejects N``, never ``yes``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from _cli import SAMPLE, run_cli, write_jsonl

REASON = "request 1: prompt has 600 tokens, more than max_model_len=512"


def workload(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "w.jsonl", [
        {"prompt_token_ids": list(range(5, 5 + (600 if i == 1 else 20 + i))), "max_tokens": 3,
         "temperature": 0.0, "arrival_s": 0.01 * i} for i in range(4)])


def test_whatif_rejects_the_request_not_the_variant(tmp_path: Path) -> None:
    path = workload(tmp_path)
    for stream in ([], ["--stream"]):
        out = tmp_path / ("s" if stream else "w")
        code, text, err = run_cli(["whatif", "--workload", str(path), "--timing-from",
                                   str(SAMPLE), "--out", str(out), "--no-plots", *stream])
        assert code == 0, (stream, text, err)
        assert "Traceback" not in err
        assert f"1 of 4 requests rejected by this configuration, as a live run rejects them " \
               f"({REASON})" in text
        (row,) = pd.read_parquet(out / "summary.parquet").to_dict("records")
        assert row["status"] == "ok" and row["requests"] == 4 and row["rejected"] == 1
        assert REASON in row["notes"]


def test_tune_marks_a_configuration_that_rejects_requests(tmp_path: Path) -> None:
    code, text, _ = run_cli(["tune", "--workload", str(workload(tmp_path)), "--timing-from",
                             str(SAMPLE), "--slo", "ttft_p99=100", "--space",
                             "max_model_len=1024", "--space", "num_kvcache_blocks=28,64",
                             "--space", "max_num_batched_tokens=1024",
                             "--out", str(tmp_path / "t"), "--no-plots"])
    assert code == 0, text
    frame = pd.read_parquet(tmp_path / "t" / "tune.parquet")
    rejecting = frame[frame["rejected"] > 0]  # as recorded (512), and a pool of 448 tokens
    assert len(rejecting) == 2 and not rejecting["meets_slos"].any()
    assert "best: max_model_len=1024 num_kvcache_blocks=64 max_num_batched_tokens=1024" in text
    (line,) = [line for line in text.splitlines() if line.startswith("as recorded  ")]
    assert line.split()[2:4] == ["rejects", "1"]  # the table's meets column
    assert "as recorded: rejects 1 of 4 requests" in text  # it said "misses ttft_p99<=100s"
