"""Throttler: hold an I/O loop to a byte rate by sleeping (Kafka's kafka.utils.Throttler).

The log cleaner reports every chunk it reads or writes; once per check interval the observed rate
is compared with log.cleaner.io.max.bytes.per.second and, when above it, the caller sleeps for as
long as the bytes should have taken. The clock and sleep are injectable so tests need no real time.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

from ..errors import InvalidConfigError

UNLIMITED = sys.float_info.max  # Kafka's default for log.cleaner.io.max.bytes.per.second (Double.MaxValue)
DEFAULT_CHECK_INTERVAL_MS = 300  # what Kafka's cleaner passes


class Throttler:
    """maybe_throttle(n) after each n bytes of I/O; sleeps when the rate over the last interval is too high."""

    def __init__(
        self,
        desired_rate_per_sec: float = UNLIMITED,
        *,
        check_interval_ms: int = DEFAULT_CHECK_INTERVAL_MS,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if not desired_rate_per_sec > 0:
            raise InvalidConfigError(
                f"log.cleaner.io.max.bytes.per.second must be positive, got {desired_rate_per_sec!r}"
            )
        if check_interval_ms < 0:
            raise InvalidConfigError(f"throttler check interval must be >= 0 ms, got {check_interval_ms}")
        self.desired_rate_per_sec = float(desired_rate_per_sec)
        self.check_interval_ns = int(check_interval_ms) * 1_000_000
        self._clock_ns = clock_ns
        self._sleep = sleep
        self._lock = threading.Lock()
        self._period_start_ns = 0 if self.unlimited else clock_ns()
        self._observed = 0.0
        self.slept_seconds = 0.0  # total, for stats

    @property
    def unlimited(self) -> bool:
        return self.desired_rate_per_sec >= UNLIMITED

    def maybe_throttle(self, observed: float) -> float:
        """Count `observed` bytes; sleep if the rate since the period began exceeds the limit.
        Returns the seconds slept (0.0 mostly)."""
        if self.unlimited:
            return 0.0
        with self._lock:
            self._observed += observed
            now = self._clock_ns()
            elapsed_ns = now - self._period_start_ns
            if elapsed_ns <= self.check_interval_ns or self._observed <= 0:
                return 0.0
            slept = 0.0
            rate = self._observed * 1e9 / elapsed_ns if elapsed_ns > 0 else float("inf")
            if rate > self.desired_rate_per_sec:
                # how long the observed bytes should have taken, minus the time they did take
                wanted_ms = self._observed / (self.desired_rate_per_sec / 1000.0)
                sleep_ms = round(wanted_ms - elapsed_ns // 1_000_000)
                if sleep_ms > 0:
                    slept = sleep_ms / 1000.0
                    self._sleep(slept)
                    self.slept_seconds += slept
            self._period_start_ns = self._clock_ns()
            self._observed = 0.0
            return slept
