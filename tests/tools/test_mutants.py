"""Every mutant of the mutation tools (tools/mutation_check.py, tools/mutants_outside.py) still
applies: ``check_sources`` (the tools' own check before a run) finds its original text in its
file exactly as often as it says, old and new texts differ, and names are unique. A mutant whose
text the code no longer holds is never run, so the mutation score would count a bug the suite
was never shown."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import mutants_outside  # noqa: E402
import mutation_check  # noqa: E402


def test_every_mutant_applies() -> None:
    problems = mutation_check.check_sources((*mutation_check.MUTANTS, *mutants_outside.OUTSIDE))
    assert not problems, "\n".join(problems)
