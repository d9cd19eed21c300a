"""Engine tests release their engines: one left open by a test (or a module's fixtures) is closed
when that test (or module) ends, and on CUDA the memory is returned to the device, so the next
engine sizes its KV cache from memory that is really free (a GPU engine sizes from free memory).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from typing import Any

import pytest


def _open_engines() -> set[object]:
    llm = sys.modules.get("engine.llm")  # never import the model stack for a scheduler test
    return set(llm.open_engines()) if llm is not None else set()


def _release(before: set[object]) -> None:
    for engine in _open_engines() - before:
        engine.close()  # type: ignore[attr-defined]
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        gc.collect()  # engines dropped without close() hold their KV cache until collected
        torch.cuda.empty_cache()


@pytest.fixture(autouse=True)
def release_test_engines() -> Iterator[None]:
    before = _open_engines()
    yield
    _release(before)


@pytest.fixture(autouse=True, scope="module")
def release_module_engines() -> Iterator[None]:
    before = _open_engines()
    yield
    _release(before)


@pytest.fixture(scope="module")
def llm() -> Iterator[Any]:
    """One untraced engine on the tiny CPU model per test module (the request tests')."""
    from engine import LLM

    engine = LLM(None, record_events=False, calibration_repeats=0)
    yield engine
    engine.close()
