"""``replayllm workload`` with inputs it was not tuned to (session 33, docs/TESTING.md), through
the CLI: one line on stderr and exit 2, or the right file, never a traceback."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from _cli import run_cli

from replay.workloads.store import read_workload

MOONCAKE = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n"


def errors(err: str) -> list[str]:
    """The lines of ``err`` a user reads, a progress bar's redraws left out; never a
    traceback."""
    assert "Traceback" not in err
    return [line for line in err.replace("\r", "\n").splitlines() if " req [" not in line
            and line.strip()]


LMSYS = ('{"conversation_id": "c", "model": "m", "conversation": [{"role": "user", "content": '
         '"hi"}, {"role": "assistant", "content": "hello"}]}\n')


@pytest.mark.parametrize("name, text, fmt", [("m.jsonl", MOONCAKE, "mooncake"),
                                             ("a.csv", AZURE, "azure"),
                                             ("chat.jsonl", LMSYS, "sharegpt")])
def test_describe_of_a_public_trace_names_the_import(tmp_path: Path, name: str, text: str,
                                                     fmt: str) -> None:
    """``workload describe`` (and ``run``/``whatif --workload``, which read alike) of a trace
    not yet imported said ``field 'timestamp': unknown field (--ignore-unknown-fields reads
    past it)`` or ``not JSON``, and with that flag ``give exactly one of prompt_token_ids,
    ...``; it now also names the format and the import command, one line, exit 2."""
    path = tmp_path / name
    path.write_text(text)
    code, out, err = run_cli(["workload", "describe", str(path)])
    lines = errors(err)
    assert code == 2 and not out and len(lines) == 1, err
    assert lines[0].endswith(f"looks like a trace of --format {fmt}, not a workload file: make "
                             f"one with `replayllm workload import {path} --format {fmt} "
                             "--out FILE`")


def test_generate_reads_a_gzip_schedule_and_refuses_bytes_not_utf8(tmp_path: Path) -> None:
    """``--schedule`` gzip-compressed gives its times; one with bytes that are not UTF-8 is
    one line, exit 2, no file (before: a ``UnicodeDecodeError`` traceback for both)."""
    packed = tmp_path / "times.gz"
    packed.write_bytes(gzip.compress(b"0\n0.5\n"))
    out = tmp_path / "w.jsonl"
    code, _, err = run_cli(["workload", "generate", "--out", str(out), "--num-requests", "2",
                            "--arrivals", "schedule", "--schedule", str(packed)])
    assert code == 0, err
    assert [r.arrival_s for r in read_workload(out)] == [0.0, 0.5]
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"0\n1\xe9\n")
    again = tmp_path / "again.jsonl"
    code, _, err = run_cli(["workload", "generate", "--out", str(again), "--num-requests", "2",
                            "--prompt-len", f"empirical:{latin}"])
    assert code == 2 and not again.exists()
    assert errors(err) == [f"replayllm workload: error: {latin}:2: not UTF-8 text "
                           "(invalid continuation byte at byte 2 of the line)"]


def test_import_of_a_csv_with_a_quote_left_open_writes_nothing(tmp_path: Path) -> None:
    """A BurstGPT file whose quote is never closed imported its first row and lost the rest,
    exit 0; now one line, exit 2, no file."""
    path = tmp_path / "b.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    '5,ChatGPT,472,18,490,"Conversation log\n6,GPT-4,10,5,15,API log\n')
    out = tmp_path / "w.jsonl"
    code, _, err = run_cli(["workload", "import", str(path), "--format", "burstgpt", "--out",
                            str(out)])
    assert code == 2 and not out.exists()
    assert len(errors(err)) == 1 and "malformed CSV" in err


@pytest.mark.parametrize("command", [
    ["generate", "--num-requests", "20", "--rate", "5", "--turns", "fixed:2",
     "--think-time", "fixed:1"],
    ["import", "AZURE", "--format", "azure"],
])
def test_an_out_named_gz_is_gzip_compressed_and_reads_back(tmp_path: Path,
                                                           command: list[str]) -> None:
    """``--out w.jsonl.gz`` wrote plain JSONL under a gzip name: ``zcat`` and pandas refuse
    it (``not in gzip format``). It is now gzip-compressed (the same requests as ``.jsonl``,
    the same bytes for the same command: no time stamp in the gzip header); ``--out
    w.parquet.gz`` (JSONL before) is one line, exit 2, no file."""
    source = tmp_path / "a.csv"
    source.write_text(AZURE + "2023-11-16 18:17:04.0319600,3180,8\n")
    argv = ["workload"] + [str(source) if c == "AZURE" else c for c in command]
    plain, packed = tmp_path / "w.jsonl", tmp_path / "w.jsonl.gz"
    for out in (plain, packed):
        assert run_cli(argv + ["--out", str(out)])[0] == 0
    first = packed.read_bytes()
    packed.unlink()
    assert run_cli(argv + ["--out", str(packed)])[0] == 0
    assert packed.read_bytes() == first  # the same command, the same bytes
    assert gzip.decompress(first).replace(b"w.jsonl.gz", b"w.jsonl") == plain.read_bytes()
    assert list(read_workload(packed)) == list(read_workload(plain))
    code, _, err = run_cli(argv + ["--out", str(tmp_path / "w.parquet.gz")])
    assert code == 2 and not (tmp_path / "w.parquet.gz").exists()
    assert errors(err) == [f"replayllm workload: error: cannot write {tmp_path}/w.parquet.gz: "
                           "Parquet compresses its own columns (zstd); name it w.parquet"]
