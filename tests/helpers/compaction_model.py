"""A brute-force model of log compaction, the reference the cleaner tests hold the cleaner to."""

from __future__ import annotations


class Model:
    """Brute-force compaction: records by offset, each batch's delete horizon (KIP-534)."""

    def __init__(self, retention_ms):
        self.records = {}  # offset -> (ts, key, value, headers, batch base)
        self.horizon = {}  # batch base -> horizon
        self.retention = retention_ms
        self.checkpoint = 0

    def append(self, base, records):
        for i, (ts, k, v, hs) in enumerate(records):
            self.records[base + i] = (ts, k, v, [tuple(h) for h in hs], base)

    def clean(self, first_dirty, end, now):
        latest = {}
        for off, (_, k, _, _, _) in self.records.items():
            if first_dirty <= off < end and k is not None:
                latest[k] = max(latest.get(k, -1), off)
        kept, stamp = {}, set()
        for off, rec in sorted(self.records.items()):
            ts, k, v, hs, batch = rec
            if off < end and k is not None:
                if off < latest.get(k, -1):
                    continue
                if v is None and batch in self.horizon and now >= self.horizon[batch]:
                    continue
                if v is None and batch not in self.horizon:
                    stamp.add(batch)
            kept[off] = rec
        self.records = kept
        for batch in stamp:
            self.horizon[batch] = now + self.retention
        self.checkpoint = end

    def expected(self):
        return [(o, ts, k, v, hs) for o, (ts, k, v, hs, _) in sorted(self.records.items())]


ABORT, COMMIT = 0, 1


class TxnModel:
    """Brute-force compaction of a log with transactions, Kafka's rules stated over the whole log at once:
    - aborted data (a transactional record of producer P inside an aborted (P, first, last)) never enters
      the key map and is removed;
    - a marker of P at m "has data" when a transactional record of P of its kind (aborted for ABORT,
      committed for COMMIT) lies between P's previous present marker and m; a marker with data stays as
      it is; one without is stamped with now + retention the first time, and removed once now >= it;
    - only offsets below `end` (the first uncleanable offset) are touched;
    - a cleaned segment's `.txnindex` keeps an aborted transaction only while its ABORT marker has data.
    Records: offset -> (ts, key, value, headers, batch base, producer id, transactional, marker type or None).
    """

    def __init__(self, retention_ms):
        self.records = {}
        self.horizon = {}  # batch base -> horizon
        self.retention = retention_ms
        self.checkpoint = 0
        self.aborted = []  # (producer id, first offset, ABORT marker offset)
        self.open = {}  # producer id -> first offset of its open transaction
        self.index = set()  # (producer id, first, last) the live `.txnindex` files should hold

    def append(self, base, records, producer_id=-1, transactional=False):
        for i, (ts, k, v, hs) in enumerate(records):
            self.records[base + i] = (ts, k, v, [tuple(h) for h in hs], base, producer_id, transactional, None)
        if transactional:
            self.open.setdefault(producer_id, base)

    def end_txn(self, offset, ts, producer_id, kind, key, value):
        first = self.open.pop(producer_id)
        if kind == ABORT:
            self.aborted.append((producer_id, first, offset))
            self.index.add((producer_id, first, offset))
        self.records[offset] = (ts, key, value, [], offset, producer_id, True, kind)

    def last_stable_offset(self, log_end):
        return min(self.open.values(), default=log_end)

    def in_abort(self, pid, off):
        return any(p == pid and f <= off <= last for p, f, last in self.aborted)

    def is_aborted(self, off, rec):
        pid, txn, kind = rec[5], rec[6], rec[7]
        return txn and kind is None and self.in_abort(pid, off)

    def clean(self, first_dirty, end, now, empties=()):
        """empties: (base offset, producer id) of the empty transactional data batches in the log before the
        cleaning (what is left of a batch whose records all went, where the engine keeps one); Kafka counts
        them as a transaction's batches, as it does the empty batches it retains."""
        latest = {}
        for off, rec in self.records.items():
            k = rec[1]
            if first_dirty <= off < end and k is not None and rec[7] is None and not self.is_aborted(off, rec):
                latest[k] = max(latest.get(k, -1), off)
        markers = sorted((off, rec) for off, rec in self.records.items() if rec[7] is not None)
        kept, stamp = {}, set()
        for off, rec in sorted(self.records.items()):
            ts, k, v, hs, batch, pid, txn, kind = rec
            if off >= end:
                kept[off] = rec
                continue
            if kind is not None:
                prev = max((m for m, r in markers if r[5] == pid and m < off), default=-1)
                data = any(
                    r[5] == pid
                    and r[6]
                    and r[7] is None
                    and prev < o < off
                    and self.is_aborted(o, r) == (kind == ABORT)
                    for o, r in self.records.items()
                ) or any(p == pid and prev < b < off and self.in_abort(p, b) == (kind == ABORT) for b, p in empties)
                if kind == ABORT and not data:  # a cleaned segment's .txnindex keeps only aborts with data
                    self.index -= {t for t in self.index if t[0] == pid and t[2] == off}
                if not data:
                    if batch in self.horizon:
                        if now >= self.horizon[batch]:
                            continue
                    else:
                        stamp.add(batch)
                kept[off] = rec
                continue
            if self.is_aborted(off, rec):
                continue
            if k is not None:
                if off < latest.get(k, -1):
                    continue
                if v is None and batch in self.horizon and now >= self.horizon[batch]:
                    continue
                if v is None and batch not in self.horizon:
                    stamp.add(batch)
            kept[off] = rec
        self.records = kept
        for batch in stamp:
            self.horizon[batch] = now + self.retention
        self.checkpoint = end

    def expected(self):
        """(offset, ts, key, value, headers) of every record left, markers included."""
        return [(o, r[0], r[1], r[2], r[3]) for o, r in sorted(self.records.items())]
