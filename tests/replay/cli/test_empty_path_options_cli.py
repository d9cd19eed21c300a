"""An empty path option (``--out ""``, as a script with an unset variable passes it) read as the
working directory: ``make-model``, ``demo`` and ``run`` said ". is the working directory or one
of its parents", which names neither the option nor the mistake. Each is now one line naming the
option, exit 2, before any work; ``export --out ""`` keeps its own message."""

from __future__ import annotations

import pytest
from _cli import run_cli

CASES = [
    ["make-model", "--preset", "tiny", "--out", ""],
    ["demo", "--out", ""],
    ["run", "--workload", "bench", "--num-seqs", "1", "--out", ""],
    ["whatif", "traces/cpu-tiny-demo", "--out", ""],
    ["whatif", "traces/cpu-tiny-demo", "--report", ""],
    ["workload", "generate", "--num-requests", "2", "--out", ""],
    ["serve", "--trace-dir", ""],
]


@pytest.mark.parametrize("argv", CASES, ids=lambda a: " ".join(a[:2]))
def test_an_empty_path_option_is_one_line_naming_it(argv, tmp_path, monkeypatch) -> None:
    from _cli import REPO

    monkeypatch.chdir(tmp_path)
    argv = [str(REPO / a) if a.startswith("traces/") else a for a in argv]
    code, text, err = run_cli(argv)
    option = argv[argv.index("") - 1]
    assert code == 2, (text, err)
    assert f"{option} is empty: give a path" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []
