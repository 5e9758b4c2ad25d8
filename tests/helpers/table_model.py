"""A brute-force model of a topic kept as an Iceberg table, and a random workload that feeds the log and the
model together: plain batches, transactions committed, aborted and left open, tombstones, keys that come
back after their tombstone.

The model knows every record it appended (offset, timestamp, key, value, headers) and each transaction's
fate, and states the table's rows without the engine: an append table holds every record below the
table's next offset that is not transactional or whose transaction committed; an upsert table holds, per
(partition, key), the latest such record unless it is a tombstone, and every null-key record with a value.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pyarrow as pa

from storage.records.builder import build_records
from storage.topic_partition import TopicPartition
from storage.transactions.transaction_coordinator import write_marker

T0 = 1_700_000_000_000
DAY = 86_400_000


@dataclass
class Rec:
    partition: int
    offset: int
    ts: int
    key: bytes | None
    value: bytes | None
    headers: list
    txn: int | None = None  # the transaction's id in the model, None: not transactional


@dataclass
class TopicModel:
    topic: str
    partitions: int
    records: list[Rec] = field(default_factory=list)
    outcome: dict[int, str] = field(default_factory=dict)  # txn -> "commit" | "abort" (absent: open)

    def committed(self, next_offsets: dict[int, int]) -> list[Rec]:
        """Records a read_committed reader gets below the table's next offsets."""
        return [
            r
            for r in self.records
            if r.offset < next_offsets.get(r.partition, 0) and (r.txn is None or self.outcome.get(r.txn) == "commit")
        ]

    def append_rows(self, next_offsets: dict[int, int]) -> list[tuple]:
        return sorted(_row(r) for r in self.committed(next_offsets))

    def upsert_rows(self, next_offsets: dict[int, int]) -> list[tuple]:
        latest: dict[tuple, Rec] = {}
        loose = []
        for r in self.committed(next_offsets):
            if r.key is None:
                if r.value is not None:
                    loose.append(r)
                continue
            k = (r.partition, r.key)
            if k not in latest or latest[k].offset < r.offset:
                latest[k] = r
        return sorted(_row(r) for r in list(latest.values()) + loose if r.value is not None)


def _row(r: Rec) -> tuple:
    return (r.partition, r.offset, r.ts, r.key, r.value, tuple(tuple(h) for h in r.headers))


def table_rows(table) -> list[tuple]:
    """A pyiceberg table's rows in the model's shape (timestamps back to ms)."""
    t = table.scan().to_arrow()
    ts = t["timestamp"].cast(pa.int64()).to_pylist()
    out = []
    for i, (p, o, k, v, hs) in enumerate(
        zip(
            t["partition"].to_pylist(),
            t["offset"].to_pylist(),
            t["key"].to_pylist(),
            t["value"].to_pylist(),
            t["headers"].to_pylist(),
            strict=True,
        )
    ):
        out.append((p, o, ts[i] // 1000, k, v, tuple((h["key"], h["value"]) for h in hs or [])))
    return sorted(out)


class Workload:
    """Random appends to a topic's partitions, mirrored in a TopicModel. `keys`: how many distinct keys."""

    def __init__(self, lm, model: TopicModel, seed: int, *, keys: int = 20, tombstones: float = 0.2):
        self.lm, self.model, self.rng = lm, model, random.Random(seed)
        self.keys, self.tombstones = keys, tombstones
        self.open: dict[int, tuple[int, int]] = {}  # partition -> (producer id, txn) of its open transaction
        self.next_txn = 1
        self.now = T0

    def _records(self, partition: int, n: int, txn: int | None) -> tuple[pa.Table, list[Rec]]:
        rows = []
        for _ in range(n):
            self.now += self.rng.choice((1, 1000, 3_600_000, DAY // 3))
            key = None if self.rng.random() < 0.05 else b"k%d" % self.rng.randrange(self.keys)
            value = None if self.rng.random() < self.tombstones else b"v%d" % self.rng.randrange(10**6)
            headers = [("h", b"%d" % self.rng.randrange(3))] if self.rng.random() < 0.3 else []
            rows.append(Rec(partition, -1, self.now, key, value, headers, txn))
        table = pa.table(
            {
                "key": pa.array([r.key for r in rows], pa.binary()),
                "value": pa.array([r.value for r in rows], pa.binary()),
                "timestamp": pa.array([r.ts for r in rows], pa.int64()),
                "headers": pa.array(
                    [[{"key": k, "value": v} for k, v in r.headers] for r in rows],
                    pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
                ),
            }
        )
        return table, rows

    def step(self) -> None:
        """One random append: a plain batch, or a transaction's batch, commit or abort."""
        p = self.rng.randrange(self.model.partitions)
        choice = self.rng.random()
        if p in self.open and choice < 0.4:
            self.end_transaction(p, "commit" if self.rng.random() < 0.6 else "abort")
        elif p in self.open or choice < 0.3:
            self.transactional_batch(p)
        else:
            self.plain_batch(p)

    def plain_batch(self, p: int, n: int | None = None) -> None:
        table, rows = self._records(p, n or self.rng.randrange(1, 12), None)
        self._append(p, build_records(table), rows)

    def keyed_batch(self, p: int, pairs: list[tuple[bytes | None, bytes | None]]) -> None:
        """A plain batch of exactly these (key, value) records."""
        rows = []
        for key, value in pairs:
            self.now += 1000
            rows.append(Rec(p, -1, self.now, key, value, []))
        table = pa.table(
            {
                "key": pa.array([r.key for r in rows], pa.binary()),
                "value": pa.array([r.value for r in rows], pa.binary()),
                "timestamp": pa.array([r.ts for r in rows], pa.int64()),
            }
        )
        self._append(p, build_records(table), rows)

    def transactional_batch(self, p: int, n: int | None = None) -> None:
        """A batch of the partition's open transaction (begun here if there is none)."""
        if p not in self.open:
            self.open[p] = (1000 + p, self.next_txn)
            self.next_txn += 1
        pid, txn = self.open[p]
        table, rows = self._records(p, n or self.rng.randrange(1, 6), txn)
        data = build_records(table, producer_id=pid, producer_epoch=0, base_sequence=0, is_transactional=True)
        self._append(p, data, rows)

    def end_transaction(self, p: int, outcome: str) -> None:
        pid, txn = self.open.pop(p)
        self.now += 1
        with self.lm.open_log(TopicPartition(self.model.topic, p), writable=True) as log:
            write_marker(log, outcome, pid, 0, self.now)
        self.model.outcome[txn] = outcome

    def _append(self, p: int, data: bytes, rows: list[Rec]) -> None:
        with self.lm.open_log(TopicPartition(self.model.topic, p), writable=True) as log:
            first = log.log_end_offset
            log.append(data)
        for i, r in enumerate(rows):
            r.offset = first + i
        self.model.records += rows

    def close_transactions(self) -> None:
        """End every open transaction (committed or aborted at random)."""
        for p in list(self.open):
            self.end_transaction(p, "commit" if self.rng.random() < 0.6 else "abort")
