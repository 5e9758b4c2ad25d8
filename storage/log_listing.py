"""LogListing: what a pass read from the log dirs (listings, lookups, topic and checkpoint files), reused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .fs.filesystem import LogFileSystem


class LogListing:
    """The reads of a LogManager's log dirs, kept for the length of one snapshot (LogManager.snapshot()),
    so that a pass over N partitions costs O(N) reads, not O(N) per partition.

    Invariants:
    - Outside a snapshot nothing is kept: every question is answered by a fresh read.
    - Inside one, each key (a log dir's listing, a name's presence, a topic or checkpoint file) is loaded
      at most once, until forget(); whoever changes the log dirs calls forget() before and after.
    - Whether a log dir holds a name is answered from the log dir's listing once that was read, else by
      one lookup of that name, remembered: a pass over a few topics does not list everything under ROOT.
    - Recovery points deferred inside a snapshot are handed back, once, by close(), to be written then.
    """

    def __init__(self, fs: LogFileSystem, log_dirs: list[str]):
        self.fs, self.log_dirs = fs, log_dirs
        self._memo: dict | None = None  # inside a snapshot: what was read, by key
        self._deferred: dict[str, dict] = {}  # inside a snapshot: log dir -> {(topic, partition): recovery point}

    @property
    def active(self) -> bool:
        """Inside a snapshot."""
        return self._memo is not None

    def open(self) -> None:
        """Begin a snapshot: from now on reads are kept."""
        self._memo, self._deferred = {}, {}

    def close(self) -> dict[str, dict]:
        """End the snapshot: forget every read; returns the deferred recovery points, by log dir."""
        deferred, self._memo, self._deferred = self._deferred, None, {}
        return deferred

    def forget(self) -> None:
        """A change was made: what was read so far may be stale (a no-op outside a snapshot)."""
        if self._memo is not None:
            self._memo.clear()

    def memoized(self, key, load: Callable[[], Any]) -> Any:
        """load(), or inside a snapshot what it returned the first time for `key`."""
        if self._memo is None:
            return load()
        if key not in self._memo:
            self._memo[key] = load()
        return self._memo[key]

    def listing(self, log_dir: str) -> list:
        """A log dir's entries ([] when it does not exist)."""

        def load():
            try:
                return self.fs.listdir(log_dir)
            except FileNotFoundError:
                return []

        return self.memoized(("listdir", log_dir), load)

    def has(self, log_dir: str, name: str, is_dir: bool) -> bool:
        """Whether a log dir holds a file (or directory) `name`."""
        path = self.fs.join(log_dir, name)
        if self._memo is None:
            self._list_log_dirs()
            return self.fs.isdir(path) if is_dir else self.fs.exists(path)
        if ("listdir", log_dir) in self._memo:
            return name in self._names(log_dir, is_dir)
        key = ("has", path, is_dir)
        if key not in self._memo:
            self._list_log_dirs()
            self._memo[key] = self.fs.isdir(path) if is_dir else self.fs.exists(path)
        return self._memo[key]

    def _names(self, log_dir: str, dirs: bool) -> frozenset:
        """Names of the directories (dirs) or files in a log dir's listing."""
        return self.memoized(
            ("names", log_dir, dirs), lambda: frozenset(f.name for f in self.listing(log_dir) if f.is_dir == dirs)
        )

    def _list_log_dirs(self) -> None:
        """On a store that caches listings (object stores), list each log dir once, so that the lookups of
        topic files, partition directories and checkpoint files that follow are answered from that listing
        instead of a HEAD (and, for a missing name, a LIST) each. Elsewhere a no-op: a local lookup is cheap."""
        if self.fs.capabilities.cached_listings:
            for d in self.log_dirs:
                self.fs.listdir(d)

    def defer_recovery_point(self, log_dir: str, key: tuple[str, int], offset: int) -> None:
        """Inside a snapshot: a writer's recovery point (a hint, never fsynced), written when it ends."""
        self._deferred.setdefault(log_dir, {})[key] = offset

    def deferred_recovery_point(self, log_dir: str, key: tuple[str, int]) -> int | None:
        return self._deferred.get(log_dir, {}).get(key)
