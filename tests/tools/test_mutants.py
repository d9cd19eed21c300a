"""Every mutant of the mutation tools (tools/mutation_check.py, tools/mutants_outside.py) still
applies: its original text occurs in its file exactly as often as it says. A mutant whose text
the code no longer holds is never run, so the mutation score would count a bug the suite was
never shown."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import mutants_outside  # noqa: E402
import mutation_check  # noqa: E402

ALL = (*mutation_check.MUTANTS, *mutants_outside.OUTSIDE)


@pytest.mark.parametrize("mutant", ALL, ids=[m.name for m in ALL])
def test_the_mutant_applies(mutant: mutation_check.Mutant) -> None:
    source = (ROOT / mutant.path).read_text()
    assert source.count(mutant.old) == mutant.count, f"{mutant.name}: {mutant.path} changed"
    assert mutant.old != mutant.new


def test_mutant_names_are_unique() -> None:
    names = [m.name for m in ALL]
    assert len(names) == len(set(names))
