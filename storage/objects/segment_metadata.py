"""Per-segment metadata an object-store partition keeps in its hint object, so that a lookup by time
reads one small object instead of one `.timeindex` tail per segment it passes over.

Tiered storage's RemoteLogSegmentMetadata does the same for remote segments (it keeps maxTimestampMs
per segment). Here the entries are base offset -> (object size, largest record timestamp); an entry
counts only while a segment object with that base offset has that size (a merge or compaction that
rewrites the segment changes its size: dropping a record shrinks it, merging grows it). Entries are
a cache: a missing, stale or unreadable one costs one 12-byte read of that segment's `.timeindex`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SegmentMetadata:
    size: int  # bytes of the segment object the entry was taken from
    max_timestamp: int  # largest record timestamp in it (-1 if none)


def parse_segments(raw) -> dict[int, SegmentMetadata]:
    """The `segments` member of a hint document ({"<base>": [size, max timestamp]}); raises
    ValueError/TypeError/IndexError on a malformed one."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise TypeError(f"segments is a {type(raw).__name__}, not an object")
    out = {}
    for base, entry in raw.items():
        size, ts = int(entry[0]), int(entry[1])
        if size <= 0 or ts < -1:
            raise ValueError(f"segment {base}: size {size} and timestamp {ts} are impossible")
        out[int(base)] = SegmentMetadata(size, ts)
    return out


def segments_doc(entries: dict[int, SegmentMetadata]) -> dict[str, list[int]]:
    return {str(b): [m.size, m.max_timestamp] for b, m in sorted(entries.items())}


def known_max_timestamp(seg, entries: dict[int, SegmentMetadata]) -> int | None:
    """The segment's largest timestamp from `entries` if they hold it for this very object, else None."""
    m = entries.get(seg.base_offset)
    return m.max_timestamp if m is not None and m.size == seg.size else None


def largest_timestamp(seg, entries: dict[int, SegmentMetadata]) -> int:
    """The segment's largest record timestamp: from the entries, or read from its `.timeindex`."""
    ts = known_max_timestamp(seg, entries)
    return seg.largest_timestamp if ts is None else ts


def collect(segments, entries: dict[int, SegmentMetadata]) -> dict[int, SegmentMetadata]:
    """Entries for every non-empty segment in `segments` (a Log's, in order): the valid known ones,
    the rest read from their `.timeindex` tails. Entries of segments no longer listed are dropped."""
    out = {}
    for seg in segments:
        if seg.size:
            out[seg.base_offset] = SegmentMetadata(seg.size, largest_timestamp(seg, entries))
    return out
