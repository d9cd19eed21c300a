"""Azure and Mooncake traces with epoch-number times keep their arrivals exact.

The Azure importer scaled each epoch number to nanoseconds in floating point: near 1.7e18 ns
floats are 256 ns apart, so two rows 750 ms apart in epoch milliseconds came out 0.749999872 s
apart, and epoch nanoseconds lost their last digits. The Mooncake importer divided epoch
milliseconds by 1000 before taking the first record's time off: 333 ms came out 0.33300018 s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.workloads.import_options import ImportCounts, ImportOptions
from replay.workloads.imports import import_workload

EPOCH_S = 1_715_299_200  # 2024-05-10 00:00:00 UTC


def _arrivals(tmp_path: Path, times: list[str], fmt: str = "azure") -> list[float]:
    path = tmp_path / "trace.csv"
    header = ("TIMESTAMP,ContextTokens,GeneratedTokens" if fmt == "azure"
              else "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type")
    rows = [f"{t},100,10" if fmt == "azure" else f"{t},ChatGPT,100,10,110,API log"
            for t in times]
    path.write_text("\n".join([header, *rows]) + "\n")
    return [r.arrival_s for r in import_workload(path, fmt, ImportOptions(), ImportCounts())]


@pytest.mark.parametrize(("times", "expected"), [
    # epoch milliseconds, microseconds and nanoseconds as integers
    ([f"{EPOCH_S}500", f"{EPOCH_S + 1}250", f"{EPOCH_S + 3}000"], [0.0, 0.75, 2.5]),
    ([f"{EPOCH_S}500000", f"{EPOCH_S + 1}250000", f"{EPOCH_S + 1}250001"],
     [0.0, 0.75, 0.750001]),
    ([f"{EPOCH_S}500000000", f"{EPOCH_S + 1}250000001", f"{EPOCH_S + 2}000000000"],
     [0.0, 0.750000001, 1.5]),
    # epoch seconds and milliseconds with fractions a float holds exactly
    ([f"{EPOCH_S}.5", f"{EPOCH_S + 1}.25", f"{EPOCH_S + 1}.375"], [0.0, 0.75, 0.875]),
    ([f"{EPOCH_S}500.5", f"{EPOCH_S + 1}250.25"], [0.0, 0.74975]),
])
def test_epoch_numbers_give_exact_arrivals(tmp_path: Path, times: list[str],
                                           expected: list[float]) -> None:
    """Each arrival is the exact difference of the epoch times, to the nanosecond."""
    assert _arrivals(tmp_path, times) == expected


def test_relative_seconds_and_dates_are_unchanged(tmp_path: Path) -> None:
    """BurstGPT's seconds from the start and Azure's dates read as before."""
    assert _arrivals(tmp_path, ["5", "5.25", "7.5"], "burstgpt") == [0.0, 0.25, 2.5]
    assert _arrivals(tmp_path, ["2024-05-10 00:00:00.009930+00:00",
                                "2024-05-10 00:00:00.759930+00:00"]) == [0.0, 0.75]


def test_mooncake_epoch_milliseconds_give_exact_arrivals(tmp_path: Path) -> None:
    """Each Mooncake arrival is the difference of the timestamps in milliseconds, / 1000."""
    path = tmp_path / "trace.jsonl"
    stamps = [EPOCH_S * 1000 + 123, EPOCH_S * 1000 + 456, EPOCH_S * 1000 + 1789]
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": 10, "output_length": 2})
                            + "\n" for t in stamps))
    arrivals = [r.arrival_s for r in import_workload(path, "mooncake", ImportOptions(),
                                                     ImportCounts())]
    assert arrivals == [0.0, 0.333, 1.666]
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": 10, "output_length": 2})
                            + "\n" for t in (27482.5, 27483, 30000)))
    arrivals = [r.arrival_s for r in import_workload(path, "mooncake", ImportOptions(),
                                                     ImportCounts())]
    assert arrivals == [0.0, 0.0005, 2.5175]
