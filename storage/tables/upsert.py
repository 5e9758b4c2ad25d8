"""Upsert tables (table.mode=upsert): one row per key, the latest record of its key; a tombstone deletes it.

A row's identity is (partition, key), as compaction's: the cleaner keeps the latest record per key in each
partition. Records with a null key have no identity and are each kept, as the cleaner keeps them; a
tombstone (null value) is never a row. A pass takes the latest record per key of its range (latest_per_key),
then replaces the table's rows of every key the range touched by copy-on-write: each data file holding such a
row is rewritten without it and both go in one overwrite commit, with the new rows and the new offsets.
Copy-on-write, not equality deletes: pyiceberg cannot read equality deletes (docs/tables.md has the
measurement), and every reader must see exactly the compacted topic.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .data_files import DataFileWriter

IDENTITY = ["partition", "key"]


def latest_per_key(rows: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(rows to add: the latest record of each key and every null-key record, tombstones left out, in
    partition, offset order; the identities the range touched: a (partition, key) table) of one range."""
    if rows.num_rows == 0:
        return rows, pa.table({"partition": pa.array([], pa.int32()), "key": pa.array([], pa.binary())})
    keyed = rows.filter(pc.is_valid(rows["key"]))
    latest = keyed.group_by(IDENTITY, use_threads=False).aggregate([("offset", "max")])
    changed = latest.select(IDENTITY)
    # offsets are unique within a partition: a row is its key's latest when its (partition, offset) is
    winners = _pair_codes(latest["partition"], latest["offset_max"])
    keep = pc.is_in(_pair_codes(rows["partition"], rows["offset"]), value_set=winners)
    keep = pc.or_(keep, pc.is_null(rows["key"]))
    keep = pc.and_(keep, pc.is_valid(rows["value"]))
    out = rows.filter(keep)
    order = np.lexsort((out["offset"].to_numpy(), out["partition"].to_numpy()))
    return out.take(pa.array(order)), changed


def _pair_codes(partition: pa.ChunkedArray, offset: pa.ChunkedArray) -> pa.Array:
    """(partition, offset) as one int64-pair code: partition in the high bits (offsets stay below 2^47)."""
    p = pc.cast(partition, pa.int64()).to_numpy()
    o = offset.to_numpy() if isinstance(offset, pa.ChunkedArray) else np.asarray(offset)
    return pa.array((p.astype(np.int64) << 47) | o.astype(np.int64))


def _hits(table_part: pa.ChunkedArray, table_key: pa.ChunkedArray, changed: dict[int, pa.Array]) -> np.ndarray:
    """Which rows of a file carry an identity in `changed` (partition -> keys)."""
    mask = np.zeros(len(table_part), dtype=bool)
    parts = table_part.to_numpy()
    for p, keys in changed.items():
        in_p = parts == p
        if not in_p.any():
            continue
        found = pc.fill_null(pc.is_in(table_key, value_set=keys), False).to_numpy(zero_copy_only=False)
        mask |= in_p & found
    return mask


def rewrite_files(table, changed: pa.Table, writer: DataFileWriter) -> tuple[list, int]:
    """Copy-on-write: every current data file holding a row of a changed identity is read and written again
    without those rows (into `writer`). Returns (the DataFiles to delete, the rows dropped)."""
    if changed.num_rows == 0 or table.metadata.current_snapshot_id is None:
        return [], 0
    by_part: dict[int, pa.Array] = {}
    parts = changed["partition"].to_numpy()
    for p in np.unique(parts):
        keys = pc.unique(changed["key"].filter(pa.array(parts == p)))
        by_part[int(p)] = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    doomed, dropped = [], 0
    for task in table.scan().plan_files():
        f = task.file
        with table.io.new_input(f.file_path).open() as stream:
            ident = pq.read_table(stream, columns=IDENTITY)
        mask = _hits(ident["partition"], ident["key"], by_part)
        if not mask.any():
            continue
        with table.io.new_input(f.file_path).open() as stream:
            full = pq.read_table(stream)
        kept = full.filter(pa.array(~mask))
        dropped += int(mask.sum())
        for batch in kept.select(writer.file_schema.names).to_batches():
            writer.write(batch)
        doomed.append(f)
    return doomed, dropped
