"""Kafka's Time: the system clock, and the MockTime tests move by hand."""

import time

import pytest

from storage.common.time import SYSTEM_TIME, MockTime, SystemTime, Time


def test_system_time_reads_the_wall_clock_in_ms_and_a_monotonic_clock_in_ns():
    assert isinstance(SYSTEM_TIME, SystemTime) and isinstance(SYSTEM_TIME, Time)
    before = int(time.time() * 1000)
    now = SYSTEM_TIME.milliseconds()
    assert before - 1 <= now <= int(time.time() * 1000) + 1
    a = SYSTEM_TIME.nanoseconds()
    SYSTEM_TIME.sleep(2)
    b = SYSTEM_TIME.nanoseconds()
    assert b - a >= 1_000_000 and SYSTEM_TIME.hi_res_clock_ms() >= b // 1_000_000


def test_mock_time_moves_only_when_told_and_both_clocks_together():
    clock = MockTime(1_000)
    assert clock.milliseconds() == clock.milliseconds() == 1_000 and clock.nanoseconds() == 0
    clock.sleep(250)
    assert clock.milliseconds() == 1_250 and clock.nanoseconds() == 250_000_000 and clock.hi_res_clock_ms() == 250
    clock.set_current_time_ms(2_000)
    assert clock.milliseconds() == 2_000 and clock.hi_res_clock_ms() == 1_000
    with pytest.raises(ValueError, match="back"):
        clock.set_current_time_ms(1_999)


def test_mock_time_auto_tick_advances_on_every_read():
    clock = MockTime(0, auto_tick_ms=5)
    assert [clock.milliseconds() for _ in range(3)] == [5, 10, 15]
    assert clock.nanoseconds() == 20_000_000
