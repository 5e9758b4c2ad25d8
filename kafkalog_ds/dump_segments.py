"""`kafkalog dump-log`: Kafka's DumpLogSegments entry point. Each file goes to the dumper for its
suffix; errors and the collected report are printed on stderr, as Kafka does.
"""

from __future__ import annotations

import os
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


def dump_files(files: list[str], opts: DumpOptions, out: TextIO, err: TextIO) -> int:
    """Dump each file as Kafka's tool does; returns 1 if any file could not be read through, else 0."""
    report = DumpReport()
    for arg in files:
        out.write(f"Dumping {arg}\n")
        name = os.path.basename(arg.rstrip("/"))
        suffix = name[name.rfind(".") :] if "." in name else ""
        dumper = _DUMPERS.get(suffix)
        if dumper is None:
            if suffix in UNSUPPORTED:
                err.write(f"Ignoring {arg}: {UNSUPPORTED[suffix]} are not supported\n")
            else:
                err.write(f"Ignoring unknown file {arg}\n")
            continue
        try:
            fs, path, abs_name = _open(arg)
            if not fs.exists(path):
                raise DumpError(f"{arg} does not exist")
            dumper(fs, path, arg, opts, out, report, abs_name)
        except BrokenPipeError:
            raise
        except (KafkaLogError, OSError) as e:
            out.flush()
            err.write(f"kafkalog: error: {one_line(e)}\n")
            report.errors += 1
    out.flush()
    report.print_to(err)
    return 1 if report.errors else 0
