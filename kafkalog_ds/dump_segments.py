"""`kafkalog dump-log`: Kafka's DumpLogSegments entry point. Each file goes to the dumper for its
suffix; errors and the collected report are printed on stderr, as Kafka does.
"""

from __future__ import annotations

import os
from typing import TextIO

from storage.errors import DumpError, KafkaLogError
from storage.fs.filesystem import LogFileSystem
from storage.log_dirs import open_filesystem
from storage.topic_partition import parse_segment_file

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


def _not_a_file(fs: LogFileSystem, path: str, arg: str) -> DumpError:
    """A directory given to dump-log: Kafka's tool takes files only; name the segment files to pass."""
    names = sorted(f.name for f in fs.listdir(path) if not f.is_dir and parse_segment_file(f.name) is not None)
    logs = [n for n in names if n.endswith(".log")]
    base = arg.rstrip("/")
    if not names:
        return DumpError(f"{arg} is a directory, not a file: dump-log takes files (it holds no segment files)")
    shown = " ".join(f"{base}/{n}" for n in (logs or names)[:3]) + (" ..." if len(logs or names) > 3 else "")
    return DumpError(
        f"{arg} is a directory, not a file: dump-log takes files, as Kafka's tool does; "
        f"its {len(logs)} segment(s): kafkalog dump-log {shown}"
    )


def dump_files(files: list[str], opts: DumpOptions, out: TextIO, err: TextIO) -> int:
    """Dump each file as Kafka's tool does; returns 1 if any file could not be read through, or if
    nothing at all was dumped (only unknown suffixes), else 0."""
    report = DumpReport()
    dumped = ignored = 0
    for arg in files:
        out.write(f"Dumping {arg}\n")
        name = os.path.basename(arg.rstrip("/"))
        suffix = name[name.rfind(".") :] if "." in name else ""
        dumper = _DUMPERS.get(suffix)
        try:
            fs, path, abs_name = _open(arg)
            if not fs.exists(path):
                raise DumpError(f"{arg} does not exist")
            if fs.isdir(path):
                raise _not_a_file(fs, path, arg)
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
    if ignored and not dumped and not report.errors:
        err.write(
            f"kafkalog: error: nothing dumped: dump-log reads {', '.join(_DUMPERS)} files "
            f"(Kafka's suffixes); {ignored} file(s) ignored\n"
        )
        return 1
    return 1 if report.errors else 0
