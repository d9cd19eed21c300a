"""An engine left open by a test is closed when the test ends (tests/engine/conftest.py), so a
GPU engine started later sizes its KV cache from memory that is really free."""

from __future__ import annotations

from engine.llm import LLM, open_engines
from tests.engine.conftest import _open_engines, _release


def test_open_engines_lists_until_close_and_release_closes_leaked_ones() -> None:
    before = _open_engines()
    kept = LLM(None, record_events=False, calibration_repeats=0)
    leaked = LLM(None, record_events=False, calibration_repeats=0)
    assert {kept, leaked} <= set(open_engines())
    kept.close()
    assert kept not in open_engines() and leaked in open_engines()
    _release(before)
    assert leaked not in open_engines()
    assert leaked.runner.kv_cache is None and leaked.core.closed
