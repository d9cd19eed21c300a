"""An empty path argument to read (``verify ""``, ``--timing-from ""``, ``--plots ""``, as a
script with an unset variable passes it) was read as the working directory or as not given:

- ``verify ""``, ``inspect ""``, ``export ""``, ``whatif ""``, ``whatif --compare ""`` said
  ``.: not a trace directory (no run.json)``, naming neither the argument nor the mistake;
- ``run --model ""``, ``profile --model ""`` and ``serve --model ""`` looked for a checkpoint in
  the working directory (``missing tokenizer.json in .``);
- ``whatif --timing-from ""`` and ``--host-from ""``, ``tune --timing-from ""`` and ``workload
  describe --plots ""`` ran as if the option were not given, exit 0: another timing source or
  host than asked, no plot;
- ``loadgen --tokenizer ""`` sent token-id turns without the tokenizer asked for, and the
  workload readers said ``cannot read : No such file or directory``.

Each is now one line naming the argument, exit 2, before any work, nothing written. The write
options (``--out ""``) keep their tests in test_empty_path_options_cli.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _cli import SAMPLE, TINY_REQUEST, one_error, run_cli

URL = "http://127.0.0.1:9"  # nothing listens there: a case that got past the check fails late


def _cases(inputs: Path) -> list[tuple[list[str], str]]:
    trace, work = str(SAMPLE), str(inputs / "w.jsonl")
    return [
        (["verify", ""], "TRACE"),
        (["inspect", ""], "TRACE"),
        (["export", ""], "TRACE"),
        (["whatif", "", "--no-plots"], "TRACE"),
        (["whatif", trace, "--no-plots", "--compare", ""], "--compare"),
        (["whatif", trace, "--no-plots", "--timing-from", ""], "--timing-from"),
        (["whatif", trace, "--no-plots", "--host-from", ""], "--host-from"),
        (["whatif", "--workload", "", "--no-plots"], "--workload"),
        (["tune", trace, "--no-plots", "--slo", "ttft_p99=1", "--timing-from", ""],
         "--timing-from"),
        (["tune", "--workload", "", "--no-plots", "--slo", "ttft_p99=1"], "--workload"),
        (["run", "--model", "", "--out", "o"], "--model"),
        (["run", "--workload", "", "--out", "o"], "--workload"),
        (["profile", "--model", "", "--out", "p.json"], "--model"),
        (["serve", "--model", ""], "--model"),
        (["workload", "describe", work, "--plots", ""], "--plots"),
        (["workload", "describe", ""], "WORKLOAD"),
        (["workload", "import", "", "--format", "mooncake", "--out", "z.jsonl"], "SOURCE"),
        (["workload", "import", str(inputs / "sg.json"), "--format", "sharegpt", "--model", "",
          "--out", "z.jsonl"], "--model"),
        (["workload", "generate", "--num-requests", "2", "--arrivals", "schedule",
          "--schedule", "", "--out", "z.jsonl"], "--schedule"),
        (["loadgen", "", "--url", URL], "WORKLOAD"),
        (["loadgen", work, "--url", URL, "--tokenizer", ""], "--tokenizer"),
    ]


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    folder = tmp_path / "inputs"
    folder.mkdir()
    (folder / "w.jsonl").write_text(json.dumps(TINY_REQUEST) + "\n")
    sharegpt = [{"id": "a", "conversations": [{"from": "human", "value": "hi"},
                                              {"from": "gpt", "value": "hello"}]}]
    (folder / "sg.json").write_text(json.dumps(sharegpt))
    return folder


@pytest.mark.parametrize("index", range(len(_cases(Path()))),
                         ids=[f"{a[0]} {n}" for a, n in _cases(Path())])
def test_an_empty_path_argument_is_one_line_naming_it(index: int, inputs: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    argv, name = _cases(inputs)[index]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    code, text, err = run_cli(argv)
    assert code == 2, (text, err)
    one_error(err, f"{name} is empty: give a")
    assert list(cwd.iterdir()) == []  # refused before any work: nothing written


def test_a_name_may_still_be_empty_where_it_is_no_path(inputs: Path) -> None:
    """``loadgen --model`` is a model's name, not a path: the rule leaves it to loadgen (the
    server's ``/v1/models`` decides), so an empty one is not called an empty path."""
    code, _, err = run_cli(["loadgen", str(inputs / "w.jsonl"), "--url", URL, "--model", ""])
    assert code == 2
    assert "is empty: give a path" not in err
