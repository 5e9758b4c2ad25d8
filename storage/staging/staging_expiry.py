"""The maintenance job's removal of abandoned staging directories (`.kafkalog-staged-<writer id>-<uuid>`).

A commit removes its own staging and its writer's older leftovers (staged_commit.cleanup_staged), so a query
that stops for good leaves its last ones forever. Kafka's coordinator forgets a transactional id after
transactional.id.expiration.ms without a transaction update; here a writer whose every trace is older than
that is gone, and its staging goes. The traces: every file in any of its staging directories (the task's
marker, then its staged segments), its entry in the writer state of each partition they stage for (stamped
when a commit begins and ends there; on object stores its transaction file there), and its transaction
decisions. Anything unsure (a name that parses to no writer, a read that fails) keeps what it concerns.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

from ..common.constants import INT64_MAX
from ..errors import KafkaStorageError
from ..log_manager import LogManager
from ..objects.immutable_segment import immutable_segments
from ..objects.object_producer_state import txn_file_name
from ..topic_partition import parse_partition_dir
from ..transactions.producer_state_manager import ProducerStateManager
from ..transactions.transaction_coordinator import decision_dir
from .staged_commit import STAGED_PREFIX

logger = logging.getLogger(__name__)

# Kafka's broker setting and default (7 days): how long a writer may show no sign of life before its staging goes.
# It must exceed the longest micro-batch (its first task's staging to its commit's end), or a commit may find its
# staging gone: it then fails before its data is in that partition and Spark's replay stages it again.
TRANSACTIONAL_ID_EXPIRATION_MS_CONFIG = "transactional.id.expiration.ms"
DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS = 7 * 24 * 3600 * 1000
_NAME = re.compile(r"([0-9]{1,19})-[0-9a-f]{32}")  # what record_stager.staged_name writes after the prefix
_MAX_DEPTH = 3  # a staging dir holds `task` and <topic>-<partition>/<segment files>: nothing deeper is walked


def staged_writer(name: str) -> int | None:
    """The writer id a staging directory's name says it belongs to, or None for any other name."""
    if not name.startswith(STAGED_PREFIX):
        return None
    m = _NAME.fullmatch(name[len(STAGED_PREFIX) :])
    if m is None or int(m.group(1)) > INT64_MAX:
        return None
    return int(m.group(1))


@dataclass
class StagingExpiry:
    """What one pass did to the staging directories: removed (URLs) and their bytes, the ones it kept for
    live writers, names it could not attribute (kept), and failures (kept too; the next pass retries)."""

    removed: list[str] = field(default_factory=list)
    bytes_removed: int = 0
    kept_live: int = 0
    unrecognised: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = []
        if self.removed:
            out.append(f"removed {len(self.removed)} abandoned staging dir(s), {self.bytes_removed} bytes")
        if self.unrecognised:
            out.append(f"kept {len(self.unrecognised)} staging-like name(s) of no writer, e.g. {self.unrecognised[0]}")
        out += [f"staging: {e}" for e in self.errors]
        return out


@dataclass
class _Entry:
    log_dir: str
    name: str
    is_dir: bool
    size: int  # a file's size from the listing


def expire_staging(lm: LogManager, *, now_ms: int, expiration_ms: int = DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS):
    """Remove the staging of every writer with no trace at or after now_ms - expiration_ms (module docstring),
    in every log dir. Never raises for one writer's entries: a failure is recorded and they stay."""
    fs = lm.fs
    out = StagingExpiry()
    by_writer: dict[int, list[_Entry]] = {}
    for log_dir in lm.log_dirs:
        fs.invalidate_listings(log_dir)  # the pass's cached listings may be older than a commit's cleanup
        for f in fs.listdir(log_dir):
            if not f.name.startswith(STAGED_PREFIX):
                continue
            wid = staged_writer(f.name)
            if wid is None:
                out.unrecognised.append(fs.url(fs.join(log_dir, f.name)))
                continue
            by_writer.setdefault(wid, []).append(_Entry(log_dir, f.name, f.is_dir, f.size))
    if out.unrecognised:
        logger.warning("kept %d staging-like name(s) that name no writer: %s", len(out.unrecognised), out.unrecognised)
    horizon = now_ms - expiration_ms
    for wid, entries in sorted(by_writer.items()):
        try:
            doomed = _abandoned(lm, wid, entries, horizon)
        except Exception as e:  # noqa: BLE001 - this writer's entries stay; the next pass retries
            out.errors.append(f"writer {wid}: {type(e).__name__}: {e}")
            continue
        if doomed is None:
            out.kept_live += len(entries)
            continue
        for entry, size in doomed:
            _remove(lm, entry, size, out)
    return out


def _abandoned(lm: LogManager, wid: int, entries: list[_Entry], horizon: int) -> list[tuple[_Entry, int]] | None:
    """The writer's entries that still exist, with their bytes, when it has no trace at or after `horizon`;
    None when it is live. Cheapest first: the markers, then the staged files, then the partitions' state."""
    fs = lm.fs
    for e in entries:  # a marker's mtime: when that task attempt began (one listing per entry)
        path = fs.join(e.log_dir, e.name)
        top = fs.modified_times(path).values() if e.is_dir else [_mtime(fs, path)]
        if any(t is not None and t >= horizon for t in top):
            return None
    found: list[tuple[_Entry, int]] = []
    partitions: set[tuple[str, str]] = set()
    for e in entries:
        path = fs.join(e.log_dir, e.name)
        if not e.is_dir:
            newest, size = _mtime(fs, path), e.size
        else:
            newest, size, subdirs = _walk(fs, path, 0)
            partitions |= {(e.log_dir, d) for d in subdirs if parse_partition_dir(d) is not None}
            if newest is None:  # nothing in it: an empty directory has its own time, a vanished one none
                newest = _mtime(fs, path)
        if newest is None:  # gone since the listing (a commit's cleanup, another pass): not ours to count
            continue
        if newest >= horizon:
            return None
        found.append((e, size))
    for log_dir, pname in sorted(partitions):
        t = _state_ms(lm, wid, fs.join(log_dir, pname))
        if t is not None and t >= horizon:
            return None
    if any(t >= horizon for t in fs.modified_times(decision_dir(fs, lm.root, wid)).values()):
        return None  # a decision of its (kept while its markers are written, an abort for days)
    return found


def _walk(fs, path: str, depth: int) -> tuple[int | None, int, list[str]]:
    """(newest file mtime or None, bytes, names of the subdirectories) of what lies under `path`, at most
    _MAX_DEPTH levels down; files that vanish meanwhile are left out."""
    listing = fs.listdir(path)
    mtimes = fs.modified_times(path, [f.name for f in listing if not f.is_dir])
    newest = max(mtimes.values(), default=None)
    size = sum(f.size for f in listing if not f.is_dir and f.name in mtimes)
    subdirs = [f.name for f in listing if f.is_dir]
    if depth < _MAX_DEPTH:
        for name in subdirs:
            t, s, _ = _walk(fs, fs.join(path, name), depth + 1)
            size += s
            if t is not None:
                newest = t if newest is None else max(newest, t)
    return newest, size, subdirs


def _mtime(fs, path: str) -> int | None:
    """A file's (or a local directory's) modification time in ms; None when it is gone or has none (a
    prefix on an object store)."""
    try:
        return fs.modified_ms(path)
    except FileNotFoundError:
        return None


def _state_ms(lm: LogManager, wid: int, pdir: str) -> int | None:
    """When the writer's state last changed in a partition (a commit's begin or end): its entry's updated_ms
    in the state file, or on object stores its transaction file's time. None when there is none; an
    unreadable state file counts as none (no commit can run in that partition until it is fixed)."""
    fs = lm.fs
    if immutable_segments(fs):
        return _mtime(fs, fs.join(pdir, txn_file_name(wid)))
    try:
        entry = ProducerStateManager(fs, pdir).writers.get(wid)
    except (KafkaStorageError, FileNotFoundError) as e:
        logger.warning("%s: writer state not read for the staging check (%s)", fs.url(pdir), e)
        return None
    return entry.updated_ms if entry is not None else None


def _remove(lm: LogManager, e: _Entry, size: int, out: StagingExpiry) -> None:
    """Delete one abandoned entry (a directory, or a file named like one, as cleanup_staged does); one that
    vanished or changed kind meanwhile is left alone and not counted."""
    fs = lm.fs
    path = fs.join(e.log_dir, e.name)
    try:
        if e.is_dir:
            if not fs.isdir(path):
                return
            fs.delete_dir(path)
        else:
            if not fs.exists(path) or fs.isdir(path):
                return
            fs.delete(path, missing_ok=False)
    except FileNotFoundError:  # removed by someone else while we were at it
        return
    except Exception as ex:  # noqa: BLE001 - reported; the entry stays for the next pass
        out.errors.append(f"{fs.url(path)} not removed: {type(ex).__name__}: {ex}")
        return
    out.removed.append(fs.url(path))
    out.bytes_removed += size
    logger.info("removed abandoned staging %s (%d bytes)", fs.url(path), size)
