"""A topic exported into a stopped broker's log dir or a staging directory (broker_log_dir.py).

Every partition is read, checked and written under a temporary `<topic>-<p>.<uuid>-delete` name (what a
broker calls a deleted partition: one a crash leaves behind is removed, never loaded) before anything in
the target changes, so a refusal or a damaged source leaves the target as it was. Then, in a broker's
log dir, each partition's directory is exchanged with the empty one the broker made and that partition's
checkpoint entries are updated, together; in a staging directory the directories are renamed into place,
and a log start offset above the first segment goes in `<topic>.delete-records.json` for
kafka-delete-records.sh.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from ..errors import ExportError, UnknownTopicOrPartitionError
from ..log_manager import LogManager
from ..topic_partition import TopicPartition, deleted_dir_name, partition_dir_name
from .broker_log_dir import DELETE_RECORDS_SUFFIX, BrokerLogDir, check_empty_partition_dir
from .durable_files import exchange, fsync_dir, write_replace
from .partition_export import PartitionExport, export_partition
from .partition_metadata_file import check_topic_id


@dataclass
class ExportResult:
    """What an export did: the partitions put in place, in order, and where."""

    topic: str
    topic_id: str
    target: str
    broker_log_dir: bool
    partitions: list[PartitionExport] = field(default_factory=list)
    not_here: list[int] = field(default_factory=list)  # broker mode: partitions with no directory in this log dir
    delete_records_file: str | None = None
    seconds: float = 0.0


def export_topic(
    lm: LogManager,
    topic: str,
    to: str,
    *,
    topic_id: str | None = None,
    partitions: list[int] | None = None,
    allow_unclean_shutdown: bool = False,
    on_partition: Callable[[PartitionExport], None] | None = None,
    uninterrupted: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
) -> ExportResult:
    """Export a kafkalog topic into a broker's log dir or a staging directory (see the module docstring).

    `on_partition` is called with each partition once it is in place; each partition's directory and its
    checkpoint entries change inside one `uninterrupted()` block (the command holds back Ctrl-C there)."""
    started = time.monotonic()
    meta = lm.topic(topic)
    if partitions:
        bad = sorted({p for p in partitions if not 0 <= p < meta.partitions})
        if bad:
            raise UnknownTopicOrPartitionError(
                f"--partition {bad[0]}: topic '{topic}' has {meta.partitions} partition(s) in {lm.url()}"
            )
    if topic_id is not None:
        check_topic_id(topic_id)
    for d in lm.log_dirs:
        if lm.fs.protocol == "file" and os.path.abspath(to) == os.path.abspath(d):
            raise ExportError(
                f"--to {to} is the kafkalog log dir itself: give a broker's log dir or a staging directory"
            )
    target = BrokerLogDir(to, allow_unclean_shutdown)
    staged: list[PartitionExport] = []
    done = False
    created: str | None = None  # a staging directory this export made: removed again unless it succeeds
    try:
        existing = target.topic_dirs(topic)
        if target.broker:
            wanted, not_here, topic_id = _broker_partitions(
                lm, target, topic, meta.partitions, existing, partitions, topic_id
            )
        else:
            if topic_id is None:
                raise ExportError(
                    "--topic-id is required for a staging directory: the TopicId that kafka-topics.sh "
                    f"--describe --topic {topic} prints once the topic is created on the cluster"
                )
            wanted = sorted(set(partitions)) if partitions else list(range(meta.partitions))
            clash = [p for p in wanted if p in existing]
            if clash:
                raise ExportError(
                    f"the staging directory {target.path} holds {existing[clash[0]]} already: give an empty one"
                )
            not_here = []
            if not os.path.isdir(target.path):
                os.makedirs(target.path)
                created = target.path
        result = ExportResult(topic, topic_id, target.path, target.broker, not_here=not_here)

        # read, check and write every partition before anything replaces a directory
        for p in wanted:
            tp = TopicPartition(topic, p)
            tmp = target.join(deleted_dir_name(tp))
            part = PartitionExport(tp, staged=tmp)
            staged.append(part)
            built = export_partition(lm, tp, topic_id, tmp)
            built.staged = tmp
            staged[-1] = built
        if target.broker:
            fsync_dir(target.path)

        for part in staged:
            final = target.join(partition_dir_name(part.tp))
            tmp_dir = part.staged
            assert tmp_dir is not None
            with uninterrupted():  # a directory and its checkpoint entries change together
                if target.broker:
                    if not exchange(tmp_dir, final):
                        old = target.join(deleted_dir_name(part.tp))
                        os.rename(final, old)
                        os.rename(tmp_dir, final)
                        tmp_dir = part.staged = old
                    fsync_dir(target.path)
                    target.update_checkpoints(
                        part.tp,
                        log_start=part.log_start if part.needs_log_start_entry else None,
                        log_end=part.log_end,
                        cleaned_to=part.cleaned_to,
                    )
                    shutil.rmtree(tmp_dir)  # the broker's empty directory, now under the temporary name
                else:
                    os.rename(tmp_dir, final)
                part.staged = None
            result.partitions.append(part)
            if on_partition is not None:
                on_partition(part)
        if not target.broker:
            fsync_dir(target.path)
            starts = [p for p in result.partitions if p.needs_log_start_entry]
            if starts:
                result.delete_records_file = target.join(topic + DELETE_RECORDS_SUFFIX)
                doc = {
                    "partitions": [
                        {"topic": topic, "partition": p.tp.partition, "offset": p.log_start} for p in starts
                    ],
                    "version": 1,
                }
                write_replace(result.delete_records_file, (json.dumps(doc, indent=2) + "\n").encode())
        result.seconds = time.monotonic() - started
        done = True
        return result
    finally:
        for part in staged:
            if part.staged is not None:
                shutil.rmtree(part.staged, ignore_errors=True)
        if created is not None and not done:
            with contextlib.suppress(OSError):  # only if empty: what was put in place stays
                os.rmdir(created)
        target.close(refused=not done)


def _broker_partitions(
    lm: LogManager,
    target: BrokerLogDir,
    topic: str,
    count: int,
    existing: dict[int, str],
    partitions: list[int] | None,
    topic_id: str | None,
) -> tuple[list[int], list[int], str]:
    """In a broker's log dir: the partitions to export, those of the topic it does not hold, and the topic
    id (given, or read from the broker's partition directories, which must all be empty)."""
    beyond = sorted(p for p in existing if p >= count)
    if beyond:
        raise ExportError(
            f"the broker's log dir {target.path} holds partition {beyond[0]} of topic '{topic}', "
            f"which has {count} partition(s) in {lm.url()}: create the topic on the "
            f"cluster with --partitions {count}"
        )
    wanted = sorted(set(partitions)) if partitions else sorted(existing)
    if not wanted:
        raise ExportError(
            f"the broker's log dir {target.path} holds no directory of topic '{topic}': create "
            f"the topic on the cluster first (kafka-topics.sh --create --topic {topic} "
            f"--partitions {count} ...), start the broker once so that it makes them, "
            f"stop it cleanly, then run this"
        )
    missing = [p for p in wanted if p not in existing]
    if missing:
        raise ExportError(
            f"the broker's log dir {target.path} holds no directory for partition {missing[0]} "
            f"of topic '{topic}': this broker is not its replica, or keeps it in another of its "
            f"log.dirs (run this there), or the topic was not created on the cluster"
        )
    not_here = [p for p in range(count) if p not in wanted and not partitions]
    ids = {}
    for p in wanted:
        found = check_empty_partition_dir(existing[p])
        if found is not None:
            ids[p] = found
    if topic_id is None:
        if len(set(ids.values())) > 1:
            raise ExportError(
                f"the partition directories of topic '{topic}' in {target.path} name different "
                f"topic ids ({', '.join(sorted(set(ids.values())))}); give --topic-id"
            )
        if len(ids) < len(wanted):
            first = min(set(wanted) - set(ids))
            raise ExportError(
                f"partition {first} of topic '{topic}' in {target.path} has "
                f"no partition.metadata to take the topic id from: give --topic-id (the TopicId "
                f"kafka-topics.sh --describe prints)"
            )
        topic_id = check_topic_id(next(iter(ids.values())))
    else:
        other = {v for v in ids.values() if v != topic_id}
        if other:
            raise ExportError(
                f"--topic-id {topic_id} is not the id of topic '{topic}' on this broker: its "
                f"partition directories in {target.path} name {sorted(other)[0]} (see "
                f"kafka-topics.sh --describe --topic {topic})"
            )
    return wanted, not_here, topic_id
