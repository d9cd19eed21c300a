"""What the README and the user docs say of the ``replayllm`` command holds, on the CPU in seconds.

tests/test_docs_examples.py runs a chosen set of the README's commands; this file checks all of
them, and the docs', against the real parser, runs docs/workloads.md's opening commands, and
reproduces the error lines docs/workloads.md quotes, character for character:

- every ``replayllm`` command line of a code block (a synopsis's ``[--opt V]`` included) parses;
- every ``--option`` the docs write is one of replayllm's, or another tool's named below;
- every command and ``bench`` suite of ``replayllm --help`` is shown in the README (``bench
  whatif`` was in none of them);
- docs/workloads.md quoted ``got 1e+12`` where the command prints ``got 1000000000000.0``.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

import pytest
from _cli import REPO, message_lines, run_cli

from replay.cli.main import build_parser

DOCS = ["README.md", "docs/workloads.md", "docs/policies.md", "docs/profile.md",
        "docs/trace-format.md"]
# Options the docs write of other tools, each with its tool: not replayllm's to take.
FOREIGN_OPTIONS = {
    "--arrival-smoothness": "NVIDIA AIPerf", "--dataset-name": "vllm bench serve",
    "--num-prompts": "vllm bench serve", "--request-rate": "vllm bench serve",
    "--hypothesis-profile": "pytest (Hypothesis)", "--replayllm-traces": "pytest (our plugin)",
    "--pid": "py-spy", "--source": "python -m benchmarks.policies / matrix",
    "--step-ms": "python -m benchmarks.scheduler", "--target-host": "python -m benchmarks.matrix",
}


def _text(doc: str) -> str:
    return (REPO / doc).read_text(encoding="utf-8")


def _command_lines(doc: str) -> list[str]:
    """The ``replayllm`` lines of ``doc``'s fenced and indented code blocks, continuations joined,
    trailing comments dropped."""
    text = _text(doc)
    blocks = re.findall(r"^```[\w-]*\n(.*?)^```", text, flags=re.S | re.M)
    blocks += ["\n".join(line[4:] for line in m.group(0).splitlines())
               for m in re.finditer(r"(?:^    \S.*\n)+", text, flags=re.M)]
    lines = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line.startswith("replayllm "):
                lines.append(" ".join(line.split()))
    return lines


def _argv(line: str) -> list[str]:
    """A command line as arguments; a synopsis's optional parts (``[--set k=v ...]``) taken."""
    line = re.sub(r"\[([^\]]*)\]", r"\1", line).replace(" ...", "")
    return shlex.split(line)[1:]


def _all_options(parser: argparse.ArgumentParser) -> set[str]:
    found = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _all_options(sub)
    return found


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((a.choices for a in parser._actions
                 if isinstance(a, argparse._SubParsersAction)), {})


def test_every_documented_command_line_parses() -> None:
    lines = [(doc, line) for doc in DOCS for line in _command_lines(doc)]
    assert len(lines) >= 25
    for doc, line in lines:
        try:
            build_parser().parse_args(_argv(line))
        except SystemExit:  # argparse printed why on stderr
            pytest.fail(f"{doc}: `{line}` is not a valid replayllm command")


def test_every_documented_option_exists() -> None:
    ours = _all_options(build_parser())
    for doc in DOCS:
        for option in set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", _text(doc))):
            assert option in ours or option in FOREIGN_OPTIONS, f"{doc}: {option} is no option"


def test_every_command_in_help_is_shown_in_the_readme() -> None:
    readme = " ".join(_text("README.md").split())
    parser = build_parser()
    commands = _subcommands(parser)
    shown = [f"replayllm {name}" for name in commands]
    shown += [f"replayllm workload {name}" for name in _subcommands(commands["workload"])]
    suite = next(a for a in commands["bench"]._actions if a.dest == "suite")
    shown += [f"replayllm bench {name}" for name in suite.choices]
    for command in shown:
        assert re.search(rf"{re.escape(command)}(?![\w-])", readme), f"README lacks {command}"


def test_the_workloads_page_opening_commands_run(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Its generate, import and describe, as written; the describe prints the 65.0% the page
    gives for the vendored Mooncake trace, and draws the plot. (Its ``run`` takes hours on a
    CPU: parsed above.)"""
    (tmp_path / "traces").symlink_to(REPO / "traces")
    monkeypatch.chdir(tmp_path)
    lines = _command_lines("docs/workloads.md")[:3]
    assert [line.split()[2] for line in lines] == ["generate", "import", "describe"]
    for line in lines:
        code, out, err = run_cli(_argv(line))
        assert code == 0, (line, err)
    assert "65.0% of prompt tokens" in out and "**65.0%** at 512-token blocks" in _text(
        "docs/workloads.md")
    assert (tmp_path / "m.png").stat().st_size > 0 and (tmp_path / "w.parquet").is_file()


def _quoted(prefix: str) -> str:
    """The one line of a fenced block of docs/workloads.md starting with ``prefix``."""
    for block in re.findall(r"^```\n(.*?)^```", _text("docs/workloads.md"), flags=re.S | re.M):
        if block.startswith(prefix):
            return block.strip()
    raise AssertionError(f"docs/workloads.md quotes no line starting {prefix!r}")


REQUEST = {"prompt_token_ids": [1, 2, 3], "max_tokens": 2}


def _mooncake(folder: Path) -> list[str]:
    source = REPO / "traces/workloads/mooncake_synthetic_trace.jsonl"
    (folder / "m.jsonl").write_text("".join(source.open().readlines()[:3]))
    return ["workload", "describe", "m.jsonl"]


def _bad_token(folder: Path) -> list[str]:
    bad = {**REQUEST, "prompt_token_ids": [1, 2, 3, 2.5]}
    lines = [json.dumps(REQUEST)] * 6 + [json.dumps(bad)]
    (folder / "w.jsonl").write_text("\n".join(lines) + "\n")
    return ["workload", "describe", "w.jsonl"]


def _late_arrival(folder: Path) -> list[str]:
    lines = [json.dumps(REQUEST), json.dumps({**REQUEST, "arrival_s": 1e12})]
    (folder / "w.jsonl").write_text("\n".join(lines) + "\n")
    return ["whatif", "--workload", "w.jsonl", "--set", "num_kvcache_blocks=16", "--no-plots"]


def _burstgpt(folder: Path) -> list[str]:
    (folder / "BurstGPT_1.csv").write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n")
    return ["workload", "import", "BurstGPT_1.csv", "--format", "azure", "--out", "b.jsonl"]


@pytest.mark.parametrize("prefix, make", [
    ("m.jsonl:1:", _mooncake), ("w.jsonl:7:", _bad_token), ("w.jsonl: request 1:", _late_arrival),
    ("BurstGPT_1.csv:1:", _burstgpt)])
def test_the_error_lines_the_workloads_page_quotes_are_printed(
        prefix: str, make: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    argv = make(tmp_path)  # type: ignore[operator]
    code, _, err = run_cli(argv)
    assert code == 2
    lines = message_lines(err)
    assert len(lines) == 1, lines
    printed = re.sub(r"^replayllm [\w-]+: error: ", "", lines[0])
    assert printed == _quoted(prefix)
