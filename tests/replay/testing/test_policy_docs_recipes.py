"""A hook that never returns, and what docs/policies.md tells a user about it.

What these tests prove: a hook that loops forever hangs ``run_workload`` (and so a property
test) with no word: the slow-hook warning fires only after a call returns, and the engine's hot
path takes no thread or signal to interrupt it. docs/policies.md said nothing of it, nor that
the ``waiting`` a hook gets is read-only. It now says both, and the recipe it gives for a hang
(pytest's ``-o faulthandler_timeout=N``) does name the hook's own file and line first: checked
here on a hook that spins for 3 s under a 1 s timeout, in a user's pytest run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DOC = (REPO / "docs" / "policies.md").read_text(encoding="utf-8")

SPINS = """
    import time

    from engine.policy import Policy


    class Spins(Policy):
        def admit(self, waiting, step):
            end = time.monotonic() + 3
            while time.monotonic() < end:  # lines 9-10: stand in for a loop that never ends
                pass
            yield from super().admit(waiting, step)
"""

USER_TEST = """
    from engine.config import Config
    from replay.testing import RequestSpec, Workload, run_workload


    def test_spins():
        config = Config(policy="s38b_spins:Spins", kvcache_block_size=2, num_kvcache_blocks=8,
                        max_model_len=16, max_num_batched_tokens=16, eos=-1)
        run_workload(Workload(config, (RequestSpec(0, (1, 2, 3), 2, True, (3, 3)),)))
"""


def test_the_docs_say_how_to_find_a_hook_that_never_returns() -> None:
    assert "faulthandler_timeout" in DOC and "py-spy dump" in DOC
    assert "never returns" in DOC


def test_the_docs_say_the_waiting_queue_is_read_only() -> None:
    assert "`waiting` is read-only" in DOC and "sorted(waiting, key=" in DOC


def test_the_documented_timeout_names_the_hooks_line_first(tmp_path: Path) -> None:
    (tmp_path / "s38b_spins.py").write_text(textwrap.dedent(SPINS))
    (tmp_path / "test_spins.py").write_text(textwrap.dedent(USER_TEST))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-o", "faulthandler_timeout=1", "test_spins.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": f"{REPO}:{tmp_path}", "PATH": "/usr/bin:/bin"})
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-2000:]
    dump = output[output.index("Timeout (0:00:01)!"):]
    first = dump.splitlines()[2]  # the innermost frame of the main thread
    # The loop's lines are 9 and 10: the dump lands on either.
    assert first.strip() in (f'File "{tmp_path / "s38b_spins.py"}", line {n} in admit'
                             for n in (9, 10)), dump[:600]
