"""A log dir's identity, Kafka's `directory.id`: a random UUID in `kafkalog.meta.properties` at its top.

Format (Java properties, as Kafka's meta.properties): `version=0` and `directory.id=<32 hex digits>`,
one per line. The file is made with a create-only write the first time a sink starts on the dir, and
never changes. A process that gets the id from the driver (a sink task, a read task) compares it with
the file it sees: a different or missing id means the node sees another directory under the same path
(a local path on a cluster whose nodes do not share that filesystem), and it stops before writing or
reading anything. Kafka's own `meta.properties` name is not used, so that a broker pointed at the dir
does not take it for its own.
"""

from __future__ import annotations

import re
import socket
import uuid

from ..errors import KafkaStorageError
from ..fs.filesystem import LogFileSystem

META_PROPERTIES_FILE = "kafkalog.meta.properties"
MAX_BYTES = 4096  # a hostile file is not read whole
_ID = re.compile(r"^directory\.id=([0-9a-f]{32})$", re.M)


def directory_id(fs: LogFileSystem, log_dir: str, *, create: bool = False) -> str | None:
    """The log dir's id; with create, make it first if there is none (a racing creator's id wins)."""
    path = fs.join(log_dir, META_PROPERTIES_FILE)
    if create and not fs.exists(path):
        fs.mkdirs(log_dir)
        fs.create_exclusive(path, f"version=0\ndirectory.id={uuid.uuid4().hex}\n".encode())
    try:
        data = fs.read(path, 0, MAX_BYTES)
    except FileNotFoundError:
        return None
    found = _ID.search(data.decode("utf-8", "replace"))
    if found is None:
        raise KafkaStorageError(f"{fs.url(path)} does not hold a directory.id line of 32 hex digits")
    return found.group(1)


def check_directory_id(fs: LogFileSystem, log_dir: str, expected: str | None) -> None:
    """Raise unless this process sees the log dir whose id the driver saw (no-op when it saw none)."""
    if expected is None:
        return
    here = directory_id(fs, log_dir)
    if here != expected:
        seen = f"directory.id {here}" if here else f"no {META_PROPERTIES_FILE}"
        raise KafkaStorageError(
            f"log dir {fs.url(log_dir)} on host {socket.gethostname()} is not the one the driver uses "
            f"(driver: directory.id {expected}; here: {seen}). On a cluster a local-path ROOT must be one "
            f"filesystem mounted by every node (NFS with locks), or an object store URL; see docs/spark.md, "
            f"'Where the data may live'."
        )
