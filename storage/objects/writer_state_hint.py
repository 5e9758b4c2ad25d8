"""The object-store writer state's hint: `kafkalog-producer-state.json` in a partition of immutable segments.

{"version": 3, "asOf": offset, "writers": {id: [batch id, base offset]}, "segments": {base: [size, max
timestamp]}}; version 2 (no segments) is still read. It is a cache of what the segment objects below asOf
hold, last writer wins: a damaged or unreadable hint is logged and ignored (the segments are read instead).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from ..fs.filesystem import LogFileSystem
from ..transactions.writer_state import STATE_FILE, read_bounded
from .segment_metadata import SegmentMetadata, parse_segments

logger = logging.getLogger(__name__)

HINT_VERSION = 3
READABLE_HINT_VERSIONS = (2, 3)


@dataclass
class WriterStateHint:
    """The object-store flavour's state file: a cache of what the segments below as_of hold."""

    as_of: int
    writers: dict[int, tuple[int, int]]  # writer id -> (last committed batch id, its segment's base offset)
    segments: dict[int, SegmentMetadata]  # base offset -> size and largest timestamp


def read_hint(fs: LogFileSystem, dir: str) -> WriterStateHint | None:
    """The partition's hint, or None when there is none or it is unreadable (logged: it is only a hint)."""
    path = fs.join(dir, STATE_FILE)
    try:
        raw = read_bounded(fs, path) if fs.exists(path) else None
    except FileNotFoundError:
        raw = None
    except ValueError as e:
        logger.warning("ignoring writer state hint %s (%s); reading the segments instead", fs.url(path), e)
        return None
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        if doc.get("version") not in READABLE_HINT_VERSIONS:
            raise ValueError(f"version {doc.get('version')!r}, expected one of {READABLE_HINT_VERSIONS}")
        return WriterStateHint(
            int(doc["asOf"]),
            {int(w): (int(e[0]), int(e[1])) for w, e in doc["writers"].items()},
            parse_segments(doc.get("segments")),
        )
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        logger.warning("ignoring writer state hint %s (%s); reading the segments instead", fs.url(path), e)
        return None
