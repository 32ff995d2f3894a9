"""Testing helpers: a fake clock and a fixed entropy source, so a run through
the any-call helper (or a wrapper given `clock=`) replays exactly.

    clock = FakeClock(1_700_000_000_000)
    value = await call_with_policy(run, "get_quote", fetch, clock=clock, entropy=fixed_entropy(7))
    assert clock.sleeps_ms == [412, 1000]
"""

from __future__ import annotations

import asyncio

from .entropy import SplitMix64


class FakeClock:
    """A clock whose time moves only when slept on: `now_ms()` is the time,
    `await sleep(s)` advances it by `s` seconds at once (yielding to the event
    loop once) and records the sleep (`sleeps_ms`)."""

    def __init__(self, start_ms: int = 0) -> None:
        if isinstance(start_ms, bool) or not isinstance(start_ms, int) or start_ms < 0:
            raise ValueError(f"start_ms must be a non-negative integer, got {start_ms!r}")
        self._now_ms = start_ms
        self.sleeps_ms: list[int] = []

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, ms: int) -> None:
        """Moves the time on by `ms` without a sleep (time spent elsewhere)."""
        if ms < 0:
            raise ValueError("a clock does not go back")
        self._now_ms += ms

    async def sleep(self, seconds: float) -> None:
        ms = max(0, round(seconds * 1000))
        self.sleeps_ms.append(ms)
        self._now_ms += ms
        await asyncio.sleep(0)


def fixed_entropy(seed: int) -> SplitMix64:
    """The entropy of a replayable run: SplitMix64 from `seed`, the same
    sequence in every host."""
    return SplitMix64(seed)


__all__ = ["FakeClock", "fixed_entropy"]
