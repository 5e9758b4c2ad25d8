"""`kafkalog dump-log`: Kafka's DumpLogSegments entry point. Each file goes to the dumper for its
suffix; errors and the collected report are printed on stderr, as Kafka does.
"""

from __future__ import annotations

import os
import re
from typing import TextIO

from storage.errors import DumpError, KafkaLogError
from storage.fs.filesystem import LogFileSystem
from storage.log_dirs import open_filesystem

from .dump_index import dump_index, dump_time_index
from .dump_log import DumpOptions, DumpReport, dump_log, one_line
from .dump_snapshot import dump_producer_snapshot
from .dump_txn_index import dump_txn_index

UNSUPPORTED = {".checkpoint": "KRaft snapshots"}

_DUMPERS = {
    ".log": dump_log,
    ".index": dump_index,
    ".timeindex": dump_time_index,
    ".txnindex": dump_txn_index,
    ".snapshot": dump_producer_snapshot,
}


def _open(arg: str) -> tuple[LogFileSystem, str, str]:
    fs, path = open_filesystem(arg)
    abs_name = os.path.abspath(path) if "://" not in arg or arg.startswith("file://") else fs.url(path)
    return fs, path, abs_name


_OFFSET_NAME = re.compile(r"([0-9]{20})(\.[a-z]+)")


def _directory_files(fs: LogFileSystem, path: str, arg: str) -> list[str]:
    """A partition directory's files dump-log reads, in offset order and, per offset, as _DUMPERS lists
    the suffixes (.log, its indexes, then a snapshot); leftovers (.deleted, .swap, .cleaned) are skipped."""
    order = {suffix: i for i, suffix in enumerate(_DUMPERS)}
    found = []
    for f in fs.listdir(path):
        m = _OFFSET_NAME.fullmatch(f.name)
        if m and not f.is_dir and m.group(2) in order:
            found.append((int(m.group(1)), order[m.group(2)], f.name))
    if not found:
        raise DumpError(f"{arg} is a directory with no segment files ({', '.join(_DUMPERS)}): nothing to dump")
    base = arg.rstrip("/")
    return [f"{base}/{name}" for _, _, name in sorted(found)]


def dump_files(files: list[str], opts: DumpOptions, out: TextIO, err: TextIO) -> int:
    """Dump each file as Kafka's tool does (a partition directory: each of its segment files, in order);
    returns 1 if any file could not be read through, or if nothing at all was dumped, else 0."""
    report = DumpReport()
    dumped = ignored = 0
    for arg in _expanded(files, err, report):
        out.write(f"Dumping {arg}\n")
        name = os.path.basename(arg.rstrip("/"))
        suffix = name[name.rfind(".") :] if "." in name else ""
        dumper = _DUMPERS.get(suffix)
        try:
            fs, path, abs_name = _open(arg)
            if not fs.exists(path):
                raise DumpError(f"{arg} does not exist")
            if dumper is None:  # Kafka's tool: a word on stderr, and on to the next file
                if suffix in UNSUPPORTED:
                    err.write(f"Ignoring {arg}: {UNSUPPORTED[suffix]} are not supported\n")
                else:
                    err.write(f"Ignoring unknown file {arg}\n")
                ignored += 1
                continue
            dumper(fs, path, arg, opts, out, report, abs_name)
            dumped += 1
        except BrokenPipeError:
            raise
        except (KafkaLogError, OSError) as e:
            out.flush()
            err.write(f"kafkalog: error: {one_line(e)}\n")
            report.errors += 1
    out.flush()
    report.print_to(err)
    if not dumped and not report.errors:
        err.write(
            f"kafkalog: error: nothing dumped: dump-log reads {', '.join(_DUMPERS)} files "
            f"(Kafka's suffixes); {ignored} file(s) ignored\n"
        )
        return 1
    return 1 if report.errors else 0


def _expanded(files: list[str], err: TextIO, report: DumpReport):
    """The files to dump: each argument, a partition directory standing for its segment files in order."""
    for arg in files:
        try:
            fs, path, _ = _open(arg)
            if not fs.isdir(path):
                yield arg
                continue
            expanded = _directory_files(fs, path, arg)
        except (KafkaLogError, OSError) as e:
            err.write(f"kafkalog: error: {one_line(e)}\n")
            report.errors += 1
            continue
        yield from expanded
