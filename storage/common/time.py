"""Kafka's Time (org.apache.kafka.common.utils.Time): the one clock the engine reads.

milliseconds() is wall-clock time in ms since the epoch, what record timestamps, retention, segment
rolling and leases compare against; nanoseconds() is a monotonic clock for durations and deadlines,
never comparable with the wall clock. Code reads SYSTEM_TIME, or the `time` an object was given, so a
test can pass a MockTime and move it by hand instead of sleeping.
"""

from __future__ import annotations

import time as _time
from abc import ABC, abstractmethod


class Time(ABC):
    """A clock: wall-clock milliseconds, monotonic nanoseconds, and a sleep on the same clock."""

    @abstractmethod
    def milliseconds(self) -> int:
        """Wall-clock milliseconds since the epoch."""

    @abstractmethod
    def nanoseconds(self) -> int:
        """Monotonic nanoseconds, for durations only."""

    @abstractmethod
    def sleep(self, ms: int) -> None:
        """Wait ms milliseconds on this clock (a MockTime just moves)."""

    def hi_res_clock_ms(self) -> int:
        """Monotonic milliseconds (Kafka's hiResClockMs), for measuring how long something took."""
        return self.nanoseconds() // 1_000_000


class SystemTime(Time):
    """The machine's clocks: time.time_ns() for milliseconds, time.monotonic_ns() for nanoseconds."""

    def milliseconds(self) -> int:
        return _time.time_ns() // 1_000_000

    def nanoseconds(self) -> int:
        return _time.monotonic_ns()

    def sleep(self, ms: int) -> None:
        _time.sleep(ms / 1000)


SYSTEM_TIME = SystemTime()


class MockTime(Time):
    """A clock for tests that moves only when told to: sleep(ms) and set_current_time_ms(ms) advance it,
    and every milliseconds() read advances it by auto_tick_ms (0: it stands still). Both of its clocks
    move together, as in Kafka's MockTime."""

    def __init__(self, current_time_ms: int = 0, *, auto_tick_ms: int = 0, current_high_res_time_ns: int = 0):
        self._ms = int(current_time_ms)
        self._ns = int(current_high_res_time_ns)
        self.auto_tick_ms = int(auto_tick_ms)

    def milliseconds(self) -> int:
        self.sleep(self.auto_tick_ms)
        return self._ms

    def nanoseconds(self) -> int:
        self.sleep(self.auto_tick_ms)
        return self._ns

    def sleep(self, ms: int) -> None:
        self._ms += int(ms)
        self._ns += int(ms) * 1_000_000

    def set_current_time_ms(self, ms: int) -> None:
        """Move the clock to `ms` (never back: a clock that runs backwards is not one Kafka's code expects)."""
        if ms < self._ms:
            raise ValueError(f"setting the clock back from {self._ms} to {ms} ms")
        self.sleep(ms - self._ms)
