"""Which index entries a run of batches produces, under Kafka's index.interval.bytes rule.

Append and recovery share this so that an index built while appending equals the one recovery
rebuilds from the .log: before each batch, if more than index.interval.bytes were written since
the last entry, add (batch lastOffset -> batch position) to the offset index and
(max timestamp so far -> its offset) to the time index, the latter only if the timestamp grew.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .common.jit import lazy_kernel


@dataclass
class IndexState:
    """Running state carried across appends to one segment."""

    bytes_since_last_entry: int = 0
    max_timestamp: int = -1  # largest batch maxTimestamp so far (-1: none)
    offset_of_max_timestamp: int = -1  # lastOffset of the batch that had it
    last_time_entry: int = -1  # timestamp of the time index's last entry


SMALL_PLAN = 64  # runs of up to this many batches are planned in plain Python (no numba load)


def _plan(positions, sizes, last_offsets, max_timestamps, interval, bytes_since, max_ts, max_ts_off, last_time_entry):
    """The planner: plain Python for a few batches, `_plan_kernel()` (the same code, compiled) for more."""
    n = len(positions)
    off_offsets = np.empty(n, np.int64)
    off_positions = np.empty(n, np.int64)
    t_timestamps = np.empty(n, np.int64)
    t_offsets = np.empty(n, np.int64)
    n_off = 0
    n_time = 0
    for i in range(n):
        if max_timestamps[i] > max_ts:
            max_ts = max_timestamps[i]
            max_ts_off = last_offsets[i]
        if bytes_since > interval:
            off_offsets[n_off] = last_offsets[i]
            off_positions[n_off] = positions[i]
            n_off += 1
            if max_ts > last_time_entry:
                t_timestamps[n_time] = max_ts
                t_offsets[n_time] = max_ts_off
                n_time += 1
                last_time_entry = max_ts
            bytes_since = 0
        bytes_since += sizes[i]
    return (
        off_offsets[:n_off],
        off_positions[:n_off],
        t_timestamps[:n_time],
        t_offsets[:n_time],
        bytes_since,
        max_ts,
        max_ts_off,
        last_time_entry,
    )


_plan_kernel = lazy_kernel(_plan, nogil=True)  # _plan compiled by numba (cached on disk), made on first use


@dataclass
class IndexPlan:
    offset_entries: tuple[np.ndarray, np.ndarray]  # (absolute offsets, positions)
    time_entries: tuple[np.ndarray, np.ndarray]  # (timestamps, absolute offsets)
    state: IndexState


def plan_index_entries(
    positions: np.ndarray,
    sizes: np.ndarray,
    last_offsets: np.ndarray,
    max_timestamps: np.ndarray,
    interval: int,
    state: IndexState,
) -> IndexPlan:
    """Index entries for batches at absolute `positions` in a segment, given the running state."""
    plan = _plan if len(positions) <= SMALL_PLAN else _plan_kernel()
    out = plan(
        np.ascontiguousarray(positions, np.int64),
        np.ascontiguousarray(sizes, np.int64),
        np.ascontiguousarray(last_offsets, np.int64),
        np.ascontiguousarray(max_timestamps, np.int64),
        np.int64(interval),
        np.int64(state.bytes_since_last_entry),
        np.int64(state.max_timestamp),
        np.int64(state.offset_of_max_timestamp),
        np.int64(state.last_time_entry),
    )
    return IndexPlan((out[0], out[1]), (out[2], out[3]), IndexState(int(out[4]), int(out[5]), int(out[6]), int(out[7])))
