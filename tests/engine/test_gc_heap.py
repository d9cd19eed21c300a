"""The start-up heap frozen out of the collector's full passes (engine/gc_heap.py): an engine's
start-up freezes it, its close gives it back, and garbage is still collected."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from engine.gc_heap import freeze_startup_heap, release_heap


class _Node:
    """A reference-counted object that only the cyclic collector can free (in a cycle)."""

    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    release_heap()
    yield
    release_heap()


def test_freeze_collects_start_up_garbage_then_keeps_the_heap_out_of_full_passes() -> None:
    """Garbage left before the freeze is collected by it; the objects alive are frozen, so a
    full pass walks only what came after; once released, they are collected as usual."""
    dropped = _cycle()  # garbage in a cycle, left by "start-up"
    kept = _cycle()
    alive = kept()
    frozen = freeze_startup_heap()
    assert dropped() is None  # collected before the freeze
    assert frozen == gc.get_freeze_count() > 1000
    assert len(gc.get_objects(generation=2)) < frozen / 10  # the full pass skips the heap
    del alive  # dies while frozen: the collector does not see it
    gc.collect()
    assert kept() is not None
    release_heap()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert kept() is None


def test_a_second_freeze_collects_what_an_earlier_frozen_engine_dropped() -> None:
    """A process that starts engines in turn: the next start-up collects the cycles of an
    engine dropped without close() (frozen by its own start-up)."""
    kept = _cycle()
    alive = kept()
    freeze_startup_heap()
    del alive
    gc.collect()
    assert kept() is not None
    freeze_startup_heap()
    assert kept() is None


@pytest.mark.parametrize("freeze", [True, False])
def test_an_engine_freezes_its_start_up_heap_and_its_close_releases_it(freeze: bool) -> None:
    """``LLM`` freezes the heap at the end of start-up when ``freeze_gc_heap`` is on (the
    default) and unfreezes it on close; off, the collector is left as Python set it up."""
    from engine.llm import LLM

    llm = LLM(None, record_events=False, freeze_gc_heap=freeze)
    try:
        assert llm.config.freeze_gc_heap is freeze
        assert (gc.get_freeze_count() > 1000) is freeze
        llm.generate([[1, 2, 3]], use_tqdm=False)
    finally:
        llm.close()
    assert gc.get_freeze_count() == 0
