"""``replayllm demo``'s closing line: the command it prints loads the trace as printed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from replay.cli.demo import load_hint

DEMO = Path(__file__).resolve().parents[3] / "traces" / "cpu-tiny-demo"


@pytest.mark.parametrize("name", ["plain", "with space", "it's", 'say "hi"', "cost$HOME",
                                  "back`tick`", "wow!"])
def test_the_printed_load_command_runs_whatever_the_path(tmp_path: Path, name: str) -> None:
    """The demo printed ``python -c "... read_parquet('OUT/seq_scheduled') ..."`` with the
    ``--out`` path pasted in: a path holding a quote was a Python syntax error, one holding
    ``$`` or a backtick was expanded by the shell (another path read, or a command run). The
    command is now quoted for the shell and the path is a Python literal; a plain path keeps
    the plain form."""
    trace = tmp_path / name
    shutil.copytree(DEMO, trace)
    hint = load_hint(str(trace))
    assert hint.startswith("python -c ")
    command = f"{shlex_quote(sys.executable)} -c {hint[len('python -c '):]}"
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                            cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "num_new_tokens" in result.stdout
    if name == "plain":
        assert hint == ('python -c "import pandas as pd; '
                        f"print(pd.read_parquet('{trace}/seq_scheduled').head())\"")


def shlex_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)
