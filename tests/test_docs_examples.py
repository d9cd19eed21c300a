"""The README's and docs/policies.md's fast CPU examples run as written and say what the docs say.

An explicit list, not a scrape: each case names commands that must appear verbatim in the doc's
code blocks (a continuation line joined, the trailing comment dropped), then runs them in that
order in a scratch directory holding a link to the committed ``traces/`` (so a changed command,
flag or path fails here). Paths the doc writes outside its working directory (``/tmp/tiny``)
are moved into the scratch directory. Left out: what needs a GPU, a server, or more than a few
seconds on the CPU (``run --workload bench``, ``tune``, the 1M-request stream), and the code
that other tests already run (docs/trace-format.md: tests/tracing/test_docs.py; the policy
page's Python: tests/replay/testing/test_policies_doc.py).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TIMEOUT_S = 60


def _commands(doc: str) -> list[str]:
    """Every command line of ``doc``'s sh and bash code blocks, continuations joined and
    trailing comments dropped."""
    text = (REPO / doc).read_text(encoding="utf-8")
    out: list[str] = []
    for block in re.findall(r"^```(?:sh|bash)\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append(re.sub(r"\s+", " ", line))
    return out


def _python_block(doc: str, index: int = 0) -> str:
    text = (REPO / doc).read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)[index]


def _sjf_module() -> str:
    """The policy docs/policies.md writes as ``sjf.py``."""
    block = next(b for b in re.findall(r"^```python\n(.*?)^```",
                                       (REPO / "docs/policies.md").read_text(), re.S | re.M)
                 if b.startswith("# sjf.py"))
    return block


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "traces").symlink_to(REPO / "traces")
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "sched.py").write_text(_sjf_module())  # README: --set policy=mypkg.sched:...
    return tmp_path


def _run(command: str, cwd: Path, moved: dict[str, str]) -> str:
    """Run one documented command in ``cwd`` (the doc's own paths in ``moved`` replaced);
    its stdout and stderr, asserting exit 0."""
    for old, new in moved.items():
        command = command.replace(old, new)
    argv = shlex.split(command)
    env = dict(os.environ)
    if argv[0] == "replayllm":
        argv[0] = str(BIN / "replayllm")
    elif argv[0] == "python":
        argv[0] = sys.executable
        env["PYTHONPATH"] = str(REPO)  # `python -m benchmarks.X` from the source checkout
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{output[-3000:]}"
    return output


CASES = {
    "readme-whatif": ("README.md", [
        "replayllm whatif traces/h200-reference --set max_num_seqs=64 --set num_kvcache_blocks=300",
        "replayllm whatif traces/h200-reference --grid max_num_seqs=64,256 "
        "--grid policy=prefill_first,chunked",
        "replayllm whatif traces/h200-constrained --compare traces/h200-reference",
        "replayllm whatif traces/h200-reference --set policy=mypkg.sched:ShortestJobFirst",
    ]),
    "readme-workloads": ("README.md", [
        "replayllm workload generate --num-requests 1000 --arrivals gamma --rate 20 "
        "--burstiness 0.5 --system-prompts 8 --turns uniform:1,4 --out w.jsonl",
        "replayllm workload import traces/workloads/mooncake_synthetic_trace.jsonl "
        "--format mooncake --limit 500 --out m.parquet",
        "replayllm workload describe m.parquet --plots m.png",
    ]),
    "readme-make-model": ("README.md", [
        "replayllm make-model --preset tiny --out /tmp/tiny",
    ]),
    "policies-whatif": ("docs/policies.md", [
        "python -m benchmarks.policies workload /tmp/priority.jsonl",
        "replayllm whatif --workload /tmp/priority.jsonl --timing-from traces/h200-constrained "
        "--set max_num_seqs=64 --set num_kvcache_blocks=300 --grid policy=prefill_first,priority",
        "replayllm whatif traces/h200-constrained --set eviction=lru",
    ]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_documented_commands_run(case: str, workdir: Path) -> None:
    doc, commands = CASES[case]
    documented = _commands(doc)
    moved = {"/tmp/tiny": str(workdir / "tiny"), "/tmp/priority.jsonl": "priority.jsonl"}
    for command in commands:
        assert command in documented, f"{doc} no longer shows: {command}"
        _run(command, workdir, moved)
    if case == "readme-workloads":
        assert (workdir / "m.png").stat().st_size > 0
    if case == "readme-make-model":
        assert (workdir / "tiny" / "config.json").is_file()


def test_readme_opens_with_make_demo_and_make_test() -> None:
    """The README's first lines are the two commands, and the Makefile has both targets."""
    first = (REPO / "README.md").read_text(encoding="utf-8").split("```", 2)
    assert first[0] == "" and first[1] == "sh\nmake demo\nmake test\n"
    targets = re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), flags=re.M)
    assert {"demo", "test"} <= set(targets)


def test_readme_python_example_runs(workdir: Path) -> None:
    """The README's Python example, in a fresh interpreter: it records a complete trace that
    verifies, and a second run keeps it (refused without force=True), as its comment says."""
    (workdir / "use.py").write_text(_python_block("README.md"))
    done = subprocess.run([sys.executable, "use.py"], cwd=workdir, capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (workdir / "out/my-trace/summary.json").is_file()
    _run("replayllm verify out/my-trace", workdir, {})
    again = subprocess.run([sys.executable, "use.py"], cwd=workdir, capture_output=True,
                           text=True, timeout=TIMEOUT_S)
    assert again.returncode != 0 and "pass --force (force=True" in again.stderr


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _table_rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 13 and _NUMBER.fullmatch(cells[1]):
            rows[cells[0]] = cells[1:]
    return rows


def test_policies_page_table_is_what_the_benchmark_prints(workdir: Path) -> None:
    """docs/policies.md's what-if table is ``python -m benchmarks.policies whatif``'s output:
    every figure within one unit of its last printed digit (a rounding that flips on another
    CPU's floating point passes; a table left behind by a change of the step-time model not)."""
    command = "python -m benchmarks.policies whatif"
    assert command in _commands("docs/policies.md")
    printed = _table_rows(_run(command, workdir, {}))
    documented = _table_rows((REPO / "docs/policies.md").read_text(encoding="utf-8"))
    assert set(printed) == set(documented) and len(printed) == 6
    for setting, cells in documented.items():
        for doc_cell, got_cell in zip(cells, printed[setting]):
            doc_numbers, got_numbers = _NUMBER.findall(doc_cell), _NUMBER.findall(got_cell)
            assert len(doc_numbers) == len(got_numbers), (setting, doc_cell, got_cell)
            for want, got in zip(doc_numbers, got_numbers):
                unit = 10.0 ** -len(want.partition(".")[2])
                assert abs(float(want) - float(got)) <= unit * 1.01, (setting, doc_cell, got_cell)


def test_workloads_page_python_api_imports() -> None:
    """docs/workloads.md's "Python API" block names modules and functions that exist (it named
    ``load_workload`` in ``replay.workloads.builtin``, an ImportError)."""
    doc = (REPO / "docs" / "workloads.md").read_text()
    block = next(b for b in doc.split("```python")[1:] if "import_workload" in b)
    exec(compile(block.split("```")[0], "docs/workloads.md", "exec"), {})
