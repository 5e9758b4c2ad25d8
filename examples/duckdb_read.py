"""DuckDB over a topic, no Spark: kafkalog_ds.write() writes page views, DuckDB aggregates kafkalog_ds.read().

Run:  python examples/duckdb_read.py [ROOT]          (default ./duckdb-logs, made afresh)
It produces 5,000 page views of the last hour (key: the user, value: "page|milliseconds") into a topic of 3
partitions, then DuckDB runs SQL on the pyarrow.RecordBatchReader that read() returns: views per page, and the
last 10 minutes only (starting_timestamp). Exit code 1 if DuckDB's counts differ from what write() appended.
"""

import os
import shutil
import sys
import time

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import kafkalog_ds

PROG = "duckdb_read"
VIEWS, USERS = 5_000, 200
PAGES = np.array(["/home", "/search", "/product", "/cart", "/checkout"])


def page_views(now_ms: int) -> pa.Table:
    """VIEWS rows over the hour before now_ms, in time order: key user-N, value "page|ms"."""
    rng = np.random.default_rng(7)
    users = pa.array(np.char.add("user-", rng.integers(0, USERS, VIEWS).astype(str)))
    pages = pa.array(PAGES[rng.integers(0, len(PAGES), VIEWS)])
    ms = pa.array(rng.integers(20, 900, VIEWS).astype(str))
    return pa.table(
        {
            "key": users,
            "value": pc.binary_join_element_wise(pages, ms, "|"),
            "timestamp": pa.array(np.sort(rng.integers(now_ms - 3_600_000, now_ms, VIEWS))),
        }
    )


def main() -> int:
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "duckdb-logs")
    if len(sys.argv) <= 1:
        shutil.rmtree(root, ignore_errors=True)  # this example's own directory: start afresh
    elif os.path.exists(root) and os.listdir(root):
        sys.exit(f"{PROG}: error: {root} is not empty; give a new directory")
    now = int(time.time() * 1000)
    rows = page_views(now)
    written = kafkalog_ds.write(root, "views", rows, partitions=3, compression="zstd")
    spread = ", ".join(f"{p}: {w.records}" for p, w in sorted(written.partitions.items()))
    print(f"produced {written.records} page views to {root} (per partition {spread})")

    db = duckdb.connect()
    db.register("views", kafkalog_ds.read(root, "views"))  # a pyarrow.RecordBatchReader, scanned as a table
    per_page = db.sql(
        """
        SELECT split_part(decode(value), '|', 1) AS page,
               count(*) AS views,
               count(DISTINCT key) AS users,
               round(avg(CAST(split_part(decode(value), '|', 2) AS INTEGER))) AS avg_ms
        FROM views GROUP BY page ORDER BY views DESC
        """
    ).fetchall()
    print(f"{'page':<10} {'views':>6} {'users':>6} {'avg_ms':>7}")
    for page, count, users, avg_ms in per_page:
        print(f"{page:<10} {count:>6} {users:>6} {int(avg_ms):>7}")

    since = now - 600_000
    db.register("recent", kafkalog_ds.read(root, "views", starting_timestamp=since))  # Kafka's offsets by time
    (last_10_min,) = db.sql("SELECT count(*) FROM recent").fetchone() or (0,)
    expected = int(pc.sum(pc.greater_equal(rows.column("timestamp"), since)).as_py() or 0)
    print(f"views in the last 10 minutes: {last_10_min} (written: {expected})")
    total = sum(count for _, count, _, _ in per_page)
    if total != written.records or last_10_min != expected:
        print(f"{PROG}: NOT OK: DuckDB counted {total} views and {last_10_min} recent ones", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        sys.exit(130)
