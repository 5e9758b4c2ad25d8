"""Requests and bytes of a timestamp lookup on an S3 log of 500 segment objects, counted by the S3 server.

Run:  python benchmarks/s3_lookup.py [--segments 500]
moto's S3 server runs in this process on 127.0.0.1 (tools/s3_server.py, with its
request log). One partition gets one segment object per append (100 records of ~200 bytes, about
20 KB, default index.interval.bytes), timestamps growing with offsets. For a T in the first, middle
and last segment it reports, from a fresh LogManager each time (listings included):
- engine: Log.offset_for_timestamp(T) (Kafka's ListOffsets / offsetsForTimes);
- spark planning: what spark.read...option("startingTimestamp", T) plans on the driver
  (KafkaLogBatchReader.partitions(), no SparkSession needed).
Then the same with the partition's hint object removed (a log whose appends could not write it): the
lookup falls back to one 12-byte .timeindex read per segment it passes over.
Requests are deterministic; no timings are printed. A .log GET "whole" is one whose range covers the
object from its first to its last byte (or has no Range header).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

T0 = 1_700_000_000_000
RECORDS_PER_SEGMENT = 100


def start_server():
    """moto's S3 server on 127.0.0.1:<free port> with the test bucket; dummy credentials in the env."""
    import logging

    from tools.s3_server import ACCESS_KEY, BUCKET, REGION, SECRET_KEY, S3Server

    os.environ.update(
        AWS_ACCESS_KEY_ID=ACCESS_KEY,
        AWS_SECRET_ACCESS_KEY=SECRET_KEY,
        AWS_DEFAULT_REGION=REGION,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_CONFIG_FILE=os.devnull,
    )
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    return S3Server().start(), BUCKET


def spark_fs_options(server) -> dict:
    """The server's storage options as Spark `fs.*` options (Spark's workers are other processes)."""
    import json

    opts = server.storage_options
    return {
        "fs.endpoint_url": opts["endpoint_url"],
        "fs.key": opts["key"],
        "fs.secret": opts["secret"],
        "fs.client_kwargs": json.dumps(opts["client_kwargs"]),
    }


def whole_object_gets(requests, sizes: dict[str, int]) -> list:
    """GETs of .log objects that fetched the object whole (no Range, or a range over every byte)."""
    out = []
    for r in requests:
        if r.method != "GET" or not r.path.endswith(".log") or "/.kafkalog-staged-" in r.path:
            continue
        size = sizes.get(r.path)
        if r.range is None:
            out.append(r)
        elif size is not None:
            first, _, last = r.range[len("bytes=") :].partition("-")
            if int(first) == 0 and (last == "" or int(last) >= size - 1):
                out.append(r)
    return out


def summary(requests) -> str:
    by = Counter(r.method for r in requests)
    return (
        f"{len(requests):>5} requests ({', '.join(f'{k} {v}' for k, v in sorted(by.items()))}), "
        f"{sum(r.body_bytes for r in requests):>9,} bytes received"
    )


def kind(r) -> str:
    """What a request was for: LIST, or the kind of object it read."""
    if "list-type" in r.query or r.path.endswith("/") or "prefix=" in r.query:
        return "LIST"
    name = r.path.rsplit("/", 1)[-1]
    for suffix in (".timeindex", ".index", ".log", ".json", ".checkpoint"):
        if name.endswith(suffix):
            return suffix
    return name


def object_sizes(server, url: str) -> dict[str, int]:
    """{/bucket/key: size} of every object under url, listed with s3fs (not the engine)."""
    import s3fs

    s3 = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, **server.storage_options)
    return {"/" + k: int(v["size"]) for k, v in s3.find(url[len("s3://") :], detail=True).items()}


def build(url: str, opts: dict, segments: int) -> None:
    import pyarrow as pa

    from storage.log_manager import LogManager
    from storage.records.builder import build_records
    from storage.topic_partition import TopicPartition

    lm = LogManager(url, opts)
    lm.create_topic("t", 1)
    with lm.open_log(TopicPartition("t", 0), writable=True) as log:
        for s in range(segments):
            lo = s * RECORDS_PER_SEGMENT
            offs = range(lo, lo + RECORDS_PER_SEGMENT)
            table = pa.table(
                {
                    "key": [b"k%05d" % (i % 997) for i in offs],
                    "value": [b"x" * 180] * len(offs),
                    "timestamp": pa.array([T0 + 1000 * i for i in offs], pa.int64()),
                }
            )
            log.append(build_records(table, max_batch_bytes=2048))  # about 10 batches of 2 KB per segment


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=500)
    args = parser.parse_args(argv)

    from storage.log_manager import LogManager
    from storage.topic_partition import TopicPartition

    server, bucket = start_server()
    try:
        url, opts = f"s3://{bucket}/lookup", server.storage_options
        mark = server.log.mark()
        build(url, opts, args.segments)
        print(f"built {args.segments} segment objects with {server.log.mark() - mark} requests")
        sizes = object_sizes(server, url)
        logs = sorted(k for k in sizes if k.endswith(".log"))
        print(
            f"{len(logs)} .log objects, {sum(sizes[k] for k in logs):,} bytes "
            f"(each about {sum(sizes[k] for k in logs) // len(logs):,}); {len(sizes)} objects in all"
        )

        def engine(ts):
            with LogManager(url, opts).open_log(TopicPartition("t", 0)) as log:
                return log.offset_for_timestamp(ts)

        def planning(ts):
            from python_datasource.reader import KafkaLogBatchReader, selected_columns
            from python_datasource.source_options import SourceOptions

            o = SourceOptions.parse(
                {"path": url, "subscribe": "t", "startingTimestamp": str(ts), **spark_fs_options(server)},
                streaming=False,
            )
            parts = KafkaLogBatchReader(o, selected_columns(None, o.include_headers)).partitions()
            return parts[0].start if parts else None

        n = args.segments * RECORDS_PER_SEGMENT
        hint = f"{url}/t-0/kafkalog-producer-state.json"
        for with_hint in (True, False):
            if not with_hint:
                import s3fs

                s3fs.S3FileSystem(skip_instance_cache=True, **opts).rm(hint[len("s3://") :])
                print("without the hint object:")
            else:
                print("with the hint object (written by every append):")
            for where, offset in (("first", RECORDS_PER_SEGMENT // 2), ("middle", n // 2 + 37), ("last", n - 13)):
                for name, fn in (("engine", engine), ("spark planning", planning)):
                    mark = server.log.mark()
                    got = fn(T0 + 1000 * offset)
                    reqs = server.log.since(mark)
                    assert got == offset, (name, got, offset)
                    skipped = offset // RECORDS_PER_SEGMENT
                    kinds = Counter(kind(r) for r in reqs)
                    whole = whole_object_gets(reqs, sizes)
                    print(
                        f"  T in the {where:6} segment ({skipped:>3} skipped), {name:14}: {summary(reqs)}; "
                        f"{', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}; "
                        f"{sum(r.body_bytes for r in reqs if kind(r) != 'LIST'):,} bytes besides listings; "
                        f"whole .log objects read: {len(whole)}"
                    )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
