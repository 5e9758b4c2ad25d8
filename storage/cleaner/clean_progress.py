"""How far one cleaning (cleaner.Cleaner.clean) is, for a progress bar: its three reads, weighed by the bytes
planned for each when the cleaning begins, reported chunk by chunk and only ever growing."""

from __future__ import annotations

from collections.abc import Callable

#: A cleaning's progress: called with (bytes done, bytes total) of its reads, see Meter.
CleanProgress = Callable[[int, int], None]


class Meter:
    """How far one cleaning is, for a CleanProgress: its three reads, each weighted by the bytes planned for it
    when the cleaning begins: the dirty range for the key count, again for the offset map, then the segments
    rewritten. Moved per chunk read (never per record); a read that ends short of its plan (the count stops once
    past the map's room, a full map leaves fewer segments to rewrite, a segment re-read into a new output)
    jumps to its end or stalls, so `done` only grows, and the cleaning ends at (total, total)."""

    KEYS, MAP, REWRITE = 0, 1, 2

    def __init__(self, report: CleanProgress | None, dirty_bytes: int = 0, rewrite_bytes: int = 0):
        self.report = report
        self.plan = (dirty_bytes, dirty_bytes, rewrite_bytes)
        self.total = sum(self.plan)
        self.base = self.size = self.actual = self.read = 0  # the read under way: where it starts, plan, bytes
        self.done = -1  # last reported

    def begin(self, phase: int, actual: int | None = None) -> None:
        """Start a read; `actual`: the bytes it will read, when fewer than planned (its share stays the plan's)."""
        if self.report is None:
            return
        self.base, self.size = sum(self.plan[:phase]), self.plan[phase]
        self.actual = self.size if actual is None else actual
        self.read = 0
        self._report(self.base)

    def add(self, n: int) -> None:
        """n more bytes read (a chunk)."""
        if self.report is None:
            return
        self.read += n
        self._report(self.base + self.size * min(self.read, self.actual) // max(1, self.actual))

    def rewind(self, read: int) -> None:
        """Back to `read` bytes of the read under way (a source read again): the fraction stalls, never drops."""
        self.read = read

    def end(self) -> None:
        if self.report is not None:
            self._report(self.total)

    def _report(self, done: int) -> None:
        if self.report is not None and done > self.done:
            self.done = done
            self.report(done, self.total)


NO_METER = Meter(None)
