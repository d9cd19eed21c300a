"""Programmatic dependent launch is on only where asked for and where the device has it, and
the kernels' launch options follow it."""

from __future__ import annotations

import pytest

from engine.model.kernels import launch


@pytest.fixture(autouse=True)
def restore_launch_mode():
    before = launch.programmatic_launch()
    yield
    launch.set_programmatic_launch(before, (9, 0))


@pytest.mark.parametrize(
    "enabled,capability,expected",
    [(True, (9, 0), True), (True, (10, 0), True), (True, (8, 0), False), (True, None, False),
     (False, (9, 0), False)],
)
def test_on_only_when_asked_and_on_hopper_or_later(enabled, capability, expected) -> None:
    assert launch.set_programmatic_launch(enabled, capability) is expected
    assert launch.programmatic_launch() is expected


def test_launch_options_follow_the_mode() -> None:
    """Off: the kernels' USE_GDC is false and Triton gets no launch_pdl (the interpreter and
    older GPUs take no such option); on: both."""
    launch.set_programmatic_launch(False, (9, 0))
    assert launch.pdl_options() == {"USE_GDC": False}
    launch.set_programmatic_launch(True, (9, 0))
    assert launch.pdl_options() == {"USE_GDC": True, "launch_pdl": True}
