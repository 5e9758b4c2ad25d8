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
