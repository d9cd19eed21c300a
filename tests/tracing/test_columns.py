"""``Trace.columns``, the pandas-free numpy view verify reads, equals ``Trace.table``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from tracing.reader import read_trace
from tracing.schema import EVENT_KINDS

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "traces" / "cpu-tiny-demo"


def test_columns_equal_the_arrow_tables() -> None:
    """Every column of every kind, numbers, booleans, strings and lists, matches table(kind)."""
    trace = read_trace(SAMPLE)
    for kind in EVENT_KINDS:
        table = trace.table(kind)
        columns = trace.columns(kind)
        assert list(columns) == table.column_names
        for name, values in columns.items():
            expected = table.column(name).to_pylist()
            got = values if isinstance(values, list) else np.asarray(values).tolist()
            # assert_equal treats NaN as equal to NaN (host_s of a version-1 trace is NaN).
            np.testing.assert_equal(got, expected, err_msg=f"{kind}.{name}")


def test_verify_never_imports_pandas() -> None:
    """Reading and replaying a trace for verify stays clear of pandas (a third of its time)."""
    code = (
        "import sys\nfrom replay.verify import verify\n"
        f"assert verify({str(SAMPLE)!r}).identical\n"
        "print('pandas' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
