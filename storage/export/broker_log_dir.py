"""The directory an export writes into: a stopped Kafka broker's log dir, or a staging directory.

A broker's log dir holds `meta.properties`. It is locked for the whole export as Kafka's LogManager locks
it (a POSIX lock on `<log.dir>/.lock`: a running broker is refused, none starts meanwhile), needs
`.kafka_cleanshutdown` (else the broker would recover every segment at its next start), and its
checkpoint files get each exported partition's entries. A `.lock` the export created is removed again
unless the export succeeds, so a refused export leaves the log dir exactly as it was. A staging directory
is missing (made, and removed again unless the export succeeds), empty, or holds only partition
directories (and `<topic>.delete-records.json` files); it is neither locked nor checkpointed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os

from ..errors import ExportError
from ..metadata.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT_FILE,
    LOG_START_OFFSET_CHECKPOINT_FILE,
    RECOVERY_POINT_CHECKPOINT_FILE,
    format_checkpoint,
    parse_checkpoint,
)
from ..topic_partition import TopicPartition, parse_log_dir_name
from .durable_files import write_replace
from .partition_metadata_file import PARTITION_METADATA_FILE, read_partition_metadata

KAFKA_LOCK_FILE = ".lock"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
META_PROPERTIES = "meta.properties"
REPLICATION_OFFSET_CHECKPOINT_FILE = "replication-offset-checkpoint"
DELETE_RECORDS_SUFFIX = ".delete-records.json"


class BrokerLogDir:
    """The target of an export: a stopped broker's log dir (`broker`, locked from construction to close)
    or a staging directory."""

    def __init__(self, path: str, allow_unclean_shutdown: bool):
        self.path = os.path.abspath(path)
        self.lock_fd: int | None = None
        self.created_lock = False  # the lock file did not exist before this export
        self.broker = os.path.isfile(os.path.join(self.path, META_PROPERTIES))
        if not self.broker:
            self._check_staging()
            return
        self._lock()
        if not allow_unclean_shutdown and not os.path.exists(os.path.join(self.path, CLEAN_SHUTDOWN_FILE)):
            self.close(refused=True)
            raise ExportError(
                f"{self.path} has no {CLEAN_SHUTDOWN_FILE}: the broker did not shut down cleanly (or never ran), so "
                f"at its next start it would recover (re-read and re-index) every segment of this log dir. Start it "
                f"and stop it cleanly (kafka-server-stop.sh, or SIGTERM), then run this again; or pass "
                f"--allow-unclean-shutdown to accept that recovery"
            )

    def _check_staging(self) -> None:
        if not os.path.exists(self.path):
            return
        if not os.path.isdir(self.path):
            raise ExportError(f"--to {self.path} is a file, not a directory")
        others = [
            n
            for n in os.listdir(self.path)
            if not (
                n.endswith(DELETE_RECORDS_SUFFIX)
                or (parse_log_dir_name(n) is not None and os.path.isdir(os.path.join(self.path, n)))
            )
        ]
        if others:
            shown = ", ".join(sorted(others)[:3]) + (", ..." if len(others) > 3 else "")
            raise ExportError(
                f"--to {self.path} is neither a Kafka broker's log dir (it has no {META_PROPERTIES}) "
                f"nor a staging directory (missing, empty, or holding only partition directories): "
                f"it holds {shown}"
            )

    def _lock(self) -> None:
        """Kafka's FileLock on <log.dir>/.lock is a POSIX record lock (FileChannel.tryLock is fcntl on Linux)."""
        path = self.join(KAFKA_LOCK_FILE)
        while True:  # whether this export creates the file decides whether a refusal removes it
            try:
                fd, created = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
                break
            except FileExistsError:
                pass
            try:
                fd, created = os.open(path, os.O_RDWR), False
                break
            except FileNotFoundError:
                continue  # removed in between: try to create it again
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)  # (a file created here but locked by another process first is that process's now)
            if e.errno in (errno.EAGAIN, errno.EACCES):
                raise ExportError(
                    f"{path} is locked by another process: a Kafka broker is running on the log dir "
                    f"{self.path}; stop it cleanly first (kafka-server-stop.sh)"
                ) from None
            raise
        self.lock_fd, self.created_lock = fd, created

    def close(self, *, refused: bool = False) -> None:
        """Release the lock; after a refusal, a lock file this export created goes too (removed while held)."""
        if self.lock_fd is not None:
            if refused and self.created_lock:
                with contextlib.suppress(OSError):  # never hide the refusal's own error
                    os.unlink(self.join(KAFKA_LOCK_FILE))
            os.close(self.lock_fd)  # releases the lock
            self.lock_fd = None

    def join(self, name: str) -> str:
        return os.path.join(self.path, name)

    def topic_dirs(self, topic: str) -> dict[int, str]:
        """The live partition directories of the topic it holds, by partition."""
        out = {}
        if os.path.isdir(self.path):
            for name in os.listdir(self.path):
                parsed = parse_log_dir_name(name)
                if (
                    parsed is not None
                    and parsed.kind == "live"
                    and parsed.topic_partition.topic == topic
                    and os.path.isdir(self.join(name))
                ):
                    out[parsed.topic_partition.partition] = self.join(name)
        return out

    def update_checkpoints(
        self, tp: TopicPartition, *, log_start: int | None, log_end: int, cleaned_to: int | None
    ) -> None:
        """The log dir's checkpoint entries for one exported partition (each file replaced in one step); an
        entry given None is removed."""
        changes = {
            LOG_START_OFFSET_CHECKPOINT_FILE: log_start,
            RECOVERY_POINT_CHECKPOINT_FILE: log_end,
            REPLICATION_OFFSET_CHECKPOINT_FILE: log_end,  # the high watermark: every record is committed
            CLEANER_OFFSET_CHECKPOINT_FILE: cleaned_to,  # compaction done by kafkalog is not redone
        }
        for name, value in changes.items():
            path = self.join(name)
            try:
                with open(path, "rb") as f:
                    entries = dict(parse_checkpoint(f.read(), source=path))
            except FileNotFoundError:
                entries = {}
            if value is None:
                if tp not in entries:
                    continue
                del entries[tp]
            elif entries.get(tp) == value:
                continue
            else:
                entries[tp] = value
            write_replace(path, format_checkpoint(entries))


def check_empty_partition_dir(path: str) -> str | None:
    """A partition directory the broker made for the topic and never wrote to; returns its topic id."""
    data = []
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if ".log" in name and os.path.isfile(full) and os.path.getsize(full):
            data.append(f"{name} ({os.path.getsize(full)} bytes)")
    if data:
        raise ExportError(
            f"{path} already holds records ({', '.join(sorted(data)[:3])}): it was exported already, or "
            f"the broker wrote to it. export-to-broker fills only partitions the broker created empty; "
            f"name the others with --partition, or delete and recreate the topic on the cluster"
        )
    return read_partition_metadata(os.path.join(path, PARTITION_METADATA_FILE))
