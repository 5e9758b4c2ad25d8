"""The fuzzer's corpus: valid logs written through the engine, in one ROOT.

Run as `python -m tests.fuzz.corpus DIR [--no-bomb]`: it writes DIR/root (the log dir) and
DIR/manifest.json (per partition: kind, codec, the records written as (offset, digest) and the
offset used by the mid-log read). `build_corpus` is what the runner calls (in a child process, so
the runner itself never imports the engine).

Partitions (all partition 0):

- `c-none`, `c-gzip`, `c-snappy`, `c-lz4`, `c-zstd`: one topic per codec, segment.bytes=3000 and
  index.interval.bytes=200 (so every segment has index entries to damage), written in 3 writer
  sessions, 2-8 records per batch, keys (some null), values (some null, some 0-byte), headers (some
  with null values), timestamps that mostly grow and sometimes go back; some batches carry
  producer id / epoch / base sequence.
- `swap`: cleanup.policy=compact with a small key space. A copy of it is compacted by the real
  maintenance job (`python -m kafkalog_ds maintain ROOT2 --once`), and the compacted segment it wrote
  at the first base offset is copied back into the uncompacted partition as `<base>.log.swap`: the
  on-disk state after a cleaner crash between renaming `.cleaned` to `.swap` and renaming the
  originals to `.deleted` (Kafka's swap protocol), which a loader must complete.
- `leftovers`: delete-records up to the second segment's base offset, then a retention run, so the
  first segment's three files are renamed `.deleted` (fresh: file.delete.delay.ms is not over) and
  log-start-offset-checkpoint moves; plus a `.log.cleaned` (a half-written compaction output: the
  first 60% of the third segment's bytes) that a loader must remove and readers must ignore.
- `bomb`: zstd, max.message.bytes=2 MiB, 3000 batches of one record whose value is 1,000,000
  ASCII '0' bytes (~1 MB of zeros each, compressing to ~100 bytes), 3 segments. Decision: ASCII
  '0' rather than NUL, which compresses the same but would print as 6 MB of JSON escapes per record
  through `consume` and make the harness, not the engine, the bottleneck. The log is valid: readers
  must serve its 3 GB of values without going over the memory cap.
- `txn`: Kafka transactions written through the engine (`log.append` of transactional batches and of
  control batches from `EndTransactionMarker.to_batch`): 4 transactional producers whose transactions
  interleave, some committed and some aborted, one spanning segments, with non-transactional batches
  (no producer id, and an idempotent producer) between them, 4 writer sessions, segment.bytes=2500 so
  that several segments have `.txnindex` entries, producer snapshots at each roll and each clean close
  (storage.log.CLOSE_SNAPSHOT_MIN_OFFSETS set to 0 here, as tests/storage/transactions/conftest.py
  does), and one transaction left open at the end, followed by committed data of other producers.
  The manifest records `written` (what read_uncommitted serves: every data record), `committed` (what a
  read_committed reader must serve, from the generator's own model: no aborted record, nothing at or
  past the last stable offset) and `lso`.
- `chunky`: uncompressed, segment.bytes=400000, values of 200-3000 bytes (batches of a few KB), 3+
  segments: the only partition whose segments are larger than a reader's first chunks (64 KiB, then
  256 KiB more), for the object-store mode's mutants at chunk boundaries (mutate.m_chunk).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import subprocess
import sys

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
TS0 = 1_700_000_000_000
CORPUS_SEED = 20240611  # the corpus is the same on every run: a mutant is reproduced by its seed
BOMB_BATCHES = 3000
BOMB_VALUE = 1_000_000
# above the readers' first two chunk reads (64 KiB, then 256 KiB more: storage/file_records.py), so
# damage can sit on the boundaries where a read through an object store issues its next ranged GET
CHUNKY_SEGMENT_BYTES = 400_000

ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"


def _rand_text(rng: random.Random, lo: int, hi: int) -> bytes:
    # half random text, half repetitive: compressible enough that every codec is really used
    n = rng.randint(lo, hi)
    if rng.random() < 0.5:
        return "".join(rng.choice(ALPHABET) for _ in range(n)).encode()
    word = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(3, 8)))
    return (word * (n // len(word) + 1))[:n].encode()


def gen_rows(
    rng: random.Random, n: int, index0: int, keyspace: int | None = None, value_len: tuple = (8, 120)
) -> list[dict]:
    rows = []
    for i in range(n):
        j = index0 + i
        if keyspace is not None:
            key = f"key-{rng.randrange(keyspace)}".encode()
        else:
            key = None if rng.random() < 0.15 else f"key-{rng.randrange(10**6)}".encode()
        r = rng.random()
        value = None if r < 0.08 else (b"" if r < 0.12 else _rand_text(rng, *value_len))
        headers = []
        for h in range(rng.choice([0, 0, 0, 1, 2, 3])):
            headers.append(
                {"key": f"h{h}-{rng.randrange(100)}", "value": None if rng.random() < 0.2 else _rand_text(rng, 0, 12)}
            )
        ts = TS0 + j * 1000 + (rng.randint(-5000, 0) if rng.random() < 0.15 else rng.randint(0, 999))
        rows.append({"key": key, "value": value, "timestamp": ts, "headers": headers})
    return rows


def _table(rows):
    import pyarrow as pa

    htype = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    return pa.table(
        {
            "key": pa.array([r["key"] for r in rows], pa.binary()),
            "value": pa.array([r["value"] for r in rows], pa.binary()),
            "timestamp": pa.array([r["timestamp"] for r in rows], pa.int64()),
            "headers": pa.array([r["headers"] for r in rows], htype),
        }
    )


def _digest_rows(rows, first_offset):
    from tests.fuzz.reference import record_digest

    return [
        [
            first_offset + i,
            record_digest(r["timestamp"], 0, r["key"], r["value"], [(h["key"], h["value"]) for h in r["headers"]]),
        ]
        for i, r in enumerate(rows)
    ]


def _segments(root, topic):
    d = os.path.join(root, f"{topic}-0")
    return sorted(n for n in os.listdir(d) if n.endswith(".log"))


def write_topic(
    lm,
    topic: str,
    codec: str,
    rng: random.Random,
    *,
    config: dict,
    min_segments: int = 4,
    sessions: int = 3,
    keyspace: int | None = None,
    value_len: tuple = (8, 120),
) -> list:
    """Append batches through the engine until the partition has `min_segments` segments."""
    from storage.records.builder import build_records
    from storage.records.record_batch import CompressionType
    from storage.topic_partition import TopicPartition

    lm.create_topic(topic, 1, config)
    tp = TopicPartition(topic, 0)
    written = []
    index = 0
    session = 0
    while True:
        with lm.open_log(tp, writable=True) as log:
            for _ in range(12):
                rows = gen_rows(rng, rng.randint(2, 8), index, keyspace, value_len)
                index += len(rows)
                kw = {}
                if rng.random() < 0.3:
                    kw = {
                        "producer_id": 1000 + rng.randrange(5),
                        "producer_epoch": rng.randrange(3),
                        "base_sequence": rng.randrange(10_000),
                    }
                info = log.append(build_records(_table(rows), compression=CompressionType[codec.upper()], **kw))
                written += _digest_rows(rows, info.first_offset)
        session += 1
        if session >= sessions and len(_segments(lm.root, topic)) >= min_segments:
            return written


def build_swap(lm, root: str, rng: random.Random) -> dict:
    """The `swap` partition: see the module docstring."""
    import tempfile

    topic = "swap"
    cfg = {
        "segment.bytes": "3000",
        "index.interval.bytes": "200",
        "cleanup.policy": "compact",
        "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "0",
        "delete.retention.ms": "86400000000",
        "segment.ms": "86400000000",
    }
    written = write_topic(lm, topic, "lz4", rng, config=cfg, min_segments=5, keyspace=90)
    d = os.path.join(root, f"{topic}-0")
    with tempfile.TemporaryDirectory(prefix="kl-swap-") as tmp:
        root2 = os.path.join(tmp, "root")
        os.makedirs(root2)
        # segment.bytes raised on the copy so the cleaner groups several segments into one output
        # (the merge case of Kafka's swap; with 3000 it rewrites each segment on its own)
        with open(os.path.join(root, f"{topic}.kafkalog-topic.json")) as f:
            meta = json.load(f)
        meta["config"]["segment.bytes"] = "9000"
        with open(os.path.join(root2, f"{topic}.kafkalog-topic.json"), "w") as f:
            json.dump(meta, f)
        shutil.copytree(d, os.path.join(root2, f"{topic}-0"))
        for name in ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint"):
            src = os.path.join(root, name)
            if os.path.exists(src):
                with open(src) as f:
                    lines = f.read().split("\n")
                keep = [ln for ln in lines[2:] if ln.startswith(f"{topic} ")]
                with open(os.path.join(root2, name), "w") as f:
                    f.write(f"0\n{len(keep)}\n" + "".join(ln + "\n" for ln in keep))
        env = dict(os.environ)
        proc = subprocess.run(
            [sys.executable, "-m", "kafkalog_ds", "maintain", root2, "--once", "--topic", topic],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"maintain failed: {proc.stdout} {proc.stderr}")
        before = _segments(root, topic)
        after = _segments(root2, topic)
        first = before[0]
        src = os.path.join(root2, f"{topic}-0", first)
        with open(src, "rb") as f:
            compacted = f.read()
        with open(os.path.join(d, first), "rb") as f:
            original = f.read()
        if compacted == original or len(after) >= len(before) - 1:
            raise RuntimeError(f"compaction did not merge segments: {before} -> {after}; {proc.stdout}")
        with open(os.path.join(d, first + ".swap"), "wb") as f:
            f.write(compacted)
    return {
        "written": written,
        "maintain": proc.stdout.strip(),
        "swap_of": first,
        "segments_before": before,
        "segments_after_compaction": after,
    }


def build_leftovers(lm, root: str, rng: random.Random) -> dict:
    from storage.topic_partition import TopicPartition

    topic = "leftovers"
    # retention.ms=-1: the records' timestamps (2023) are older than the default 7 days, and only the
    # log-start rule (delete-records) should remove a segment here
    cfg = {
        "segment.bytes": "3000",
        "index.interval.bytes": "200",
        "file.delete.delay.ms": "86400000",
        "retention.ms": "-1",
    }
    written = write_topic(lm, topic, "gzip", rng, config=cfg, min_segments=5)
    tp = TopicPartition(topic, 0)
    segs = _segments(root, topic)
    second = int(segs[1][:20])
    lm.delete_records(tp, second)
    res = lm.apply_retention(tp)
    d = os.path.join(root, f"{topic}-0")
    third = sorted(n for n in os.listdir(d) if n.endswith(".log"))[1]
    with open(os.path.join(d, third), "rb") as f:
        data = f.read()
    with open(os.path.join(d, third + ".cleaned"), "wb") as f:
        f.write(data[: len(data) * 6 // 10])
    deleted = sorted(n for n in os.listdir(d) if n.endswith(".deleted"))
    if not deleted:
        raise RuntimeError(f"retention left no .deleted files: {res}")
    return {"written": [w for w in written if w[0] >= second], "log_start": second, "deleted": deleted}


def build_bomb(lm, root: str) -> dict:
    import pyarrow as pa

    from storage.records.builder import build_records
    from storage.records.record_batch import CompressionType
    from storage.topic_partition import TopicPartition
    from tests.fuzz.reference import record_digest

    topic = "bomb"
    lm.create_topic(
        topic, 1, {"max.message.bytes": str(2 * 1024 * 1024), "segment.bytes": "120000", "index.interval.bytes": "4096"}
    )
    tp = TopicPartition(topic, 0)
    value = b"0" * BOMB_VALUE
    digest = {}
    written = []
    step = 20
    with lm.open_log(tp, writable=True) as log:
        for i in range(0, BOMB_BATCHES, step):
            ts = [TS0 + j for j in range(i, i + step)]
            t = pa.table(
                {
                    "key": pa.array([b"bomb-%d" % j for j in range(i, i + step)], pa.binary()),
                    "value": pa.array([value] * step, pa.binary()),
                    "timestamp": pa.array(ts, pa.int64()),
                }
            )
            info = log.append(build_records(t, compression=CompressionType.ZSTD, max_batch_bytes=BOMB_VALUE + 1024))
            for k, j in enumerate(range(i, i + step)):
                digest = record_digest(ts[k], 0, b"bomb-%d" % j, value, [])
                written.append([info.first_offset + k, digest])
    return {"written": written}


TXN_PRODUCERS = [11, 12, 13, 14]
TXN_IDEMPOTENT_PRODUCER = 21
TXN_SESSIONS = 4
TXN_STEPS_PER_SESSION = 30


def build_txn(lm, rng: random.Random) -> dict:
    """The `txn` partition: see the module docstring. Returns its manifest entry."""
    import storage.log
    from storage.records.builder import build_batch
    from storage.records.record_batch import CompressionType
    from storage.topic_partition import TopicPartition
    from storage.transactions.control_records import ControlRecordType, EndTransactionMarker

    topic = "txn"
    lm.create_topic(topic, 1, {"segment.bytes": "2500", "index.interval.bytes": "200"})
    tp = TopicPartition(topic, 0)
    saved = storage.log.CLOSE_SNAPSHOT_MIN_OFFSETS
    storage.log.CLOSE_SNAPSHOT_MIN_OFFSETS = 0  # a snapshot at every clean close, as a broker's shutdown
    index = 0
    records = []  # [offset, digest, txn id or None]
    open_txn: dict[int, int] = {}  # producer id -> txn id
    outcome: dict[int, str] = {}  # txn id -> "commit" | "abort"
    txn_first: dict[int, int] = {}  # txn id -> first offset
    next_txn = 0
    seq = collections.defaultdict(int)

    def data_batch(log, pid, txn):
        nonlocal index
        rows = gen_rows(rng, rng.randint(1, 5), index)
        index += len(rows)
        codec = rng.choice(["NONE", "NONE", "LZ4", "ZSTD"])
        kw = {}
        if pid >= 0:
            kw = {"producer_id": pid, "producer_epoch": 0, "base_sequence": seq[pid], "is_transactional": txn}
            seq[pid] += len(rows)
        info = log.append(build_batch(_table(rows), compression=CompressionType[codec], base_offset=0, **kw))
        return [[o, d] for o, d in _digest_rows(rows, info.first_offset)]

    def end(log, pid, kind):
        t = open_txn.pop(pid)
        outcome[t] = "commit" if kind is ControlRecordType.COMMIT else "abort"
        marker = EndTransactionMarker(kind, 3)
        log.append(marker.to_batch(base_offset=0, timestamp=TS0 + index * 1000, producer_id=pid, producer_epoch=0))

    try:
        for session in range(TXN_SESSIONS):
            last = session == TXN_SESSIONS - 1
            with lm.open_log(tp, writable=True) as log:
                for _ in range(TXN_STEPS_PER_SESSION):
                    r = rng.random()
                    if r < 0.15:
                        pid = rng.choice([-1, TXN_IDEMPOTENT_PRODUCER])
                        records += [[o, d, None] for o, d in data_batch(log, pid, False)]
                    elif r < 0.35 and open_txn:
                        pid = rng.choice(sorted(open_txn))
                        end(log, pid, ControlRecordType.ABORT if rng.random() < 0.45 else ControlRecordType.COMMIT)
                    else:
                        pid = rng.choice(TXN_PRODUCERS)
                        if pid not in open_txn:
                            open_txn[pid] = next_txn
                            next_txn += 1
                        got = data_batch(log, pid, True)
                        txn_first.setdefault(open_txn[pid], got[0][0])
                        records += [[o, d, open_txn[pid]] for o, d in got]
                if last:  # every transaction ends but one, left open; committed data follows it
                    keep = sorted(open_txn)[0] if open_txn else TXN_PRODUCERS[0]
                    for pid in sorted(open_txn):
                        if pid != keep:
                            end(log, pid, rng.choice([ControlRecordType.ABORT, ControlRecordType.COMMIT]))
                    if keep not in open_txn:
                        open_txn[keep] = next_txn
                        next_txn += 1
                        got = data_batch(log, keep, True)
                        txn_first[open_txn[keep]] = got[0][0]
                        records += [[o, d, open_txn[keep]] for o, d in got]
                    other = next(p for p in TXN_PRODUCERS if p != keep)
                    open_txn[other] = next_txn
                    next_txn += 1
                    records += [[o, d, open_txn[other]] for o, d in data_batch(log, other, True)]
                    end(log, other, ControlRecordType.COMMIT)
                    records += [[o, d, None] for o, d in data_batch(log, -1, False)]
    finally:
        storage.log.CLOSE_SNAPSHOT_MIN_OFFSETS = saved
    lso = min(txn_first[t] for t in open_txn.values())
    committed = [[o, d] for o, d, t in records if o < lso and (t is None or outcome.get(t) == "commit")]
    d = os.path.join(lm.root, f"{topic}-0")
    names = os.listdir(d)
    segs = [n for n in names if n.endswith(".log")]
    txnindexes = [n for n in names if n.endswith(".txnindex") and os.path.getsize(os.path.join(d, n)) >= 34]
    snapshots = [n for n in names if n.endswith(".snapshot")]
    if len(segs) < 3 or len(txnindexes) < 2 or len(snapshots) < 2 or "abort" not in outcome.values():
        raise RuntimeError(f"txn partition too small: {sorted(names)}")
    return {
        "kind": "txn",
        "codec": "none",
        "written": [[o, d] for o, d, _ in records],
        "committed": committed,
        "lso": lso,
        "aborted_txns": sum(1 for v in outcome.values() if v == "abort"),
        "committed_txns": sum(1 for v in outcome.values() if v == "commit"),
    }


def build_corpus(out_dir: str, *, bomb: bool = True) -> dict:
    """Write the corpus under out_dir/root and its manifest to out_dir/manifest.json."""
    from storage.log_manager import LogManager

    root = os.path.join(out_dir, "root")
    os.makedirs(root, exist_ok=True)
    lm = LogManager(root)
    rng = random.Random(CORPUS_SEED)
    parts = {}
    for codec in CODECS:
        topic = f"c-{codec}"
        cfg = {"segment.bytes": "3000", "index.interval.bytes": "200"}
        written = write_topic(lm, topic, codec, rng, config=cfg)
        parts[topic] = {"kind": "codec", "codec": codec, "written": written}
    parts["swap"] = {"kind": "swap", "codec": "lz4", **build_swap(lm, root, rng)}
    parts["leftovers"] = {"kind": "leftovers", "codec": "gzip", **build_leftovers(lm, root, rng)}
    if bomb:
        parts["bomb"] = {"kind": "bomb", "codec": "zstd", **build_bomb(lm, root)}
    # its own generator, so adding it changed nothing in the partitions above (their mutants reproduce)
    cfg = {"segment.bytes": str(CHUNKY_SEGMENT_BYTES), "index.interval.bytes": "4096"}
    written = write_topic(
        lm, "chunky", "none", random.Random(CORPUS_SEED + 1), config=cfg, min_segments=3, value_len=(200, 3000)
    )
    parts["chunky"] = {"kind": "chunky", "codec": "none", "written": written}
    parts["txn"] = build_txn(lm, random.Random(CORPUS_SEED + 2))  # its own generator, as `chunky`
    manifest = {"root": root, "partitions": parts}
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    return manifest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--no-bomb", action="store_true")
    args = ap.parse_args(argv)
    m = build_corpus(args.dir, bomb=not args.no_bomb)
    for t, p in m["partitions"].items():
        print(t, p["kind"], len(p["written"]), "records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
