"""The open loop's wait for an arrival never returns early, on uvloop (whose timers keep
whole milliseconds and can fire before they are due) as on asyncio."""

from __future__ import annotations

import time

from replay.loadgen.client import monotonic_clock
from replay.loadgen.runner import run_loop, sleep_until


def test_sleep_until_never_returns_before_its_target() -> None:
    clock = monotonic_clock(time.perf_counter())

    async def waits() -> list[float]:
        lateness = []
        for k in range(40):
            # Targets off the millisecond grid, where a rounded timer fires early.
            target = clock() + 0.0013 + 0.00037 * k
            await sleep_until(target, clock)
            lateness.append(clock() - target)
        return lateness

    lateness = run_loop(waits())
    assert min(lateness) >= 0.0
    # It does not oversleep by much either: a waiter that returns late delays every send.
    assert sorted(lateness)[len(lateness) // 2] < 0.005
