"""Which mount holds a local path, and whether a writer's locks there are seen by every machine.

Writers on a local path rely on flock(2) excluding every other writer of the log, rename(2) replacing
in one step, O_EXCL and fsync (docs/spark.md, "Where the data may live"). On one machine any POSIX
filesystem gives that. A multi-machine cluster needs a filesystem every node mounts, with shared
locks: NFS through its lock manager (the default) does. Two kinds of mount cannot be made safe and are
refused for writing, naming the mount:
- NFS mounted with `nolock` or `local_lock=all|flock`: flock is per client machine;
- FUSE mounts of object stores (s3fs-fuse, gcsfuse, goofys, mountpoint-s3, rclone, blobfuse): per
  machine locks, renames that copy. Use the store's URL (s3://...) instead: commits there are
  create-only writes.
KAFKALOG_SINGLE_HOST_LOCKS=1 allows them when every process that writes ROOT runs on one machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import KafkaStorageError

MOUNTINFO = "/proc/self/mountinfo"
OBJECT_STORE_FUSE = ("s3fs", "gcsfuse", "goofys", "mountpoint-s3", "rclone", "blobfuse", "blobfuse2")
ALLOW_ENV = "KAFKALOG_SINGLE_HOST_LOCKS"


@dataclass(frozen=True)
class Mount:
    point: str
    fstype: str
    source: str
    options: frozenset


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040 ...)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of a /proc/<pid>/mountinfo text (proc(5)); malformed lines are skipped."""
    out = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        if len(fields) < sep + 3 or len(fields) < 6:
            continue
        options = set(fields[5].split(","))
        if len(fields) > sep + 3:
            options.update(fields[sep + 3].split(","))
        out.append(Mount(_unescape(fields[4]), fields[sep + 1], _unescape(fields[sep + 2]), frozenset(options)))
    return out


def mount_of(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount holding path: the longest mount point that is a prefix of it (the last one mounted wins)."""
    best = None
    for m in mounts:
        prefix = m.point.rstrip("/") + "/"
        if (path == m.point or path.startswith(prefix) or m.point == "/") and (
            best is None or len(m.point) >= len(best.point)
        ):
            best = m
    return best


def unsafe_reason(m: Mount) -> str | None:
    """Why writers on this mount cannot exclude each other across machines, or None."""
    if m.fstype in ("nfs", "nfs4"):
        if "nolock" in m.options or "local_lock=all" in m.options or "local_lock=flock" in m.options:
            return "an NFS mount whose locks are local to each client (nolock / local_lock)"
        return None
    if m.fstype.startswith("fuse.") and m.fstype[5:] in OBJECT_STORE_FUSE:
        return (
            f"a FUSE mount of an object store ({m.fstype[5:]}): its locks are per machine and its renames "
            f"are copies; give the store's own URL (s3://..., gs://...) as ROOT instead"
        )
    return None


_by_device: dict[int, str | None] = {}  # st_dev -> problem: one mountinfo read per device, not per lock


def _check_device(dev: int, path: str) -> str | None:
    if dev in _by_device:
        return _by_device[dev]
    _by_device[dev] = _find_problem(path)
    return _by_device[dev]


def _find_problem(path: str) -> str | None:
    try:
        with open(MOUNTINFO) as f:
            mounts = parse_mountinfo(f.read())
    except OSError:
        return None  # not Linux: nothing to tell from
    m = mount_of(path, mounts)
    reason = unsafe_reason(m) if m is not None else None
    if m is None or reason is None:
        return None
    return f"{m.point} ({m.fstype} {m.source}) is {reason}"


def check_lockable(path: str) -> None:
    """Raise if the directory holding `path` is on a mount where locks do not reach every machine."""
    if os.environ.get(ALLOW_ENV) == "1":
        return
    d = os.path.dirname(os.path.realpath(path))
    problem = _check_device(os.stat(d).st_dev, d)
    if problem:
        raise KafkaStorageError(
            f"refusing to write {path}: {problem}, so two writers on different machines "
            f"could both hold its lock and corrupt the log. Set {ALLOW_ENV}=1 only if every "
            f"process that writes this ROOT runs on one machine."
        )
