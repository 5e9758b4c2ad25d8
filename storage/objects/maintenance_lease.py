"""The maintenance lease: one maintenance job per log dir at a time where there are no locks (object stores).

A lease is a small JSON object `ROOT/kafkalog-maintenance-lease/<generation>.json` (holder, expiry),
made with a create-only write. The highest generation is the current lease. A job takes it over
only when it has expired (by the taker's clock), by creating the next generation: of two jobs trying,
one create wins. The holder renews it by creating the next generation itself, and re-checks it (one
LIST) before every commit point, so a job that lost its lease stops before it changes anything more.

Leases without fencing cannot stop a holder that pauses longer than the TTL between a check and its
next write; the TTL (default 10 minutes) must exceed such pauses. Every swap step is idempotent and a
second job rolls its own swap back when it sees another one (storage/segment_swap.py), so even then
no committed record is lost.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid

from ..common.time import SYSTEM_TIME
from ..errors import KafkaStorageError, MaintenanceLeaseError
from ..fs.filesystem import LogFileSystem

LEASE_DIR = "kafkalog-maintenance-lease"
DEFAULT_LEASE_TTL_MS = 600_000
MAX_LEASE_BYTES = 4096


class MaintenanceLease:
    """The lease on one log dir. acquire() / renew() / check() / release(); keep_alive() renews in a thread."""

    def __init__(
        self,
        fs: LogFileSystem,
        root: str,
        *,
        holder: str | None = None,
        ttl_ms: int = DEFAULT_LEASE_TTL_MS,
        clock=SYSTEM_TIME.milliseconds,
    ):
        self.fs, self.root, self.ttl_ms, self.clock = fs, root, int(ttl_ms), clock
        self.dir = fs.join(root, LEASE_DIR)
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.generation: int | None = None
        self.expires_ms = 0

    def _current(self) -> tuple[int, dict | None]:
        """(highest generation, its document) from a fresh LIST; (0, None) when there is none."""
        self.fs.invalidate_listings(self.dir)
        gens = sorted(
            int(f.name[:-5])
            for f in self.fs.listdir(self.dir)
            if not f.is_dir and f.name.endswith(".json") and f.name[:-5].isdigit()
        )
        if not gens:
            return 0, None
        path = self._path(gens[-1])
        try:
            raw = self.fs.read(path, 0, MAX_LEASE_BYTES)
            doc = json.loads(raw)
            doc = {"holder": str(doc["holder"]), "expiresMs": int(doc["expiresMs"])}
        except FileNotFoundError:  # released meanwhile
            return gens[-1], {"holder": "", "expiresMs": 0}
        except (ValueError, KeyError, TypeError):
            doc = {"holder": f"(unreadable lease {self.fs.url(path)})", "expiresMs": 0}
        return gens[-1], doc

    def _path(self, gen: int) -> str:
        return self.fs.join(self.dir, f"{gen:020d}.json")

    def _take(self, gen: int) -> bool:
        now = self.clock()
        body = json.dumps(
            {"holder": self.holder, "acquiredMs": now, "expiresMs": now + self.ttl_ms, "generation": gen}
        ).encode()
        if not self.fs.create_exclusive(self._path(gen), body):
            return False
        self.generation, self.expires_ms = gen, now + self.ttl_ms
        for g in range(max(1, gen - 3), gen):  # earlier generations (best effort)
            try:
                self.fs.delete(self._path(g))
            except (KafkaStorageError, OSError):
                pass
        return True

    def _busy(self, doc: dict) -> MaintenanceLeaseError:
        return MaintenanceLeaseError(
            f"another maintenance job holds {self.fs.url(self.dir)}: {doc['holder']} until "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(doc['expiresMs'] / 1000))} UTC (lease TTL "
            f"{self.ttl_ms} ms); on object stores only one maintenance job may run per log dir"
        )

    def acquire(self) -> MaintenanceLease:
        gen, doc = self._current()
        if doc is not None and doc["holder"] != self.holder and self.clock() < doc["expiresMs"]:
            raise self._busy(doc)
        if not self._take(gen + 1):
            _, doc = self._current()
            raise self._busy(doc or {"holder": "(unknown)", "expiresMs": 0})
        return self

    def check(self) -> None:
        """Raise MaintenanceLeaseError unless this job still holds the lease (one LIST, one small GET)."""
        if self.generation is None:
            raise MaintenanceLeaseError(f"{self.fs.url(self.dir)}: the maintenance lease was not acquired")
        gen, doc = self._current()
        if doc is None or doc["holder"] != self.holder:
            raise MaintenanceLeaseError(
                f"lost the maintenance lease of {self.fs.url(self.dir)} to "
                f"{(doc or {}).get('holder') or '(nobody)'}; stopping"
            )
        self.generation = gen  # renewed by the driver, for a task's copy
        self.expires_ms = doc["expiresMs"]
        if self.clock() >= self.expires_ms:
            raise MaintenanceLeaseError(
                f"the maintenance lease of {self.fs.url(self.dir)} expired (TTL {self.ttl_ms} ms); stopping"
            )

    def renew(self) -> None:
        self.check()
        assert self.generation is not None  # check() raised otherwise
        if not self._take(self.generation + 1):
            _, doc = self._current()
            raise MaintenanceLeaseError(
                f"lost the maintenance lease of {self.fs.url(self.dir)} to {(doc or {}).get('holder', '(nobody)')}"
            )

    def release(self) -> None:
        if self.generation is not None:
            try:
                self.fs.delete(self._path(self.generation))
            finally:
                self.generation = None

    def keep_alive(self):
        """A context manager renewing the lease every TTL/3 in a daemon thread while its body runs."""
        lease = self

        class _Keep:
            def __enter__(self):
                self.stop = threading.Event()
                self.error = None

                def loop():
                    while not self.stop.wait(lease.ttl_ms / 3000):
                        try:
                            lease.renew()
                        except Exception as e:  # noqa: BLE001 - check() reports it to the job
                            self.error = e
                            return

                self.thread = threading.Thread(target=loop, daemon=True, name="kafkalog-lease")
                self.thread.start()
                return lease

            def __exit__(self, *exc):
                self.stop.set()
                self.thread.join()

        return _Keep()


def attach_lease(
    fs: LogFileSystem, root: str, holder: str, generation: int, expires_ms: int, ttl_ms: int = DEFAULT_LEASE_TTL_MS
) -> MaintenanceLease:
    """The lease a job's driver holds, for its tasks (e.g. Spark executors) to check() it."""
    lease = MaintenanceLease(fs, root, holder=holder, ttl_ms=ttl_ms)
    lease.generation, lease.expires_ms = generation, expires_ms
    return lease
