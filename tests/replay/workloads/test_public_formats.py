"""Public trace formats as their publishers write them (hand-made files in each documented
layout: a BOM, CRLF line ends, a trailing empty line), what each format's rows mean (BurstGPT's
failed requests, ShareGPT's conversations without a question, Mooncake's partial last block),
and the one error a file of another format gets (session 31, docs/TESTING.md)."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest

from engine.errors import InvalidRequestError
from replay.workloads.describe import summarize
from replay.workloads.fields import WorkloadFormatError
from replay.workloads.import_options import ImportCounts, ImportOptions
from replay.workloads.imports import import_workload

BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
BURSTGPT_ROWS = ["5,ChatGPT,472,18,490,Conversation log",
                 "5,GPT-4,1024,0,1024,API log",  # a failed request: dropped, counted
                 "9.25,ChatGPT,61,0,61,Conversation log",  # failed, past the limit's end
                 "12,GPT-4,300,20,320,API log"]


def run(path: Path, fmt: str, **options: object) -> tuple[list, ImportCounts]:
    counts = ImportCounts()
    requests = list(import_workload(path, fmt, ImportOptions(**options), counts))  # type: ignore
    return requests, counts


def burstgpt_file(tmp_path: Path) -> Path:
    path = tmp_path / "BurstGPT_1.csv"
    text = "\r\n".join([BURSTGPT_HEADER] + BURSTGPT_ROWS) + "\r\n\r\n"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    return path


def test_burstgpt_failed_requests_are_dropped_and_counted(tmp_path: Path) -> None:
    """A BurstGPT row with 0 response tokens is a failed request (the dataset's own
    ``without_fails`` files and vLLM's BurstGPT reader drop them): it is dropped and counted as
    failed, and its time still counts for the trace's start and order (before: sent as a
    1-token request that never happened, counted only as 'output length 0 raised to 1')."""
    requests, counts = run(burstgpt_file(tmp_path), "burstgpt")
    assert [(r.arrival_s, len(r.prompt), r.max_tokens) for r in requests] == [
        (0.0, 472, 18), (7.0, 300, 20)]
    assert counts.read == 4 and counts.kept == 2
    assert counts.dropped == {"failed request (Response tokens 0)": 2} and not counts.changed
    requests, counts = run(burstgpt_file(tmp_path), "burstgpt", limit=1)
    assert (counts.read, counts.dropped) == (1, {})  # reading stops at the limit: none after
    assert counts.stopped.startswith(f"stopped reading at {tmp_path / 'BurstGPT_1.csv'}:2 (--limit")


def test_a_trace_of_failed_requests_only_keeps_nothing_and_says_why(tmp_path: Path) -> None:
    path = tmp_path / "BurstGPT_fails.csv"
    path.write_text("\n".join([BURSTGPT_HEADER] + BURSTGPT_ROWS[1:3]) + "\n")
    with pytest.raises(WorkloadFormatError, match=r"keeps none of its requests \(read 2, kept 0,"
                       r" dropped 2 \(failed request \(Response tokens 0\)\)\)"):
        run(path, "burstgpt")


SUPPORTED = (r"; workload import reads azure \(CSV: TIMESTAMP, ContextTokens, GeneratedTokens\);"
             r" burstgpt \(CSV: Timestamp, Request tokens, Response tokens\); mooncake .*; "
             r"sharegpt .*; replayllm .*")
AZURE_2023 = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.6805900,374,44\r\n"
MOONCAKE_LINE = '{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]}\n'
SHAREGPT = json.dumps([{"id": "a", "conversations": [{"from": "human", "value": "hi"},
                                                      {"from": "gpt", "value": "hello"}]}])


@pytest.mark.parametrize("text, fmt, message", [
    (BURSTGPT_HEADER + "\n5,ChatGPT,472,18,490,Conversation log\n", "azure",
     r"t:1: not an Azure LLM inference CSV: no column 'ContextTokens' \(columns found: "
     r"Timestamp, Model, Request tokens, Response tokens, Total tokens, Log Type\)" + SUPPORTED
     + r"; this file looks like --format burstgpt$"),
    (AZURE_2023, "mooncake", r"t:1: not JSON \(Expecting value, column 1\) \(columns found: "
     r"TIMESTAMP, ContextTokens, GeneratedTokens\)" + SUPPORTED + "; this file looks like "
     "--format azure$"),
    (MOONCAKE_LINE, "burstgpt", r"t:1: not a BurstGPT CSV: a JSON line, not a CSV header "
     r"\(fields found: timestamp, input_length, output_length, hash_ids\)" + SUPPORTED
     + "; this file looks like --format mooncake$"),
    (SHAREGPT, "mooncake", r"t:1: element 0: not a Mooncake record: no field 'timestamp' \(fields "
     r"found: id, conversations\)" + SUPPORTED + "; this file looks like --format sharegpt$"),
    ('[{"id": "a", "instruction": "hi", "output": "hello"}]', "sharegpt",
     r"t:1: element 0: not a ShareGPT conversation: no field 'conversations', 'messages' or "
     r"'conversation' "
     r"\(fields found: id, instruction, output\)" + SUPPORTED + "$"),
    ("request_id,arrival,prompt_tokens\n1,0.5,10\n", "azure", r"t:1: not an Azure LLM inference "
     r"CSV: no column 'TIMESTAMP' \(columns found: request_id, arrival, prompt_tokens\)"
     + SUPPORTED + "$"),
])
def test_a_file_of_another_format_names_what_it_holds_and_the_formats_read(
        tmp_path: Path, text: str, fmt: str, message: str) -> None:
    """A file in another (or an unsupported) format is one line naming its columns or fields,
    every format read with the names it needs, and the format it looks like (before: 'not
    JSON', 'unknown field 'id'', a JSON line dumped as CSV columns, no formats named)."""
    path = tmp_path / "t"
    path.write_text(text)
    with pytest.raises(WorkloadFormatError) as caught:
        run(path, fmt)
    assert "\n" not in str(caught.value)
    assert caught.value.args[0].startswith(str(tmp_path))
    assert re.search(message, str(caught.value)), str(caught.value)


def test_another_format_through_the_cli_is_exit_2_and_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from replay.cli.main import main

    path = burstgpt_file(tmp_path)
    out = tmp_path / "w.jsonl"
    assert main(["workload", "import", str(path), "--format", "azure", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]  # after the progress bar's
    assert "Traceback" not in err and line.startswith("replayllm workload: error: ")
    assert "columns found: Timestamp, Model" in line
    assert line.endswith("this file looks like --format burstgpt")
    assert not out.exists()


def test_sharegpt_conversations_without_a_question_are_counted(tmp_path: Path) -> None:
    """Multi-turn ShareGPT with a system message, roles in other cases, an empty conversation,
    one that starts with the assistant (ShareGPT's split conversations do) and a question with
    no text: every message that becomes no turn is counted as dropped (before: skipped
    silently, the import claiming to have read only the turns it sent)."""
    from engine.model.checkpoint import default_model_dir
    from engine.model.tokenizer import load_tokenizer

    data = [{"id": "e", "conversations": []},
            {"id": "s", "conversations": [
                {"from": "gpt", "value": "continued from an earlier part"},
                {"from": "system", "value": "Be brief."},
                {"from": "Human", "value": "What is a KV cache?"},
                {"from": "GPT", "value": "Cached keys and values."},
                {"from": "human", "value": ""},
                {"from": "gpt", "value": "An answer to nothing."},
                {"from": "human", "value": "Thanks"},
                {"from": "gpt", "value": "Welcome."}]}]
    path = tmp_path / "sharegpt.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(json.dumps(d) for d in data).encode()
                     + b"\r\n\r\n")
    encode = load_tokenizer(default_model_dir()).encode
    requests, counts = run(path, "sharegpt")
    assert [(r.prompt, r.max_tokens, r.turn, r.conversation_id) for r in requests] == [
        (encode("Be brief.", add_special_tokens=False)
         + encode("What is a KV cache?", add_special_tokens=False),
         len(encode("Cached keys and values.", add_special_tokens=False)), 0, "s#1"),
        (encode("Thanks", add_special_tokens=False),
         len(encode("Welcome.", add_special_tokens=False)), 1, "s#1")]
    assert counts.read == 5 and counts.kept == 2
    assert counts.dropped == {"empty conversation": 1,
                              "answer with no question text before it": 2}


def test_mooncake_partial_last_block_shares_exactly_its_tokens(tmp_path: Path) -> None:
    """Mooncake names a prompt's partial last block too (600 tokens: 2 ids at 512): requests
    with the same ids share all 600 tokens, one with another last id only the first 512, and
    the reuse at 16-token engine blocks counts the 5 full engine blocks of the 88-token part
    (checked, not changed, in session 31)."""
    lines = [{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]},
             {"timestamp": 1000, "input_length": 600, "output_length": 3, "hash_ids": [7, 8]},
             {"timestamp": 2000, "input_length": 600, "output_length": 3, "hash_ids": [7, 9]}]
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + "\n")
    requests, _ = run(path, "mooncake")
    a, b, c = (np.asarray(r.prompt.token_ids()) for r in requests)
    assert (a == b).all() and (a[:512] == c[:512]).all() and (a[512:] != c[512:]).any()
    summary = summarize(iter(requests), 16)
    assert summary.reuse == pytest.approx((592 + 512) / 1800)


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_a_json_array_is_decoded_element_by_element_across_chunks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    """A JSON array (a ShareGPT file: 600 MB) is read a chunk at a time, one element decoded
    at a time, the same values as ``json.loads`` of the whole, whatever falls on a chunk's edge
    (a number cut after its '.', an escape, a multi-byte character), and a malformed element
    fails after the elements before it came out (before: the whole text and every element were
    held in memory before the first one came out)."""
    from replay.workloads import text_input

    monkeypatch.setattr(text_input, "ARRAY_CHUNK", chunk)
    data = [{"id": str(i), "n": 10 ** i, "x": -1.25e-3, "s": 'é"\\\n' * i, "l": [True, None]}
            for i in range(25)] + [12345, -1.0e10, 0.5, "str", None, True, [], {}]
    for indent in (None, 0, 2):
        path = tmp_path / "a.json"
        path.write_text("\n\n" + json.dumps(data, indent=indent, ensure_ascii=False) + "\n\n",
                        encoding="utf-8")
        assert [v for _, v in text_input.json_records(path)] == data
    text = json.dumps(data[:3], indent=1)[:-2] + ",\n{oops}\n]"
    path.write_text(text)
    records = text_input.json_records(path)
    assert [v for _, v in itertools.islice(records, 3)] == data[:3]
    line = text.count("\n", 0, text.index("{oops}")) + 1
    with pytest.raises(WorkloadFormatError, match=rf"a.json:{line}: not a JSON array \(Expecting "
                       r"property name enclosed in double quotes, column 2\)"):
        next(records)
    for text, message in [("[1,]", r"Expecting value, column 4"), ("[1 2]", r"Expecting ',' "),
                          ("[1] x", r"Extra data, column 5"), ("[", "Expecting value")]:
        path.write_text(text)
        with pytest.raises(WorkloadFormatError, match=rf"a.json:1: not a JSON array \({message}"):
            list(text_input.json_records(path))
    path.write_text("[ ]\n")
    assert list(text_input.json_records(path)) == []


def test_burstgpt_filter_model_keeps_one_model_and_counts_the_others(tmp_path: Path) -> None:
    """``--filter-model GPT-4`` keeps that model's rows (as vLLM's BurstGPT reader does, which
    keeps only GPT-4), matched ignoring case and spaces; the others are dropped and counted,
    their times still the trace's (the first kept request arrives at its trace time: 7 s). A
    model with no rows is one line naming the models present (session 32: before, no option)."""
    path = burstgpt_file(tmp_path)
    requests, counts = run(path, "burstgpt", filter_model="GPT-4 ")
    assert [(r.arrival_s, len(r.prompt)) for r in requests] == [(7.0, 300)]
    assert counts.read == 4 and counts.kept == 1
    assert counts.dropped == {"Model not GPT-4": 2, "failed request (Response tokens 0)": 1}
    requests, counts = run(path, "burstgpt", filter_model="chatgpt")
    assert [(r.arrival_s, len(r.prompt)) for r in requests] == [(0.0, 472)]
    with pytest.raises(WorkloadFormatError, match=r"BurstGPT_1.csv: no row has Model 'GPT4' "
                       r"\(the models present: ChatGPT \(2 rows\), GPT-4 \(2 rows\)\)$"):
        run(path, "burstgpt", filter_model="GPT4")
    with pytest.raises(InvalidRequestError, match=r"--filter-model applies to --format "
                       r"burstgpt only, not azure$"):
        run(path, "azure", filter_model="GPT-4")
    no_model = tmp_path / "no_model.csv"
    no_model.write_text("Timestamp,Request tokens,Response tokens\n0,5,5\n")
    assert len(run(no_model, "burstgpt")[0]) == 1
    with pytest.raises(WorkloadFormatError, match=r"no_model.csv:1: not a BurstGPT CSV: no "
                       r"column 'Model' \(--filter-model reads it\)"):
        run(no_model, "burstgpt", filter_model="GPT-4")
