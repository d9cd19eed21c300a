"""Importers on the two vendored traces (counts, time spans and token totals equal the files' own,
computed here with the standard library), the CSV layouts that are too big to vendor (Azure 2024,
BurstGPT v1 and v1.2, by column name), ShareGPT, and the options: a window, a limit, a time scale,
clipping and dropping, every dropped or changed request counted; malformed rows name the file,
line and column."""

from __future__ import annotations

import csv
import json
from datetime import datetime
from pathlib import Path

import pytest

from replay.workloads.describe import summarize
from replay.workloads.fields import WorkloadFormatError
from replay.workloads.import_options import ImportCounts, ImportOptions
from replay.workloads.imports import import_workload
from replay.workloads.recipe import PromptRecipe

TRACES = Path(__file__).parents[3] / "traces/workloads"
AZURE = TRACES / "AzureLLMInferenceTrace_code.csv"
MOONCAKE = TRACES / "mooncake_synthetic_trace.jsonl"


def run(path: Path, fmt: str, **options: object) -> tuple[list, ImportCounts]:
    counts = ImportCounts()
    requests = list(import_workload(path, fmt, ImportOptions(**options), counts))  # type: ignore
    return requests, counts


def _seconds(stamp: str) -> float:
    """'2023-11-16 18:17:03.9799600' as seconds (7 fractional digits: parsed by hand)."""
    whole, _, fraction = stamp.partition(".")
    return datetime.fromisoformat(whole).timestamp() + float(f"0.{fraction or 0}")


def test_azure_2023_import_keeps_every_request_its_span_and_its_tokens() -> None:
    with open(AZURE, newline="") as handle:
        rows = list(csv.DictReader(handle))
    requests, counts = run(AZURE, "azure")
    assert counts.read == counts.kept == len(requests) == len(rows)
    assert not counts.dropped and not counts.changed
    assert sum(len(r.prompt) for r in requests) == sum(int(r["ContextTokens"]) for r in rows)
    assert sum(r.max_tokens for r in requests) == sum(int(r["GeneratedTokens"]) for r in rows)
    span = _seconds(rows[-1]["TIMESTAMP"]) - _seconds(rows[0]["TIMESTAMP"])
    assert requests[-1].arrival_s == pytest.approx(span, abs=1e-6)
    assert all(r.ignore_eos and not r.prompt.hash_ids for r in requests)


def test_mooncake_import_keeps_counts_span_tokens_and_hash_ids() -> None:
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines()]
    requests, counts = run(MOONCAKE, "mooncake")
    assert counts.kept == len(requests) == len(rows)
    assert requests[-1].arrival_s - requests[0].arrival_s == pytest.approx(
        (rows[-1]["timestamp"] - rows[0]["timestamp"]) / 1000)
    assert sum(len(r.prompt) for r in requests) == sum(r["input_length"] for r in rows)
    assert sum(r.max_tokens for r in requests) == sum(r["output_length"] for r in rows)
    assert all(r.prompt.hash_ids == tuple(row["hash_ids"]) and r.prompt.block_size == 512
               for r, row in zip(requests, rows))


def test_mooncake_reuse_at_512_token_blocks_is_the_published_65_percent() -> None:
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines()]
    seen: set[int] = set()
    served = 0
    for row in rows:  # full 512-token blocks whose (chained) id appeared before
        for k, block_id in enumerate(row["hash_ids"]):
            if (k + 1) * 512 <= row["input_length"] and block_id in seen:
                served += 512
            seen.add(block_id)
    expected = served / sum(r["input_length"] for r in rows)
    summary = summarize(import_workload(MOONCAKE, "mooncake", ImportOptions(), ImportCounts()),
                        512)
    assert summary.reuse == pytest.approx(expected, abs=1e-12)
    assert f"{100 * summary.reuse:.1f}" == "65.0"


def test_window_limit_scale_clip_and_drop_are_each_counted() -> None:
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines()]
    inside = [r for r in rows if 100 <= r["timestamp"] / 1000 < 200]
    requests, counts = run(MOONCAKE, "mooncake", start_s=100, end_s=200, time_scale=0.5,
                           max_prompt_len=8192, over_length="drop")
    long = [r for r in inside if r["input_length"] > 8192]
    # reading stops at the first row at or past --end (rows are in time order): read, dropped
    past = next(i for i, r in enumerate(rows) if r["timestamp"] / 1000 >= 200)
    assert counts.read == past + 1
    assert counts.dropped == {"outside the time window": past + 1 - len(inside),
                              "prompt over 8192 tokens": len(long)}
    assert counts.stopped.startswith(f"stopped reading at {MOONCAKE}:{past + 1} (it arrives")
    kept = [r for r in inside if r["input_length"] <= 8192]
    assert [r.arrival_s for r in requests] == pytest.approx(
        [(r["timestamp"] / 1000 - 100) * 0.5 for r in kept])
    requests, counts = run(MOONCAKE, "mooncake", limit=10, max_prompt_len=1000,
                           over_length="clip")
    clipped = sum(r["input_length"] > 1000 for r in rows[:10])
    assert len(requests) == 10 and counts.read == 10 and counts.dropped == {}  # none read after
    assert counts.changed == {"prompt clipped to 1000 tokens": clipped}
    assert max(len(r.prompt) for r in requests) == 1000
    assert requests[0].prompt == PromptRecipe(tuple(rows[0]["hash_ids"][:2]), 512, 1000,
                                              requests[0].prompt.salt)


def test_a_wrong_block_size_and_malformed_lines_name_file_line_and_field(tmp_path) -> None:
    with pytest.raises(WorkloadFormatError, match=r"synthetic_trace.jsonl:1: field 'hash_ids':"
                       r" 79 ids for 40160 tokens at --block-size 1024 \(at most 40\)"):
        run(MOONCAKE, "mooncake", block_size=1024)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [0]}\n'
                   '{"timestamp": 1, "input_length": "3", "output_length": 1, "hash_ids": [0]}\n')
    with pytest.raises(WorkloadFormatError, match=r"bad.jsonl:2: field 'input_length'"):
        run(bad, "mooncake")


def write_csv(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def test_azure_2024_timestamps_with_zone_and_mixed_precision(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "azure2024.csv", ["TIMESTAMP", "ContextTokens", "GeneratedTokens"],
                     [["2024-05-10 00:00:00.009930+00:00", 100, 5],
                      ["2024-05-10 00:00:01+00:00", 200, 0],
                      ["2024-05-10 00:00:02.5+00:00", 300, 7]])
    requests, counts = run(path, "azure")
    assert [r.arrival_s for r in requests] == pytest.approx([0.0, 0.99007, 2.49007])
    assert [r.max_tokens for r in requests] == [5, 1, 7]
    assert counts.changed == {"output length 0 raised to 1": 1}
    bad = write_csv(tmp_path / "bad.csv", ["TIMESTAMP", "ContextTokens", "GeneratedTokens"],
                    [["2024-05-10 00:00:00+00:00", 1, 1], ["2024-05-10 00:00:01+00:00", 2.5, 1]])
    with pytest.raises(WorkloadFormatError, match=r"bad.csv:3: column 'ContextTokens': expected "
                       "a non-negative integer, got '2.5'"):
        run(bad, "azure")
    with pytest.raises(WorkloadFormatError, match=r"azure2024.csv:1: not a BurstGPT CSV: no "
                       "column 'Request tokens'"):  # 'TIMESTAMP' is 'Timestamp': case ignored
        run(path, "burstgpt")


@pytest.mark.parametrize("layout", ["v1", "v1.2"])
def test_burstgpt_layouts_are_read_by_column_name(tmp_path: Path, layout: str) -> None:
    header = ["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens",
              "Log Type"]
    rows = [[5, "ChatGPT", 472, 18, 490, "Conversation log"],
            [7.5, "GPT-4", 1024, 0, 1024, "API log"],
            [9, "ChatGPT", 0, 30, 30, "Conversation log"],
            [10, "GPT-4", 60, 2, 62, "API log"]]
    if layout == "v1.2":  # two more columns, and the order shuffled
        header = ["Session ID", "Elapsed time"] + header[::-1]
        rows = [[11, 0.5] + row[::-1] for row in rows]
    path = write_csv(tmp_path / f"BurstGPT_{layout}.csv", header, rows)
    requests, counts = run(path, "burstgpt")
    assert [(r.arrival_s, len(r.prompt), r.max_tokens) for r in requests] == [
        (0.0, 472, 18), (5.0, 60, 2)]  # seconds after the first row (5 s)
    assert counts.dropped == {"empty prompt": 1, "failed request (Response tokens 0)": 1}
    assert not counts.changed  # 0 response tokens: a failed request, dropped (session 31)


def test_sharegpt_conversations_become_dependent_turns(tmp_path: Path) -> None:
    from engine.model.checkpoint import default_model_dir
    from engine.model.tokenizer import load_tokenizer

    data = [{"id": "x", "conversations": [
        {"from": "human", "value": "What is a KV cache?"},
        {"from": "gpt", "value": "It keeps the keys and values of past tokens."},
        {"from": "human", "value": "And prefix caching?"},
        {"from": "gpt", "value": "Reusing them across requests."}]},
        {"id": "x", "conversations": [{"from": "human", "value": "Unanswered"}]}]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    tokenizer = load_tokenizer(default_model_dir())
    requests, counts = run(path, "sharegpt")
    encode = [tokenizer.encode(m["value"], add_special_tokens=False)
              for m in data[0]["conversations"]]
    assert [(r.prompt, r.max_tokens, r.turn, r.conversation_id) for r in requests] == [
        (encode[0], len(encode[1]), 0, "x#0"), (encode[2], len(encode[3]), 1, "x#0"),
        (tokenizer.encode("Unanswered", add_special_tokens=False), 1, 0, "x#1")]
    assert counts.changed == {"output length 0 raised to 1": 1}
