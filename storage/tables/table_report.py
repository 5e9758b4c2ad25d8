"""TableReport: what one materialization pass did to one topic's table (plain values: no Iceberg import, so
the maintenance job reports a missing extra with it too)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TableReport:
    """What one pass did to one topic's table."""

    topic: str
    table: str = ""
    mode: str = ""
    rows: int = 0
    rows_deleted: int = 0  # upsert: rows replaced or deleted
    error_rows: int = 0
    files_added: int = 0
    files_removed: int = 0
    offsets_behind: int = 0  # after the pass: the log end offsets less the table's, summed over partitions
    gaps: list = field(default_factory=list)  # (partition, first, end) skipped: gone from the log
    metadata_location: str = ""
    committed: bool = False
    orphans_removed: int = 0
    note: str = ""
    error: str | None = None
    duration_s: float = 0.0

    def line(self) -> str:
        if self.error:
            return f"table of {self.topic}: FAILED: {self.error}"
        what = [f"{self.rows} row(s) added"]
        if self.mode == "upsert":
            what.append(f"{self.rows_deleted} replaced or deleted")
        if self.error_rows:
            what.append(f"{self.error_rows} value(s) that did not parse (errors table)")
        for p, a, b in self.gaps:
            what.append(f"GAP: partition {p} offsets {a}..{b - 1} were deleted from the log before the table had them")
        if self.orphans_removed:
            what.append(f"{self.orphans_removed} file(s) of an interrupted pass removed")
        what.append(f"{self.offsets_behind} offset(s) behind the log end")
        state = "committed" if self.committed else (self.note or "nothing new")
        return (
            f"table {self.table} ({self.mode}) of {self.topic}: {state}; "
            + ", ".join(what)
            + f" ({self.duration_s:.2f}s)"
        )
