"""Where a table stands in its topic: the next offset per partition, kept in the snapshot summary of the very
commit that added the rows below it (as Iceberg's Kafka Connect sink keeps its offsets), so rows and offsets
can never disagree.

Summary properties kafkalog writes on each commit:
- `kafkalog.next-offsets`: JSON {"<partition>": next offset} for every partition of the topic;
- `kafkalog.pass-id`: the pass that made the commit (a pass whose id is in no snapshot never committed, and
  its files are orphans);
- `kafkalog.gaps`: JSON [[partition, first, end), ...] only when the commit skipped offsets the log no
  longer held (deleted before the table had them: delete-records, or a paused table).
The offsets are read from the newest snapshot that has them (walking parents: an engine's own commit, such
as a compaction of data files, may come after ours). A table with snapshots and none of them ours is not
kafkalog's to write.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import TableConflictError

NEXT_OFFSETS = "kafkalog.next-offsets"
PASS_ID = "kafkalog.pass-id"
GAPS = "kafkalog.gaps"


@dataclass(frozen=True)
class CommittedOffsets:
    next_offsets: dict[int, int] | None  # None: nothing committed yet (a new table)
    snapshot_id: int | None  # the table's current snapshot (what the next commit must follow)


def _parse(text: str, where: str) -> dict[int, int]:
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        out = {}
        for p, o in doc.items():
            if not p.isdigit() or isinstance(o, bool) or not isinstance(o, int) or o < 0:
                raise ValueError(f"{p!r}: {o!r}")
            out[int(p)] = o
        return out
    except (ValueError, TypeError, AttributeError) as e:
        raise TableConflictError(f"{where}: {NEXT_OFFSETS} is not valid ({e}); kafkalog will not write to it") from None


def committed_offsets(table) -> CommittedOffsets:
    """The next offsets in the table's newest kafkalog snapshot, walking parents from the current one."""
    meta = table.metadata
    current = meta.current_snapshot_id
    if current is None:
        return CommittedOffsets(None, None)
    by_id = {s.snapshot_id: s for s in meta.snapshots}
    sid: int | None = current
    while sid is not None:
        snap = by_id.get(sid)
        if snap is None:
            break  # expired history: no kafkalog snapshot within what is kept
        summary = snap.summary.additional_properties if snap.summary is not None else {}
        if NEXT_OFFSETS in summary:
            return CommittedOffsets(
                _parse(summary[NEXT_OFFSETS], f"table {'.'.join(table.name())} snapshot {sid}"), current
            )
        sid = snap.parent_snapshot_id
    raise TableConflictError(
        f"table {'.'.join(table.name())} has snapshots but none of kafkalog's ({NEXT_OFFSETS} in its summary): "
        f"someone else wrote it; kafkalog will not write to it"
    )


def pass_committed(table, pass_id: str) -> bool:
    """Whether any snapshot the table keeps was made by this pass."""
    for s in table.metadata.snapshots:
        if s.summary is not None and s.summary.additional_properties.get(PASS_ID) == pass_id:
            return True
    return False


def summary_properties(next_offsets: dict[int, int], pass_id: str, gaps: list[tuple[int, int, int]]) -> dict[str, str]:
    props = {
        NEXT_OFFSETS: json.dumps({str(p): o for p, o in sorted(next_offsets.items())}, separators=(",", ":")),
        PASS_ID: pass_id,
    }
    if gaps:
        props[GAPS] = json.dumps([list(g) for g in gaps], separators=(",", ":"))
    return props
