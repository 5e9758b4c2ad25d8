"""Drive N seeded mutants x 6 operations against the engine, classify every outcome, print a table.

    python -m tests.fuzz.runner --seed S --mutants N            # mutants 0..N-1 of seed S
    python -m tests.fuzz.runner --seed S --only K[,K2...] -v    # reproduce single mutants
    python -m tests.fuzz.runner --seed S --mutants N --clean    # also the unmutated partitions
    python -m tests.fuzz.runner --s3 --seed S --mutants N       # the object-store mode (below)
    python -m tests.fuzz.runner --txn --seed S --mutants N      # the transaction families (below)
    options: --ops a,b,...  --jobs J  --timeout SEC  --mem-cap-mb MB  --corpus DIR (reuse a built corpus)
             --keep DIR (keep the mutant directories)  --json FILE (every outcome)  --bomb-every N

Object-store mode (--s3; needs moto and s3fs): the runner starts the S3 test server
(tools/s3_server.py); each mutant is built and judged locally as below, then uploaded under a prefix
of its own and read through s3:// URLs (CLI: `--fs KEY=VALUE`; API: storage_options) by the reading
operations a-d only. Mutant k targets S3_TARGETS[k % 8]: the seven above and `chunky`, whose mutants
are 3 in 4 damage at the end of a reader's chunk read (mutate.m_chunk); no bomb mutants. A reader
that changes an object (its ETag) is SILENT_WRONG, as one that changes a local file.

Transaction mode (--txn): every mutant targets the `txn` partition (Kafka transactions: markers,
`.txnindex` files, producer snapshots) with a mutation from tests/fuzz/mutate_txn.py (families marker,
txnindex, snapshot), drawn from random.Random(f"txn:{S}:{k}"); the operations are a-f plus g read_committed
and h consume_committed (tests/fuzz/ops.py), judged against the oracle's read_committed answer
(reference.committed_view, from the log's bytes alone), and e and f also read at read_committed after
their session. The unmutated `txn` partition runs g and h in the default mode too.

Mutant k of seed S targets partition TARGETS[k % 7] (the five codec topics, `swap`, `leftovers`), and
the compression-bomb partition when k % bomb_every == bomb_every - 1; its mutation is drawn from
random.Random(f"{S}:{k}") (tests/fuzz/mutate.py). The oracle (tests/fuzz/reference.py) computes the
valid prefix from the mutant's bytes; each operation (tests/fuzz/ops.py) runs in a child process with
RLIMIT_AS and a timeout, and its output is compared with the oracle:

  OK            output == the valid prefix (all of it), possibly followed by a well-formed error at
                the first invalid byte
  ERROR_OK      a project error (CLI: exit 1 and one `kafkalog: error: ...` line; API: a KafkaLogError)
                naming a file and the byte position in it (`position N`; an index file: its name is
                enough), after serving a prefix of the valid prefix (fewer records than the valid
                prefix before an error is accepted for reads, and noted)
  SILENT_WRONG  no error, but records differ from the valid prefix (missing, extra, changed, out of
                order); or records served before an error that are not a prefix; or an append that
                reused an offset; or a reader that changed files
  LOST          e/f: a record of the valid prefix is gone after opening for writing, or the record
                appended after a recovery that had to cut the damage is not readable
  MEMORY        killed by the memory cap, MemoryError / ArrowMemoryError, ENOMEM
  BAD_ERROR     any other exception type, a traceback, a crash (signal), or an error that does not
                name a file and a byte position; or, for a read (b-d: the bytes the oracle read), an
                error that does not name the segment where the valid prefix stops and a position
                inside the batch at fault there (runner.names_stop: an absolute position in the file)
  HANG          the timeout passed (hang detection only; generous)

Decisions (ambiguities the brief leaves open):
- dump-log is Kafka's diagnostic tool, so it is judged per file against what Kafka's DumpLogSegments
  shows (framing, CRC reported as isvalid, records as decoded, no offset checks): it may print a batch
  with a moved baseOffset faithfully. Errors about index files must name the file (no position).
- For the `swap` partition readers and writers may serve the log without the swap or after Kafka's
  swap completion (reference.partition_views); the best match counts.
- e: damage below the recovery point (flushed data gone bad) is not reread by recovery (Kafka after a
  clean shutdown, and docs/storage.md: "reported when read"), so the appended record may sit behind
  it, but must then be readable from its own offset; damage from the recovery point on (and
  everywhere in f) recovery must cut (a torn tail) or refuse with a project error, and an append
  after a cut must be readable in a read from the start.
- read_mid starts at the middle record of the oracle's valid prefix (before any damage), so records
  from there up to the damage must be served.
- read_committed (g, h) on a log whose valid prefix stops at a damaged batch (a marker with a stale CRC):
  the oracle's own answer stops at the last stable offset of the valid prefix (the damaged marker's
  transaction counts as open), but a reader that trusts the intact `.txnindex` and snapshot (as Kafka's
  broker does) may serve, before its error at the damage, the records the corpus's manifest says are
  committed below the damaged batch (`written_committed_view`). Its error must still name the damage.
"""

from __future__ import annotations

import argparse
import base64
import collections
import concurrent.futures as cf
import dataclasses
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field

import crc32c

from . import mutate as M
from . import mutate_txn as MT
from . import ops as O
from .reference import (
    TSTYPE_NAMES,
    Rec,
    dump_view,
    partition_views,
    read_checkpoint,
    record_digest,
    text_digest,
    view_summary,
)

REPO = O.REPO
TARGETS = ["c-none", "c-gzip", "c-snappy", "c-lz4", "c-zstd", "swap", "leftovers"]
# the object-store mode: the reading operations only (objects are immutable; writers are fuzzed
# locally), and the `chunky` partition too, whose segments span several chunk reads
S3_TARGETS = TARGETS + ["chunky"]
S3_OPS = ["dump", "consume", "read", "read_mid"]
CHUNK_SHARE = 0.75  # of the mutants of `chunky` in the object-store mode: damage at a chunk boundary
CLASSES = ["OK", "ERROR_OK", "SILENT_WRONG", "LOST", "MEMORY", "BAD_ERROR", "HANG"]
SEVERITY = {"OK": 0, "ERROR_OK": 1, "BAD_ERROR": 2, "SILENT_WRONG": 3, "LOST": 4, "MEMORY": 5, "HANG": 6}
FAILURES = {"SILENT_WRONG", "LOST", "MEMORY", "BAD_ERROR", "HANG"}
DEFAULT_TIMEOUT = 120.0
DEFAULT_BOMB_EVERY = 40
# Above the fork server's own address space (numba/LLVM and pyarrow's allocator reserve ~1.6 GiB of
# it before any work; a clean operation on the small partitions adds almost nothing, measured with
# VmPeak): room for a reader that streams, far below what buffering gigabytes needs.
DEFAULT_MEM_HEADROOM_MB = 640

ERR_FILE_RE = re.compile(r"\d{20}\.(log|index|timeindex)|\.log\b|[\w.-]+-\d+/")
# the absolute byte position in the named file, as the engine's errors spell it ("..., position N)");
# an offset is no place in a file
ERR_POS_RE = re.compile(r"\bposition:?\s+(\d+)")
INDEX_FILE_RE = re.compile(r"\d{20}\.(index|timeindex)\b")
LOG_PLACE_RE = re.compile(r"(\d{20}\.log(?:\.swap)?), position (\d+)")
MEM_RE = re.compile(
    r"MemoryError|bad_alloc|Cannot allocate memory|[Oo]ut of memory|can't start new thread|"
    r"[Ff]ailed to allocate|ENOMEM"
)
TRACEBACK_RE = re.compile(r"^Traceback \(most recent call last\)|^\w+(\.\w+)*(Error|Exception|Warning)\b", re.MULTILINE)


def names_place(msg: str, *, file_only: bool = False) -> bool:
    """The error names a file and the byte position in it (`position N`); for damage in an index file
    the file's name is enough (an index is rebuilt, not read on from a place)."""
    if not ERR_FILE_RE.search(msg):
        return False
    return file_only or bool(INDEX_FILE_RE.search(msg)) or bool(ERR_POS_RE.search(msg))


def names_stop(msg: str, stop) -> bool:
    """The error names the segment where the valid prefix stops and a byte position inside the batch at
    fault there (from its first byte to its end by its batchLength, or to the file's end when that
    length is no length): an absolute position in that file, not one relative to a read or a chunk."""
    name = os.path.basename(stop.file)
    try:
        size = os.path.getsize(stop.file)
        with open(stop.file, "rb") as f:
            f.seek(stop.position + 8)
            raw = f.read(4)
    except OSError:
        return False
    length = int.from_bytes(raw, "big", signed=True) if len(raw) == 4 else -1
    end = stop.position + 12 + length if 0 <= length and stop.position + 12 + length <= size else size
    return any(f == name and stop.position <= int(p) <= end for f, p in LOG_PLACE_RE.findall(msg))


# ---------------------------------------------------------------- outcomes


@dataclass
class Outcome:
    seed: int
    k: object
    target: str
    family: str
    mutation: str
    op: str
    cls: str
    detail: str = ""
    first_diff: int | None = None
    notes: list = field(default_factory=list)
    error: str = ""  # the error line / exception (last lines)
    seconds: float = 0.0
    maxrss_mb: float = 0.0
    vmpeak_mb: float | None = None
    oracle: str = ""
    bomb_every: int = DEFAULT_BOMB_EVERY  # which mutant indexes target the bomb: part of a mutant's identity
    store: str = "local"  # "s3": read through the S3 test server (also part of a mutant's identity)
    txn: bool = False  # the transaction mode's mutant (also part of its identity)

    def repro(self) -> str:
        s3 = " --s3" if self.store == "s3" else (" --txn" if self.txn else "")
        if isinstance(self.k, int):
            be = "" if self.bomb_every == DEFAULT_BOMB_EVERY or s3 else f" --bomb-every {self.bomb_every}"
            return (
                f"python -m tests.fuzz.runner{s3} --seed {self.seed} --only {self.k}{be} "
                f"--ops {O.OP_LETTER[self.op]} -v"
            )
        return f"python -m tests.fuzz.runner{s3} --clean --mutants 0 --ops {O.OP_LETTER[self.op]} -v"

    def message(self) -> str:
        s = (
            f"[{self.cls}] seed={self.seed} mutant={self.k} target={self.target} op={O.OP_LETTER[self.op]}:{self.op}"
            f"{' store=s3' if self.store == 's3' else ''}\n"
            f"  mutation: {self.mutation}\n"
            f"  oracle: {self.oracle}\n"
            f"  first differing offset: {self.first_diff}\n"
            f"  what happened: {self.detail}\n"
        )
        if self.error:
            s += "  error: " + self.error.strip().replace("\n", "\n         ") + "\n"
        for n in self.notes:
            s += f"  note: {n}\n"
        s += f"  reproduce: cd {REPO} && PYTHONPATH={REPO} {self.repro()}\n"
        return s


def worst(*pairs):
    """(cls, detail, first_diff) with the highest severity."""
    return max(pairs, key=lambda p: SEVERITY[p[0]])


# ---------------------------------------------------------------- output parsers (runner side)


class ApiParser:
    def __init__(self):
        self.records = []  # (offset, digest, preview) in the order served
        self.phases = collections.defaultdict(list)  # records per phase: "read" or "after"
        self.events = []
        self.garbage = []
        self.phase = "read"

    def __call__(self, line: bytes):
        try:
            obj = json.loads(line)
        except ValueError:
            if len(self.garbage) < 5:
                self.garbage.append(line[:200].decode("utf-8", "replace"))
            return
        if "o" in obj:
            self.phases[self.phase].append((obj["o"], obj["d"], obj["p"]))
        elif "ev" in obj:
            ev = obj["ev"]
            self.events.append(ev)
            if "reopened" in ev:
                self.phase = "after"
            elif "appended_phase" in ev:
                self.phase = "appended"
            elif "committed_phase" in ev:
                self.phase = "committed"

    def event(self, name):
        for ev in self.events:
            if name in ev:
                return ev[name]
        return None

    def excs(self):
        return [ev["exc"] for ev in self.events if "exc" in ev]


class ConsumeParser:
    def __init__(self):
        self.records = []
        self.garbage = []

    def __call__(self, line: bytes):
        try:
            obj = json.loads(line)
            b64 = set(obj.get("base64") or ())

            def field_bytes(name, v):
                if v is None:
                    return None
                return base64.b64decode(v) if name in b64 else v.encode("utf-8", "surrogatepass")

            key = field_bytes("key", obj.get("key"))
            value = field_bytes("value", obj.get("value"))
            headers = [(h[0], field_bytes(f"headers.{i}", h[1])) for i, h in enumerate(obj.get("headers") or [])]
            tstype = {"CreateTime": 0, "LogAppendTime": 1}.get(obj.get("timestampType"), -1)
            d = record_digest(obj["timestamp"], tstype, key, value, headers)
            from .reference import _short

            self.records.append(
                (
                    obj["offset"],
                    d,
                    f"ts={obj['timestamp']} key={_short(key)} value={_short(value)} headers={len(headers)}",
                )
            )
        except (ValueError, KeyError, TypeError, IndexError):
            if len(self.garbage) < 5:
                self.garbage.append(line[:200].decode("utf-8", "replace"))


BATCH_RE = re.compile(
    r"^baseOffset: (-?\d+) lastOffset: (-?\d+) count: (-?\d+) baseSequence: (-?\d+) lastSequence: (-?\d+) "
    r"producerId: (-?\d+) producerEpoch: (-?\d+) partitionLeaderEpoch: (-?\d+) isTransactional: (true|false) "
    r"isControl: (true|false) deleteHorizonMs: \S+ position: (-?\d+) "
    r"(CreateTime|LogAppendTime|NoTimestampType): (-?\d+) size: (-?\d+) magic: (-?\d+) compresscodec: (\S+) "
    r"crc: (-?\d+) isvalid: (true|false)$"
)
RECORD_RE = re.compile(
    r"^\| offset: (-?\d+) (CreateTime|LogAppendTime|NoTimestampType): (-?\d+) "
    r"keySize: (-?\d+) valueSize: (-?\d+) sequence: (-?\d+) "
)


class DumpParser:
    def __init__(self):
        self.sections = {}  # path -> dict
        self.cur = None
        self.pending = None
        self.garbage = []

    def _finish(self):
        if self.pending is not None:
            rec, parts = self.pending
            rec["tail"] = text_digest("\n".join(parts))
            self.pending = None

    def __call__(self, line: bytes):
        text = line.decode("utf-8", "replace")
        text = text.removesuffix("\n")
        if text.startswith("Dumping "):
            self._finish()
            self.cur = {"path": text[8:], "batches": [], "trailing": None, "other": [], "start": None}
            self.sections[self.cur["path"]] = self.cur
            return
        cur = self.cur
        if cur is None:
            self.garbage.append(text[:200])
            return
        if text.startswith("Log starting offset: "):
            self._finish()
            cur["start"] = text
            return
        m = BATCH_RE.match(text)
        if m:
            self._finish()
            g = m.groups()
            cur["batches"].append(
                {
                    "base_offset": int(g[0]),
                    "last_offset": int(g[1]),
                    "count": int(g[2]),
                    "base_sequence": int(g[3]),
                    "producer_id": int(g[5]),
                    "producer_epoch": int(g[6]),
                    "epoch": int(g[7]),
                    "transactional": g[8] == "true",
                    "control": g[9] == "true",
                    "position": int(g[10]),
                    "tstype": g[11],
                    "max_timestamp": int(g[12]),
                    "size": int(g[13]),
                    "magic": int(g[14]),
                    "codec": g[15],
                    "crc": int(g[16]),
                    "isvalid": g[17] == "true",
                    "records": [],
                    "error": None,
                }
            )
            return
        if text.startswith("| offset: "):
            self._finish()
            m = RECORD_RE.match(text)
            if not m or not cur["batches"]:
                self.garbage.append(text[:200])
                return
            g = m.groups()
            rec = {
                "offset": int(g[0]),
                "tstype": g[1],
                "timestamp": int(g[2]),
                "key_size": int(g[3]),
                "value_size": int(g[4]),
                "tail": None,
            }
            cur["batches"][-1]["records"].append(rec)
            i = text.find("headerKeys: [")
            self.pending = (rec, [text[i:] if i >= 0 else ""])
            return
        if text.startswith("| error"):
            self._finish()
            if cur["batches"]:
                cur["batches"][-1]["error"] = text
            else:
                cur["other"].append(text)
            return
        m = re.match(r"^Found (\d+) invalid bytes at the end of (.*)$", text)
        if m:
            self._finish()
            cur["trailing"] = int(m.group(1))
            return
        if self.pending is not None:  # a payload with a newline in it
            self.pending[1].append(text)
            return
        cur["other"].append(text[:200])

    def close(self):
        self._finish()


# ---------------------------------------------------------------- comparison


def compare(expected: list, got: list):
    """expected: [Rec]; got: [(offset, digest, preview)]. Returns (relation, first_diff, detail)."""
    n = min(len(expected), len(got))
    for i in range(n):
        e, g = expected[i], got[i]
        if e.offset != g[0]:
            exp_offsets = {r.offset for r in expected}
            served_before = {x[0] for x in got[:i]}
            if g[0] in exp_offsets and g[0] > e.offset:
                det = f"records missing from offset {e.offset} (the next one served is {g[0]})"
            elif g[0] in served_before:
                det = f"offset {g[0]} served twice (where {e.offset} was expected)"
            elif g[0] < e.offset:
                det = f"offset {g[0]} served out of order, or not in the valid prefix (where {e.offset} was expected)"
            else:
                det = f"offset {g[0]} served where {e.offset} was expected (not in the valid prefix)"
            return "differ", e.offset, det + f"; expected {e.preview}, got {g[2]}"
        if e.digest != g[1]:
            return "differ", e.offset, f"record at offset {e.offset} changed: expected {e.preview}, got {g[2]}"
    if len(got) > len(expected):
        g = got[len(expected)]
        where = f"the valid prefix ends after offset {expected[-1].offset}" if expected else "the valid prefix is empty"
        return (
            "differ",
            g[0],
            (f"{len(got) - len(expected)} record(s) beyond the valid prefix, from offset {g[0]} ({where}): {g[2]}"),
        )
    if len(got) < len(expected):
        e = expected[len(got)]
        return "prefix", e.offset, f"{len(got)} of {len(expected)} records, missing from offset {e.offset}"
    return "equal", None, ""


@dataclass
class Err:
    kind: str  # "project", "other", "memory"
    msg: str
    place_ok: bool = True


def classify_read(expected: list, stop, got: list, err: Err | None, *, what: str = "records", exact: bool = False):
    """exact: the reader read the very bytes the oracle did (reads, not after a writer's recovery), so its
    error, after all or part of the valid prefix, must name the place where that prefix stops (names_stop)."""
    rel, first, det = compare(expected, got)
    notes = []
    if err is not None and err.kind == "memory":
        return ("MEMORY", f"memory error after {len(got)} {what}: {err.msg[-300:]}", first), notes
    if err is None:
        if rel == "equal":
            return ("OK", "", None), notes
        if rel == "prefix":
            return ("SILENT_WRONG", f"ended without an error: {det}", first), notes
        return ("SILENT_WRONG", det, first), notes
    if rel == "differ":
        return ("SILENT_WRONG", f"before the error: {det}", first), notes
    if err.kind != "project":
        return (
            "BAD_ERROR",
            f"not a project error after {len(got)} of {len(expected)} {what}: {err.msg[-400:]}",
            first,
        ), notes
    if not err.place_ok:
        return ("BAD_ERROR", f"error names no file and byte position: {err.msg[-400:]}", first), notes
    if exact and stop is not None and not names_stop(err.msg, stop):
        return (
            "BAD_ERROR",
            f"after {len(got)} of {len(expected)} {what}, the error does not name {os.path.basename(stop.file)} "
            f"and a position in the batch at {stop.position} where the valid prefix stops: {err.msg[-400:]}",
            first,
        ), notes
    if rel == "equal" and stop is not None:
        if stop.kind == "torn":
            notes.append("error at a torn tail of the active segment (docs: readers stop before it quietly)")
            return ("ERROR_OK", "valid prefix, then an error at a torn tail", None), notes
        return ("OK", "valid prefix, then an error", None), notes
    if rel == "equal":
        notes.append("error although the whole log is valid")
        return ("ERROR_OK", "all records, then an error on a valid log", None), notes
    notes.append(f"served {len(got)} of {len(expected)} records of the valid prefix before the error")
    return ("ERROR_OK", det, first), notes


def _common_prefix(expected, got) -> int:
    n = 0
    for e, g in zip(expected, got, strict=False):
        if e.offset != g[0] or e.digest != g[1]:
            break
        n += 1
    return n


def best_over_views(views, fn, got=None, start=None):
    """fn(view) -> ((cls, detail, first), notes); the least severe result over the views (ties: the
    view that matches the longest prefix of what was served, so the detail describes the closest one)."""

    def key(r):
        (res, _), v = r
        recs = v.records if start is None else [x for x in v.records if x.offset >= start]
        return SEVERITY[res[0]], -_common_prefix(recs, got or [])

    results = [(fn(v), v) for v in views]
    (res, notes), v = min(results, key=key)
    return res, notes, v


# ---------------------------------------------------------------- the process-level verdict


def process_verdict(res: O.OpResult) -> tuple | None:
    if res.hung:
        return ("HANG", f"no result after {res.seconds:.0f} s (killed)", None)
    if res.signal is not None:
        if res.signal == 9 or MEM_RE.search(res.stderr):
            return ("MEMORY", f"killed by signal {res.signal}: {res.stderr[-300:]}", None)
        return ("BAD_ERROR", f"crashed with signal {res.signal}: {res.stderr[-300:]}", None)
    return None


def cli_error(res: O.OpResult, *, single_line: bool = True) -> Err | None:
    err_lines = [ln for ln in res.stderr.splitlines() if ln.startswith("kafkalog: error: ")]
    if MEM_RE.search(res.stderr):
        return Err("memory", res.stderr[-600:])
    if TRACEBACK_RE.search(res.stderr):
        return Err("other", res.stderr[-1500:])
    if res.exit_code == 0:
        return None
    if res.exit_code != 1:
        return Err("other", f"exit code {res.exit_code}: {res.stderr[-600:]}")
    if not err_lines:
        return Err("other", f"exit 1 without a `kafkalog: error:` line: {res.stderr[-600:]}")
    if single_line and len(err_lines) > 1:
        return Err("other", f"{len(err_lines)} error lines: " + " | ".join(err_lines)[-600:])
    msg = err_lines[0]
    return Err("project", msg, names_place(msg))


def api_error(exc: dict | None) -> Err | None:
    if exc is None:
        return None
    text = f"{exc['module']}.{exc['type']}: {exc['msg']}"
    if exc["memory"] or MEM_RE.search(exc["type"] + " " + exc["msg"]):
        return Err("memory", text)
    if not exc["kafka"]:
        return Err("other", text + "\n" + exc["tb"][-1200:])
    return Err("project", text, names_place(exc["msg"]))


# ---------------------------------------------------------------- dump-log


def classify_dump(files: list, dviews: dict, parsed: DumpParser, res: O.OpResult):
    problems = []
    notes = []
    err_lines = [ln for ln in res.stderr.splitlines() if ln.startswith("kafkalog: error: ")]
    if MEM_RE.search(res.stderr):
        return ("MEMORY", f"memory error: {res.stderr[-400:]}", None), notes
    if TRACEBACK_RE.search(res.stderr):
        problems.append(("BAD_ERROR", f"traceback: {res.stderr[-1200:]}", None))
    if res.exit_code not in (0, 1):
        problems.append(("BAD_ERROR", f"exit code {res.exit_code}", None))
    for ln in err_lines:
        index_file = bool(re.search(r"\d{20}\.(index|timeindex)\b", ln))
        if not names_place(ln, file_only=index_file):
            problems.append(("BAD_ERROR", f"error does not name a file and position: {ln[:400]}", None))
    if parsed.garbage:
        problems.append(("BAD_ERROR", f"unparsable output: {parsed.garbage[:2]}", None))
    for f in files:
        if not f.endswith(".log"):
            continue
        exp = dviews[f]
        sec = parsed.sections.get(f)
        name = os.path.basename(f)
        f_errs = [ln for ln in err_lines if name in ln]
        if sec is None:
            problems.append(("SILENT_WRONG", f"{name} not dumped", None))
            continue
        got_b = sec["batches"]
        stopped = False
        for i, db in enumerate(exp.batches):
            b = db.batch
            if i >= len(got_b):
                stopped = True
                if db.magic_unknown and any(f"position {b.position}" in ln for ln in f_errs):
                    break  # stopped at a batch of an unknown magic, naming it: fine
                if f_errs:
                    notes.append(f"{name}: dump stopped with an error before batch {i} @ {b.position}")
                    problems.append(
                        ("ERROR_OK", f"{name}: stopped at batch {i} with: {f_errs[0][:300]}", b.base_offset)
                    )
                else:
                    problems.append(
                        (
                            "SILENT_WRONG",
                            f"{name}: batch {i} @ position {b.position} (baseOffset "
                            f"{b.base_offset}) missing from the dump, no error",
                            b.base_offset,
                        )
                    )
                break
            g = got_b[i]
            want = {
                "position": b.position,
                "size": b.size,
                "base_offset": b.base_offset,
                "last_offset": b.last_offset,
                "count": b.record_count,
                "magic": b.magic,
                "crc": b.crc,
                "isvalid": b.crc_ok,
                "producer_id": b.producer_id,
                "producer_epoch": b.producer_epoch,
                "base_sequence": b.base_sequence,
                "epoch": b.epoch,
                "control": b.control,
                "transactional": bool(b.attributes & 0x10),
                "tstype": TSTYPE_NAMES[b.tstype],
                "max_timestamp": b.max_timestamp,
            }
            bad = {k: (v, g[k]) for k, v in want.items() if g[k] != v}
            if bad:
                problems.append(
                    (
                        "SILENT_WRONG",
                        f"{name}: batch {i} @ {b.position} printed wrong: "
                        + ", ".join(f"{k} {w} printed as {h}" for k, (w, h) in bad.items()),
                        b.base_offset,
                    )
                )
                break
            recs = g["records"]
            exp_recs = b.records
            if db.magic_unknown:  # printed as if v2: its records may decode or not
                if g["error"] is not None and not names_place(g["error"]):
                    problems.append(
                        (
                            "BAD_ERROR",
                            f"{name}: batch error does not name file/position: {g['error'][:300]}",
                            b.base_offset,
                        )
                    )
                continue
            prefix_ok = len(recs) <= len(exp_recs) and all(
                _dump_rec_eq(e, r, b.control) for e, r in zip(exp_recs, recs, strict=False)
            )
            if db.expect_error:
                if g["error"] is None:
                    problems.append(
                        (
                            "SILENT_WRONG",
                            f"{name}: batch {i} @ {b.position}: records cannot be read "
                            f"({b.structure_error}) but the dump shows "
                            f"{len(recs)} record(s) and no error",
                            b.base_offset,
                        )
                    )
                elif not prefix_ok:
                    problems.append(
                        (
                            "SILENT_WRONG",
                            f"{name}: batch {i} @ {b.position}: records printed before the error differ",
                            b.base_offset,
                        )
                    )
                elif not names_place(g["error"]):
                    problems.append(
                        (
                            "BAD_ERROR",
                            f"{name}: batch error does not name file/position: {g['error'][:300]}",
                            b.base_offset,
                        )
                    )
                continue
            if g["error"] is not None:
                if not prefix_ok:
                    problems.append(
                        ("SILENT_WRONG", f"{name}: batch {i}: records before the error differ", b.base_offset)
                    )
                elif not names_place(g["error"]):
                    problems.append(
                        (
                            "BAD_ERROR",
                            f"{name}: batch error does not name file/position: {g['error'][:300]}",
                            b.base_offset,
                        )
                    )
                else:
                    notes.append(
                        f"{name}: batch {i} @ {b.position} readable by Kafka's rules but dump-log says: "
                        f"{g['error'][:200]}"
                    )
                    problems.append(
                        ("ERROR_OK", f"{name}: error on a decodable batch: {g['error'][:300]}", b.base_offset)
                    )
                continue
            if len(recs) != len(exp_recs) or not prefix_ok:
                j = next(
                    (
                        j
                        for j, (e, r) in enumerate(zip(exp_recs, recs, strict=False))
                        if not _dump_rec_eq(e, r, b.control)
                    ),
                    min(len(recs), len(exp_recs)),
                )
                off = exp_recs[j].offset if j < len(exp_recs) else recs[j]["offset"]
                problems.append(
                    (
                        "SILENT_WRONG",
                        f"{name}: batch {i} @ {b.position}: {len(recs)} record line(s) "
                        f"printed, {len(exp_recs)} expected; first difference at record {j}"
                        f" (offset {off})",
                        off,
                    )
                )
                break
        if stopped:
            continue
        if len(got_b) > len(exp.batches):
            g = got_b[len(exp.batches)]
            problems.append(
                ("SILENT_WRONG", f"{name}: extra batch printed at position {g['position']}", g["base_offset"])
            )
            continue
        if exp.stop_error:
            if not any(f"position {exp.stop_position}" in ln for ln in f_errs):
                if f_errs:
                    problems.append(("ERROR_OK", f"{name}: stop error at another place: {f_errs[0][:300]}", None))
                else:
                    problems.append(
                        (
                            "SILENT_WRONG",
                            f"{name}: bytes at {exp.stop_position} cannot be a batch "
                            f"({exp.stop_error}) but the dump says nothing",
                            None,
                        )
                    )
        elif exp.trailing:
            if sec["trailing"] != exp.trailing:
                if f_errs:
                    problems.append(
                        (
                            "ERROR_OK",
                            f"{name}: error instead of 'Found {exp.trailing} invalid bytes': {f_errs[0][:300]}",
                            None,
                        )
                    )
                else:
                    problems.append(
                        (
                            "SILENT_WRONG",
                            f"{name}: {exp.trailing} invalid bytes at the end, dump says {sec['trailing']}",
                            None,
                        )
                    )
        elif sec["trailing"]:
            problems.append(
                ("SILENT_WRONG", f"{name}: dump reports {sec['trailing']} invalid bytes, there are none", None)
            )
    if not problems:
        return ("OK", "", None), notes
    return worst(*problems), notes


def _dump_rec_eq(e: Rec, r: dict, control: bool) -> bool:
    if (e.offset, TSTYPE_NAMES[e.tstype], e.timestamp, e.key_size, e.value_size) != (
        r["offset"],
        r["tstype"],
        r["timestamp"],
        r["key_size"],
        r["value_size"],
    ):
        return False
    return control or r["tail"] == e.tail_digest


# ---------------------------------------------------------------- one mutant


class ObjectStore:
    """The object-store mode's bucket: each mutant's ROOT is uploaded under a prefix of its own, read
    through s3:// URLs with these storage options, and removed afterwards."""

    def __init__(self, bucket: str, storage_options: dict):
        self.bucket = bucket
        self.storage_options = dict(storage_options)
        self._local = threading.local()

    def fs(self):
        fs = getattr(self._local, "fs", None)
        if fs is None:  # one per thread: the runner's threads upload in parallel
            import s3fs

            fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, **self.storage_options)
            self._local.fs = fs
        return fs

    def upload(self, root: str, prefix: str) -> str:
        """Every file under ROOT (not the .lock files) as an object under prefix; returns the s3:// URL."""
        objs = {}
        for d, _, names in os.walk(root):
            for n in names:
                if n == ".lock":
                    continue
                p = os.path.join(d, n)
                with open(p, "rb") as f:
                    objs[f"{self.bucket}/{prefix}/{os.path.relpath(p, root)}"] = f.read()
        self.fs().pipe(objs)
        return f"s3://{self.bucket}/{prefix}"

    def snapshot(self, url: str) -> dict:
        """{key: ETag} under a URL: a reader must not change any of it."""
        found = self.fs().find(url[len("s3://") :], detail=True)
        return {k: v.get("ETag") for k, v in found.items()}

    def remove(self, url: str) -> None:
        try:
            self.fs().rm(url[len("s3://") :], recursive=True)
        except FileNotFoundError:
            pass


@dataclass
class Target:
    topic: str
    kind: str
    codec: str


class Corpus:
    def __init__(self, path: str):
        self.path = path
        with open(os.path.join(path, "manifest.json")) as f:
            self.manifest = json.load(f)
        self.root = self.manifest["root"]

    @staticmethod
    def build(path: str, *, bomb: bool = True) -> Corpus:
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        cmd = [sys.executable, "-m", "tests.fuzz.corpus", path] + ([] if bomb else ["--no-bomb"])
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"building the corpus failed:\n{proc.stdout}\n{proc.stderr}")
        return Corpus(path)

    def target(self, topic: str) -> Target:
        p = self.manifest["partitions"][topic]
        return Target(topic, p["kind"], p["codec"])

    def copy_partition(self, topic: str, root: str) -> str:
        """A ROOT holding only this topic: topic file, partition dir, its checkpoint lines."""
        os.makedirs(root)
        shutil.copy2(os.path.join(self.root, f"{topic}.kafkalog-topic.json"), root)
        part = os.path.join(root, f"{topic}-0")
        shutil.copytree(os.path.join(self.root, f"{topic}-0"), part)
        for name in ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint"):
            src = os.path.join(self.root, name)
            if not os.path.exists(src):
                continue
            with open(src) as f:
                lines = f.read().split("\n")
            keep = [ln for ln in lines[2:] if ln.startswith(f"{topic} ")]
            if keep:
                with open(os.path.join(root, name), "w") as f:
                    f.write(f"0\n{len(keep)}\n" + "".join(ln + "\n" for ln in keep))
        return part


def snapshot(part_dir: str) -> dict:
    out = {}
    for n in sorted(os.listdir(part_dir)):
        if n == ".lock":
            continue
        p = os.path.join(part_dir, n)
        if os.path.isfile(p):
            with open(p, "rb") as f:
                out[n] = crc32c.crc32c(f.read())
    return out


def _dump_files(part_dir: str) -> list:
    return sorted(
        os.path.join(part_dir, n) for n in os.listdir(part_dir) if re.match(r"^\d{20}\.(log|index|timeindex)$", n)
    )


class Runner:
    def __init__(
        self,
        corpus: Corpus,
        *,
        seed: int,
        work: str,
        jobs: int = 1,
        timeout: float = DEFAULT_TIMEOUT,
        mem_cap: int | None = None,
        ops=None,
        keep: bool = False,
        bomb_every: int = DEFAULT_BOMB_EVERY,
        verbose: bool = False,
        s3: ObjectStore | None = None,
        txn: bool = False,
    ):
        if s3 is not None:
            bad = [op for op in ops or () if op not in S3_OPS]
            if bad:
                raise ValueError(f"the object-store mode runs the reading operations only, not {bad}")
            ops = ops or S3_OPS
            bomb_every = 0  # the bomb is read locally; 3 GB through the test server says nothing more
        if txn:
            ops = ops or list(O.TXN_OPS)
            bomb_every = 0
        self.s3 = s3
        self.txn = txn
        self.corpus = corpus
        self.seed = seed
        self.work = work
        self.jobs = jobs
        self.timeout = timeout
        self.mem_cap_arg = mem_cap
        self.ops_given = bool(ops)  # else the txn partition gets g and h added to a-f
        self.ops = ops or list(O.OPS)
        self.keep = keep
        self.bomb_every = bomb_every
        self.verbose = verbose
        self._local = threading.local()
        self._zygotes = []
        self._lock = threading.Lock()
        self.mem_cap = None
        self.oracle_seconds = 0.0
        self._pool = None

    # -- zygotes
    def zygote(self) -> O.Zygote:
        z = getattr(self._local, "z", None)
        if z is None or z.proc.poll() is not None:
            z = O.Zygote()
            self._local.z = z
            with self._lock:
                self._zygotes.append(z)
                if self.mem_cap is None:
                    self.mem_cap = self.mem_cap_arg or (z.vm + DEFAULT_MEM_HEADROOM_MB * 2**20)
        return z

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        for z in self._zygotes:
            z.close()
        self._zygotes = []

    # -- targets
    def target_of(self, k: int) -> str:
        if self.txn:
            return "txn"
        if self.s3 is not None:
            return S3_TARGETS[k % len(S3_TARGETS)]
        if (
            self.bomb_every
            and k % self.bomb_every == self.bomb_every - 1
            and "bomb" in self.corpus.manifest["partitions"]
        ):
            return "bomb"
        return TARGETS[k % len(TARGETS)]

    def run_op(self, req: dict, parser) -> O.OpResult:
        z = self.zygote()
        req = dict(req, mem_cap=self.mem_cap)
        return z.run(req, parser, timeout=self.timeout)

    # -- one mutant
    def run_mutant(self, k, seed: int | None = None, ops=None) -> list:
        seed = self.seed if seed is None else seed
        default_ops = ops is None
        ops = list(self.ops if ops is None else ops)
        if isinstance(k, str):  # "clean:<topic>"
            topic = k.split(":", 1)[1]
            rng = None
        else:
            topic = self.target_of(k)
            rng = random.Random(f"txn:{seed}:{k}" if self.txn else f"{seed}:{k}")
        tgt = self.corpus.target(topic)
        if default_ops and not self.ops_given and tgt.kind == "txn" and self.s3 is None:
            ops += [op for op in O.TXN_OPS if op not in ops]
        mdir = os.path.join(self.work, f"s{seed}-m{k}".replace(":", "-"))
        if os.path.exists(mdir):
            shutil.rmtree(mdir)
        root_a = os.path.join(mdir, "a", "root")
        part_a = self.corpus.copy_partition(topic, root_a)
        if rng is not None and self.txn:
            mut = MT.mutate_txn(rng, part_a)
            family, desc = mut.family, f"{topic}-0/{mut.desc}"
        elif rng is not None:
            fam = "chunk" if tgt.kind == "chunky" and rng.random() < CHUNK_SHARE else None
            mut = M.mutate(rng, part_a, has_swap=tgt.kind == "swap", family=fam)
            family, desc = mut.family, f"{topic}-0/{mut.desc}"
        else:
            family, desc = "clean", f"{topic}-0 unmutated"
        root_e = os.path.join(mdir, "e", "root")
        root_f = os.path.join(mdir, "f", "root")
        if "recover_ckpt" in ops:
            shutil.copytree(root_a, root_e)
        if "recover_full" in ops:
            shutil.copytree(root_a, root_f)
            ck = os.path.join(root_f, "recovery-point-offset-checkpoint")
            if os.path.exists(ck):
                os.remove(ck)
        t0 = time.monotonic()
        views = partition_views(root_a, topic)
        files = _dump_files(part_a)
        dviews = {f: dump_view(f) for f in files if f.endswith(".log")} if "dump" in ops else {}
        self.oracle_seconds += time.monotonic() - t0
        oracle_desc = "; ".join(view_summary(v) for v in views)
        base = dict(
            seed=seed,
            k=k,
            target=topic,
            family=family,
            mutation=desc,
            oracle=oracle_desc,
            bomb_every=self.bomb_every,
            store="s3" if self.s3 else "local",
            txn=self.txn,
        )
        # the middle of the shortest valid prefix over the views: no view has damage before it
        mids = [v.records[len(v.records) // 2].offset for v in views if v.records]
        mid = min(mids) if mids else views[0].log_start
        outcomes = []
        url = None
        if self.s3 is not None:  # the same bytes as objects; the oracle reads the local copy
            url = self.s3.upload(
                root_a, f"fuzz/{os.path.basename(self.work.rstrip('/'))}/s{seed}-m{k}".replace(":", "-")
            )
        try:
            self._ops_on(
                ops, url, root_a, root_e, root_f, topic, tgt, files, views, dviews, mid, base, part_a, outcomes
            )
        finally:
            if url is not None:
                self.s3.remove(url)
        if not self.keep:
            shutil.rmtree(mdir, ignore_errors=True)
        return outcomes

    def _ops_on(self, ops, url, root_a, root_e, root_f, topic, tgt, files, views, dviews, mid, base, part_a, outcomes):
        k = base["k"]
        if url is not None:
            opts = self.s3.storage_options
            to_url = {f: f"{url}/{os.path.relpath(f, root_a)}" for f in files}
            read_root = url
            before = self.s3.snapshot(url)
        else:
            opts, to_url, read_root = None, None, root_a
            before = snapshot(part_a)
        for op in ops:
            if op in ("recover_ckpt", "recover_full"):
                root = root_e if op == "recover_ckpt" else root_f
                out = self._recover(
                    op, root, topic, tgt, [v for v in views if not v.reader_only] or views[:1], root_a, base
                )
            else:
                out = self._read_like(op, read_root, topic, files, views, dviews, mid, base, opts, to_url)
                after = self.s3.snapshot(url) if url is not None else snapshot(part_a)
                if after != before:
                    changed = sorted(set(before.items()) ^ set(after.items()))
                    out.notes.append(f"files changed: {changed[:6]}")
                    if SEVERITY[out.cls] < SEVERITY["SILENT_WRONG"]:
                        out.cls, out.detail = "SILENT_WRONG", f"a reader changed files in the partition: {changed[:6]}"
                    before = after
            outcomes.append(out)
            if self.verbose:
                print(out.message() if out.cls != "OK" else f"[OK] {k} {op}", flush=True)

    def _read_like(self, op, root, topic, files, views, dviews, mid, base, opts=None, to_url=None) -> Outcome:
        """One reading operation on ROOT (a local dir, or the mutant's s3:// URL with `opts`; `to_url`
        maps each local file to its object's URL, which dump-log then reads)."""
        if op == "dump":
            parser = DumpParser()
            urls = [to_url[f] for f in files] if to_url else files
            res = self.run_op({"op": "dump", "files": urls, "storage_options": opts}, parser)
            parser.close()
            if to_url:  # judged per local file: the oracle's dump views are of the local copy
                back = {u: f for f, u in to_url.items()}
                parser.sections = {back.get(u, u): sec for u, sec in parser.sections.items()}
            pv = process_verdict(res)
            if pv:
                cls, det, first = pv
                notes = []
            else:
                (cls, det, first), notes = classify_dump(files, dviews, parser, res)
            return self._outcome(base, op, cls, det, first, notes, res, err_text=_err_tail(res.stderr))
        committed = op in ("read_committed", "consume_committed")
        if committed:
            views = views + [w for w in (self.written_committed_view(topic, v) for v in views) if w is not None]

        def expected(v):  # what the view says a reader at this op's isolation level gets, and where it ends
            return (v.committed, v.committed_stop) if committed else (v.records, v.stop)

        if op in ("consume", "consume_committed"):
            parser = ConsumeParser()
            res = self.run_op({"op": op, "root": root, "topic": topic, "storage_options": opts}, parser)
            pv = process_verdict(res)
            err = None if pv else cli_error(res)
            if pv:
                (cls, det, first), notes = pv, []
            else:
                (cls, det, first), notes, _ = best_over_views(
                    views, lambda v: classify_read(*expected(v), parser.records, err, exact=True), parser.records
                )
                if parser.garbage:
                    cls, det = worst(
                        (cls, det, first), ("BAD_ERROR", f"unparsable output: {parser.garbage[:2]}", None)
                    )[:2]
            return self._outcome(base, op, cls, det, first, notes, res, err_text=_err_tail(res.stderr))
        parser = ApiParser()
        start = mid if op == "read_mid" else None
        req = {"op": op, "root": root, "topic": topic, "offset": start, "storage_options": opts}
        if committed:
            req["isolation_level"] = "read_committed"
        res = self.run_op(req, parser)
        pv = process_verdict(res)
        excs = parser.excs()
        err = api_error(excs[0]) if excs else None
        got = parser.phases["read"]
        if pv:
            (cls, det, first), notes = pv, []
        elif not excs and not parser.event("done"):
            (cls, det, first), notes = (
                ("BAD_ERROR", f"child ended without a result (exit {res.exit_code}): {res.stderr[-600:]}", None),
                [],
            )
        else:

            def fn(v):
                exp, stop = expected(v)
                exp = exp if start is None else [r for r in exp if r.offset >= start]
                return classify_read(exp, stop, got, err, exact=True)

            (cls, det, first), notes, _ = best_over_views(views, fn, got, start)
        if parser.garbage:
            notes.append(f"the engine wrote to stdout: {parser.garbage[:2]}")
        if start is not None:
            notes.append(f"read from offset {start}")
        return self._outcome(
            base, op, cls, det, first, notes, res, err_text=(err.msg if err else _err_tail(res.stderr))
        )

    def written_committed_view(self, topic: str, v):
        """For a view whose valid prefix stops at a damaged batch: the same view whose read_committed answer
        is the manifest's committed records below that batch (see the module docstring), else None."""
        part = self.corpus.manifest["partitions"].get(topic, {})
        stop = v.committed_stop
        if "committed" not in part or stop is None or stop is not v.stop:
            return None
        bound = v.end_offset if stop.batch_base_offset is None else min(v.end_offset, stop.batch_base_offset)
        recs = {r.offset: r for r in v.records}
        exp = [recs[o] for o, d in part["committed"] if o < bound and o in recs and recs[o].digest == d]
        w = dataclasses.replace(v, name=f"{v.name} (committed as written)", committed=exp)
        return w

    def _recover(self, op, root, topic, tgt, pre_views, root_a, base) -> Outcome:
        parser = ApiParser()
        txn = tgt.kind == "txn"
        res = self.run_op({"op": op, "root": root, "topic": topic, "codec": tgt.codec, "committed": txn}, parser)
        pv = process_verdict(res)
        notes = []
        excs = parser.excs()
        if pv:
            return self._outcome(base, op, *pv, notes, res, err_text=_err_tail(res.stderr))
        if not excs and not parser.event("done"):
            return self._outcome(
                base,
                op,
                "BAD_ERROR",
                f"child ended without a result (exit {res.exit_code})",
                None,
                notes,
                res,
                err_text=res.stderr[-1500:],
            )
        t0 = time.monotonic()
        post_views = partition_views(root, topic)
        self.oracle_seconds += time.monotonic() - t0
        verdicts = []
        write_exc = next((e for e in excs if e["stage"] in ("open-writable", "append", "close")), None)
        read_exc = next((e for e in excs if e["stage"] in ("reopen", "read-after")), None)
        appended = parser.event("appended")
        opened = parser.event("opened")
        if opened:
            notes.append(f"opened for writing: log start {opened['log_start']}, log end {opened['log_end']}")
        # 1. nothing of the valid prefix may be lost
        pair = None
        for P in pre_views:
            for Q in post_views:
                if len(Q.records) >= len(P.records) and all(
                    a.offset == b.offset and a.digest == b.digest for a, b in zip(P.records, Q.records, strict=False)
                ):
                    pair = (P, Q)
                    break
            if pair:
                break
        if pair is None and op == "recover_ckpt":
            # damage below the recovery point is not reread: when the batch just before it is the
            # one whose header lies (offsets past what follows), the append makes that visible and
            # the post-session oracle stops one batch earlier; nothing the writer did lost it
            for P in pre_views:
                if P.stop is None or self._append_must_be_readable(op, root_a, topic, P):
                    continue
                for Q in post_views:
                    if (
                        Q.stop is not None
                        and os.path.basename(Q.stop.file) == os.path.basename(P.stop.file)
                        and Q.stop.position < P.stop.position
                        and Q.stop.batch_base_offset is not None
                        and [(r.offset, r.digest) for r in Q.records]
                        == [(r.offset, r.digest) for r in P.records if r.offset < Q.stop.batch_base_offset]
                    ):
                        kept = [r for r in P.records if r.offset < Q.stop.batch_base_offset]
                        pair = (dataclasses.replace(P, records=kept, end_offset=Q.stop.batch_base_offset), Q)
                        notes.append(
                            f"the batch at {Q.stop.position} before the damage below the recovery point "
                            f"claims offsets past it: {Q.stop.reason}"
                        )
                        break
                if pair:
                    break
        if pair is None:  # describe it against the closest pair of views
            P, Q = max(
                ((p, q) for p in pre_views for q in post_views),
                key=lambda pq: _common_prefix(pq[0].records, [(r.offset, r.digest) for r in pq[1].records]),
            )
            rel, first, det = compare(P.records, [(r.offset, r.digest, r.preview) for r in Q.records])
            verdicts.append(
                (
                    "LOST",
                    f"after opening for writing: {det} (before: {view_summary(P)}; "
                    f"post-session oracle: {view_summary(Q)})",
                    first,
                )
            )
        else:
            P, Q = pair
        # 2. the appended record: no reused offset; readable when recovery had to cut the damage
        app_digest = O.appended_digest()
        if write_exc is not None:
            err = api_error(write_exc)
            if err.kind == "memory":
                verdicts.append(("MEMORY", f"{write_exc['stage']}: {err.msg[-300:]}", None))
            elif err.kind != "project":
                verdicts.append(("BAD_ERROR", f"{write_exc['stage']}: {err.msg[-600:]}", None))
            elif not err.place_ok:
                verdicts.append(
                    (
                        "BAD_ERROR",
                        f"{write_exc['stage']}: error names no file and byte position: {err.msg[-400:]}",
                        None,
                    )
                )
            else:
                notes.append(f"{write_exc['stage']} refused: {err.msg[-300:]}")
                verdicts.append(("ERROR_OK", f"{write_exc['stage']} raised a project error", None))
        if appended:
            x = appended["first"]
            must_read = self._append_must_be_readable(op, root_a, topic, P)
            # reused: the offset of a record of the valid prefix, or (where recovery had to cut the
            # damage, so the log end is the valid prefix's end) inside the last valid batch's range
            last_rec = P.records[-1].offset if P.records else -1
            if x <= last_rec or (must_read and x < P.end_offset):
                verdicts.append(
                    (
                        "SILENT_WRONG",
                        f"the append got offset {x}, below the valid prefix's end {P.end_offset}: an offset is reused",
                        x,
                    )
                )
            in_q = [r for r in Q.records if r.offset == x and r.digest == app_digest]
            if in_q and len(Q.records) > len(P.records) + 1:
                notes.append(
                    f"{len(Q.records) - len(P.records) - 1} record(s) beyond the valid prefix are readable "
                    f"after the session, before the appended one"
                )
            if must_read and not (in_q and Q.records[-1].offset == x):
                verdicts.append(
                    (
                        "LOST",
                        f"the record appended at offset {x} after recovery is not readable "
                        f"(post-session oracle: {view_summary(Q)}; valid prefix before: "
                        f"{view_summary(P)})",
                        x,
                    )
                )
            elif not in_q:
                why = (
                    "a batch whose records cannot be read (recovery does not parse records)"
                    if P.stop and P.stop.level == "records"
                    else "damage below the recovery point"
                )
                notes.append(f"appended record at {x} sits behind {why}")
                own = parser.phases["appended"]
                if not (own and own[0][0] == x and own[0][1] == app_digest):
                    verdicts.append(
                        (
                            "LOST",
                            f"the record appended at offset {x}, behind {why}, cannot be read "
                            f"from its own offset either: {parser.event('appended_read_exc')}",
                            x,
                        )
                    )
        # 3. the read afterwards, against the post-session oracle
        got = parser.phases["after"]
        err = api_error(read_exc)
        (cls, det, first), rnotes, _ = best_over_views(
            post_views, lambda v: classify_read(v.records, v.stop, got, err), got
        )
        notes += rnotes
        if cls != "OK":
            det = f"read after reopening: {det}"
        verdicts.append((cls, det, first))
        if txn:  # 4. the read at read_committed afterwards, against the post-session oracle's answer
            cexc = next((e for e in excs if e["stage"] == "read-committed"), None)
            cgot = parser.phases["committed"]
            if cexc is None and not parser.event("committed_done"):
                verdicts.append(("BAD_ERROR", "the read_committed read after the session gave no result", None))
            else:
                alt = [w for w in (self.written_committed_view(topic, v) for v in post_views) if w is not None]
                (ccls, cdet, cfirst), cnotes, _ = best_over_views(
                    post_views + alt,
                    lambda v: classify_read(v.committed, v.committed_stop, cgot, api_error(cexc)),
                    cgot,
                )
                notes += [f"read_committed: {n}" for n in cnotes]
                verdicts.append((ccls, f"read_committed after reopening: {cdet}" if ccls != "OK" else "", cfirst))
        cls, det, first = worst(*verdicts)
        err_text = "\n".join(f"{e['stage']}: {e['module']}.{e['type']}: {e['msg']}" for e in excs)
        if any(not api_error(e) or api_error(e).kind != "project" for e in excs):
            err_text += "\n" + "\n".join(e["tb"][-1200:] for e in excs)
        return self._outcome(base, op, cls, det, first, notes, res, err_text=err_text)

    def _append_must_be_readable(self, op, root_a, topic, P) -> bool:
        if P.stop is None:
            return True
        if P.stop.level == "records":  # recovery validates batches, not their records (see reference.Stop)
            return False
        if op == "recover_full":
            return True
        # damage below the recovery point is flushed data gone bad, which recovery does not reread (as
        # Kafka after a clean shutdown); the writer appends behind it, readable from its own offset
        r = read_checkpoint(root_a, "recovery-point-offset-checkpoint").get((topic, 0), 0)
        at = P.end_offset if P.stop.batch_base_offset is None else min(P.end_offset, P.stop.batch_base_offset)
        return at >= r  # (a damaged header's own offsets say little: the lower of the two places it)

    def _outcome(self, base, op, cls, det, first, notes, res, err_text=""):
        return Outcome(
            **base,
            op=op,
            cls=cls,
            detail=det,
            first_diff=first,
            notes=list(notes),
            error=(err_text or "")[-2500:],
            seconds=round(res.seconds, 2),
            maxrss_mb=round(res.maxrss_kb / 1024, 1),
            vmpeak_mb=round(res.vmpeak / 2**20, 1) if res.vmpeak else None,
        )

    def run(self, ks, *, seed: int | None = None, ops=None) -> list:
        """Every operation on each mutant of `ks` (ints, or "clean:<topic>"); outcomes in order."""
        seed = self.seed if seed is None else seed
        outcomes = []
        if self.jobs <= 1:
            for k in ks:
                outcomes += self._safe(k, seed, ops)
        else:
            if self._pool is None:  # kept for the Runner's life: each thread keeps its fork server
                self._pool = cf.ThreadPoolExecutor(self.jobs, thread_name_prefix="fuzz")
            for res in self._pool.map(lambda k: self._safe(k, seed, ops), ks):
                outcomes += res
        return outcomes

    def _safe(self, k, seed, ops):
        try:
            return self.run_mutant(k, seed, ops)
        except M.Skip as e:
            return [Outcome(seed, k, "?", "skip", str(e), op, "OK", "mutation skipped") for op in (ops or self.ops)]


def _err_tail(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    return "\n".join(lines[-8:])


# ---------------------------------------------------------------- reporting


def summary_table(outcomes: list) -> str:
    counts = collections.defaultdict(collections.Counter)
    for o in outcomes:
        counts[o.op][o.cls] += 1
    ops = [op for op in O.TXN_OPS if op in counts]
    w = max(len(c) for c in CLASSES) + 1
    head = f"{'op':<20}" + "".join(f"{c:>{w}}" for c in CLASSES) + f"{'total':>7}"
    lines = [head, "-" * len(head)]
    tot = collections.Counter()
    for op in ops:
        c = counts[op]
        tot.update(c)
        lines.append(
            f"{O.OP_LETTER[op] + ' ' + op:<20}" + "".join(f"{c[x]:>{w}}" for x in CLASSES) + f"{sum(c.values()):>7}"
        )
    lines.append("-" * len(head))
    lines.append(f"{'all':<20}" + "".join(f"{tot[x]:>{w}}" for x in CLASSES) + f"{sum(tot.values()):>7}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz.runner", description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--mutants", type=int, default=50)
    ap.add_argument("--first", type=int, default=0, help="first mutant index")
    ap.add_argument("--only", help="comma-separated mutant indexes")
    ap.add_argument("--clean", action="store_true", help="also run every unmutated partition")
    ap.add_argument("--ops", help="letters a-f or names, comma-separated (default: all six)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    ap.add_argument(
        "--mem-cap-mb",
        type=int,
        help=f"RLIMIT_AS of each operation (default: the fork server's address space + {DEFAULT_MEM_HEADROOM_MB} MiB)",
    )
    ap.add_argument("--corpus", help="a corpus directory built before (python -m tests.fuzz.corpus DIR)")
    ap.add_argument("--no-bomb", action="store_true")
    ap.add_argument(
        "--bomb-every",
        type=int,
        default=DEFAULT_BOMB_EVERY,
        help="mutant k targets the bomb when k %% N == N-1 (0: never); the test suite's quick mode uses 0",
    )
    ap.add_argument("--keep", help="keep mutant directories under this directory")
    ap.add_argument("--json", help="write every outcome to this file")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument(
        "--s3",
        action="store_true",
        help="the object-store mode: each mutant read through a local S3 test server (moto) with s3:// URLs; "
        "operations a-d only (default: all four); the targets add `chunky`",
    )
    ap.add_argument(
        "--txn",
        action="store_true",
        help="the transaction mode: every mutant targets the `txn` partition with the marker, txnindex and "
        "snapshot families; operations a-h (default: all eight)",
    )
    args = ap.parse_args(argv)

    ops = list(S3_OPS if args.s3 else O.TXN_OPS if args.txn else O.OPS)
    if args.ops:
        by_letter = {v: k for k, v in O.OP_LETTER.items()}
        ops = [by_letter.get(x.strip(), x.strip()) for x in args.ops.split(",")]
        for op in ops:
            if op not in O.TXN_OPS:
                ap.error(f"unknown op {op}")
    tmp = tempfile.mkdtemp(prefix="kl-fuzz-")
    try:
        t0 = time.monotonic()
        if args.corpus and os.path.exists(os.path.join(args.corpus, "manifest.json")):
            corpus = Corpus(args.corpus)
        else:
            corpus = Corpus.build(args.corpus or os.path.join(tmp, "corpus"), bomb=not args.no_bomb)
        t_corpus = time.monotonic() - t0
        work = args.keep or os.path.join(tmp, "work")
        os.makedirs(work, exist_ok=True)
        server = store = None
        if args.s3:
            from tools.s3_server import BUCKET, S3Server

            server = S3Server().start()
            store = ObjectStore(BUCKET, server.storage_options)
        runner = Runner(
            corpus,
            seed=args.seed,
            work=work,
            jobs=args.jobs,
            timeout=args.timeout,
            mem_cap=args.mem_cap_mb * 2**20 if args.mem_cap_mb else None,
            ops=ops,
            keep=bool(args.keep),
            bomb_every=0 if args.no_bomb else args.bomb_every,
            verbose=args.verbose,
            s3=store,
            txn=args.txn,
        )
        try:
            ks = []
            if args.clean:
                ks += [f"clean:{t}" for t in corpus.manifest["partitions"]]
            if args.only:
                ks += [int(x) for x in args.only.split(",")]
            else:
                ks += list(range(args.first, args.first + args.mutants))
            t1 = time.monotonic()
            outcomes = runner.run(ks)
            t_run = time.monotonic() - t1
        finally:
            runner.close()
            if server is not None:
                server.stop()
        failures = [o for o in outcomes if o.cls in FAILURES]
        if not args.verbose:
            for o in failures:
                print(o.message())
        print(
            f"seed {args.seed}{' (S3)' if args.s3 else ''}: {len(ks)} mutant(s) x {len(ops)} op(s); "
            f"corpus {t_corpus:.1f}s, "
            f"run {t_run:.1f}s (oracle {runner.oracle_seconds:.1f}s), memory cap "
            f"{(runner.mem_cap or 0) / 2**20:.0f} MiB, timeout {args.timeout:.0f}s"
        )
        print(summary_table(outcomes))
        if args.json:
            with open(args.json, "w") as f:
                json.dump([asdict(o) for o in outcomes], f, indent=1, default=str)
        return 1 if failures else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
