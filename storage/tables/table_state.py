"""TableState: ROOT's own record of a topic's Iceberg table, `<first log dir>/.kafkalog-tables/<topic>.json`.

The table is the truth: its snapshot summaries hold the next offset per partition (table_offsets.py). This
file is a hint written after each commit, so it is never ahead of the table; it lets what must not wait on
a catalog read it: retention and the cleaner (which keep every offset the table does not hold yet, as tiered
storage keeps a segment until it is copied), `describe` (each table's lag) and the check that refuses a
table config change. It also names the passes under way (with when each began), so that a later pass removes
the files of one that never committed, once it is older than ORPHAN_MIN_AGE_MS: a pass may still be running
beside this one, and its files must stay until it commits or is certainly dead.

File: JSON `{"version": 1, "topic", "topicId", "table", "catalog", "tableUuid", "shape": {table.* configs},
"metadataLocation", "nextOffsets": {"<partition>": offset}, "maxTimestamps": {"<partition>": ms},
"committedAtMs", "gaps": [[partition, first, end), ...], "pending": {"<pass id>": started at ms}}`.
It is checked before it is used (size, types, offsets >= 0); one that fails is reported and holds retention
where it is (nothing past the log start is deleted for that topic) until a pass rewrites it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace

from ..errors import TableError
from ..log_config import LogConfig

TABLES_DIR = ".kafkalog-tables"  # under the first log dir; no topic-partition name, Kafka skips it
STATE_SUFFIX = ".json"
MAX_STATE_BYTES = 1 << 20
MAX_GAPS_KEPT = 100  # the newest gaps; every gap is also in its commit's snapshot summary
MAX_PENDING_KEPT = 100  # passes under way or dead and not yet cleaned up after; the oldest are forgotten
#: A pass that has not committed this long after it began is dead: its files are orphans (Iceberg's own orphan
#: removal waits 3 days by default; a pass takes seconds to minutes).
ORPHAN_MIN_AGE_MS = 24 * 3600 * 1000


def state_file_name(topic: str) -> str:
    """`<topic>.json`, or for a long topic a shortened, hashed name (with its temp suffix it fits 255 bytes)."""
    if len(topic) <= 200:
        return topic + STATE_SUFFIX
    return f"{topic[:180]}~{hashlib.sha256(topic.encode()).hexdigest()[:16]}{STATE_SUFFIX}"


@dataclass(frozen=True)
class TableState:
    topic: str
    topic_id: str | None
    table: str  # namespace.name
    catalog: str
    table_uuid: str
    shape: dict
    metadata_location: str = ""
    next_offsets: dict[int, int] = field(default_factory=dict)
    max_timestamps: dict[int, int] = field(default_factory=dict)
    committed_at_ms: int = -1
    gaps: tuple[tuple[int, int, int], ...] = ()
    pending: dict[str, int] = field(default_factory=dict)  # pass id -> started at (ms): not committed (yet)

    def to_bytes(self) -> bytes:
        doc = {
            "version": 1,
            "topic": self.topic,
            "topicId": self.topic_id,
            "table": self.table,
            "catalog": self.catalog,
            "tableUuid": self.table_uuid,
            "shape": self.shape,
            "metadataLocation": self.metadata_location,
            "nextOffsets": {str(p): o for p, o in sorted(self.next_offsets.items())},
            "maxTimestamps": {str(p): t for p, t in sorted(self.max_timestamps.items())},
            "committedAtMs": self.committed_at_ms,
            "gaps": [list(g) for g in self.gaps[-MAX_GAPS_KEPT:]],
            "pending": dict(sorted(self.pending.items(), key=lambda kv: kv[1])[-MAX_PENDING_KEPT:]),
        }
        return json.dumps(doc, indent=1, sort_keys=True).encode() + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes, topic: str) -> TableState:
        """Parse and check; ValueError naming what is wrong."""
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("version") != 1:
            raise ValueError("not a version 1 table state")
        if doc.get("topic") != topic:
            raise ValueError(f"it names topic {doc.get('topic')!r}, not {topic!r}")
        for key in ("table", "catalog", "tableUuid", "metadataLocation"):
            if not isinstance(doc.get(key), str):
                raise ValueError(f"{key!r} must be a string")
        if not isinstance(doc.get("shape"), dict) or not all(isinstance(v, str) for v in doc["shape"].values()):
            raise ValueError("'shape' must be an object of strings")
        pending = doc.get("pending") or {}
        if not isinstance(pending, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in pending.items()
        ):
            raise ValueError("'pending' must map pass ids to start times")
        gaps = doc.get("gaps", [])
        if not isinstance(gaps, list) or not all(
            isinstance(g, list) and len(g) == 3 and all(_is_offset(x) for x in g) for g in gaps
        ):
            raise ValueError("'gaps' must be a list of [partition, first, end]")
        return cls(
            topic,
            doc.get("topicId") if isinstance(doc.get("topicId"), str) else None,
            doc["table"],
            doc["catalog"],
            doc["tableUuid"],
            dict(doc["shape"]),
            doc["metadataLocation"],
            _offsets(doc.get("nextOffsets"), "nextOffsets", allow_negative=False),
            _offsets(doc.get("maxTimestamps", {}), "maxTimestamps", allow_negative=True),
            int(doc.get("committedAtMs", -1)) if isinstance(doc.get("committedAtMs", -1), int) else -1,
            tuple((g[0], g[1], g[2]) for g in gaps),
            pending,
        )

    def begun(self, pass_id: str, now_ms: int) -> TableState:
        return replace(self, pending={**self.pending, pass_id: now_ms})

    def ended(self, pass_id: str, **changes) -> TableState:
        """This state once a pass ended (committed, refused or cleaned up after): it is no longer pending; with
        a commit, its offsets and timestamps (merged: a state written by another pass meanwhile never goes back)."""
        nxt = dict(self.next_offsets)
        for p, o in changes.pop("next_offsets", {}).items():
            nxt[p] = max(nxt.get(p, 0), o)
        ts = dict(self.max_timestamps)
        for p, t in changes.pop("max_timestamps", {}).items():
            ts[p] = max(ts.get(p, -1), t)
        pending = {k: v for k, v in self.pending.items() if k != pass_id}
        return replace(self, pending=pending, next_offsets=nxt, max_timestamps=ts, **changes)


def _is_offset(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _offsets(doc, key: str, *, allow_negative: bool) -> dict[int, int]:
    if not isinstance(doc, dict):
        raise ValueError(f"{key!r} must be an object")
    out = {}
    for p, o in doc.items():
        if not (isinstance(p, str) and p.isdigit()) or isinstance(o, bool) or not isinstance(o, int):
            raise ValueError(f"{key!r}: {p!r}: {o!r} is not partition: integer")
        if not allow_negative and o < 0:
            raise ValueError(f"{key!r}: partition {p} has a negative offset {o}")
        out[int(p)] = o
    return out


def state_path(fs, log_dir: str, topic: str) -> str:
    return fs.join(log_dir, TABLES_DIR, state_file_name(topic))


def read_state(fs, log_dir: str, topic: str) -> TableState | None:
    """The topic's table state, None when it has none; TableError when the file does not check."""
    path = state_path(fs, log_dir, topic)
    try:
        data = fs.read(path, 0, MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return None
    try:
        if len(data) > MAX_STATE_BYTES:
            raise ValueError(f"larger than {MAX_STATE_BYTES} bytes")
        return TableState.from_bytes(data, topic)
    except (ValueError, TypeError, KeyError) as e:
        raise TableError(f"table state {fs.url(path)} is not valid: {e}") from None


def write_state(fs, log_dir: str, state: TableState) -> None:
    fs.mkdirs(fs.join(log_dir, TABLES_DIR))
    fs.write_atomic(state_path(fs, log_dir, state.topic), state.to_bytes())


def update_state(fs, log_dir: str, initial: TableState, change) -> TableState:
    """Read the state now (another pass may have written it since), apply change(state) and write it; with
    no state yet, `initial` is changed. Not atomic across processes: a lost update loses a hint only (offsets
    behind the table, or a pending pass whose orphans stay), never puts the state ahead of the table."""
    try:
        current = read_state(fs, log_dir, initial.topic) or initial
    except TableError:
        current = initial
    new = change(current)
    write_state(fs, log_dir, new)
    return new


def forget_state(fs, log_dir: str, topic: str) -> bool:
    """Remove the topic's table state (`kafkalog table --forget`); whether there was one."""
    path = state_path(fs, log_dir, topic)
    if not fs.exists(path):
        return False
    fs.delete(path)
    return True


def retention_hold(fs, log_dir: str, topic: str, partition: int, config: LogConfig) -> int | None:
    """The offset below which retention and the cleaner may act on this partition, or None (no table).

    A table holds everything it has not committed yet: with no state (no pass committed), or one that does
    not check, nothing is released; otherwise the table's next offset for the partition. table.mode=off
    (no table, or a paused one) holds nothing."""
    if config.table_mode == "off":
        return None
    try:
        state = read_state(fs, log_dir, topic)
    except TableError:
        return 0
    if state is None:
        return 0
    return state.next_offsets.get(partition, 0)
