"""The CSV traces users download, each in its published layout (hand-written rows under
``fixtures/``, never the data): Azure LLM inference 2023 (7 fractional digits, no zone), 2024
(a zone, mixed precision: ``...00:00:01+00:00`` beside ``...00:00:00.009930+00:00``), Azure's
2025 multimodal trace (``2024-10-15T12:00:00.269Z``, a ``NumImages`` column before the token
columns), BurstGPT v1.1 (six columns, integer seconds) and BurstGPT v2.0's ``BurstGPT_3.csv``
(eight columns: ``Session ID`` blank on API rows, ``Elapsed time``, float seconds from 19.4 M).
Each is read by column name: counts, arrival times and lengths as the file says."""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.workloads.import_options import ImportCounts, ImportOptions
from replay.workloads.imports import import_workload

FIXTURES = Path(__file__).parent / "fixtures"


def run(name: str, fmt: str, **options: object) -> tuple[list[tuple[float, int, int]],
                                                          ImportCounts]:
    counts = ImportCounts()
    requests = import_workload(FIXTURES / name, fmt, ImportOptions(**options),  # type: ignore
                               counts)
    return [(r.arrival_s, r.prompt_len, r.max_tokens) for r in requests], counts


@pytest.mark.parametrize("name, expected", [
    ("azure_2023_conv.csv", [(0.0, 374, 44), (4.314579, 396, 109), (4.314579, 879, 55),
                             (5.31961, 91, 1)]),
    ("azure_2024_code_1week.csv", [(0.0, 2162, 5), (0.007405, 2399, 6), (0.99007, 76, 15),
                                   (1.24007, 2376, 1)]),
    ("azure_lmm_2025_multimodal.csv", [(0.0, 770, 491), (5.55, 949, 126),
                                       (6.244, 4564, 79)]),
])
def test_azure_layouts_read_times_and_lengths(name: str, expected: list) -> None:
    """Every Azure layout gives its rows' lengths and arrivals from the first row, to the
    microsecond (the 2024 trace's whole-second rows, printed without a fraction, included);
    a row that generated nothing is raised to 1 and counted, never dropped in silence."""
    requests, counts = run(name, "azure")
    assert [(pytest.approx(t, abs=1e-9), p, o) for t, p, o in requests] == expected
    assert counts.read == counts.kept == len(expected)
    zero = sum(1 for line in (FIXTURES / name).read_text().splitlines()[1:]
               if line.endswith(",0"))
    assert counts.changed == ({"output length 0 raised to 1": zero} if zero else {})


def test_burstgpt_v1_1_reads_integer_seconds_and_drops_failures_counted() -> None:
    """BurstGPT v1.1 (``BurstGPT_1.csv``): seconds from the first row; a row of 0 response
    tokens is a failed request, dropped and counted."""
    requests, counts = run("burstgpt_v1_1.csv", "burstgpt")
    assert requests == [(0.0, 472, 18), (113.0, 417, 505), (125.0, 1330, 210)]
    assert (counts.read, counts.kept) == (4, 3)
    assert counts.dropped == {"failed request (Response tokens 0)": 1}


def test_burstgpt_v2_eight_columns_read_by_name() -> None:
    """``BurstGPT_3.csv`` puts ``Session ID`` and ``Elapsed time`` before ``Model``; the token
    columns are found by name, a blank ``Session ID`` is no error, and float timestamps from
    19,440,110 s count from the first row; ``--filter-model`` still reads ``Model``."""
    requests, counts = run("burstgpt_v2_with_sessions.csv", "burstgpt")
    assert requests == [(0.0, 472, 18), (1.0, 1087, 300), (30.0, 1502, 220)]
    assert counts.dropped == {"failed request (Response tokens 0)": 1}
    gpt4, counts = run("burstgpt_v2_with_sessions.csv", "burstgpt", filter_model="GPT-4")
    assert gpt4 == [(1.0, 1087, 300), (30.0, 1502, 220)]
    assert counts.dropped == {"Model not GPT-4": 2}  # the failed row is ChatGPT's
