"""The `kafkalog` command: Kafka's command-line tools for a log dir with no broker.

Its commands are build_parser's subparsers. Their help strings are the one list of what each does, which
`kafkalog` alone (on stderr, exit 2) and `kafkalog --help` print, one command a line.

Engine errors print as one line `kafkalog: error: <message>` and exit 1; usage errors exit 2; Ctrl-C
prints `kafkalog: interrupted` and exits 130.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import difflib
import importlib.metadata
import json
import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING, BinaryIO, TextIO

import fsspec.config

from storage.common.time import SYSTEM_TIME, Time
from storage.errors import InvalidConfigError, KafkaLogError, KafkaStorageError, TableError
from storage.fs.storage_options import storage_options_from_cli
from storage.log_config import (
    CONFIG_KEYS_BY_NAME,
    DEFAULT_CHECK_INTERVAL_MS,
    InvalidOptionValueError,
    parse_config_pairs,
    parse_option,
)
from storage.log_manager import CHECKPOINT_FILES, ROOT_LOCK_FILE, LogManager
from storage.metadata.topic_metadata import TOPIC_FILE_SUFFIX
from storage.topic_partition import TopicPartition, parse_log_dir_name, parse_partition_dir, parse_segment_file
from storage.transactions.isolation import READ_COMMITTED, READ_UNCOMMITTED

from .consume import consume
from .dump_log import DEFAULT_MAX_MESSAGE_SIZE, NO_MAX_BYTES, DumpOptions
from .dump_segments import dump_files
from .produce import DEFAULT_BATCH_SIZE, produce, sigint_deferred

if TYPE_CHECKING:
    from storage.export import ExportResult, PartitionExport

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
INTERRUPTED = 130  # the exit code for Ctrl-C (128 + SIGINT), as shells report it


def _option(type_: str, **bounds):
    """An argparse type: a value parsed by storage's option parser (parse_option), its error in argparse's
    words (argparse names the option)."""

    def parse(text: str):
        try:
            return parse_option("", text, type_, **bounds)
        except InvalidOptionValueError as e:
            raise argparse.ArgumentTypeError(f"expected {e.expected}, got {text!r}") from None

    return parse


_positive_int = _option("long", at_least=1)
_non_negative_int = _option("long", at_least=0)
_int = _option("long")
_long_offset = _option("long", expected="an offset, 'earliest' or 'latest'")


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def _offset(text: str):
    return text if text in ("earliest", "latest") else _long_offset(text)


ROOT_HELP = (
    "the log dir (Kafka's log.dir): a local path, or a file://, memory:// or object store URL "
    "(s3://bucket/prefix, with --fs for its storage options); several: log.dirs=DIR1,DIR2"
)


def _version() -> str:
    """The installed distribution's version (pyproject's), as --version prints it."""
    try:
        return importlib.metadata.version("kafkalog-ds")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (kafkalog-ds is not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafkalog",
        usage="%(prog)s [-h] [--version] COMMAND ...",
        description="Kafka's tools for a Kafka-format log dir, no broker.",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the epilog's list: one command a line
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    # Not required: main() answers a missing COMMAND with the help's list of commands. Their help strings are
    # listed in the epilog (below) instead of argparse's section, which wraps them at the terminal's width.
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", help=argparse.SUPPRESS, prog="kafkalog")

    t = sub.add_parser(
        "topics",
        help="create, list, describe, alter or delete topics (kafka-topics.sh, kafka-configs.sh)",
        description="Create, list, describe, alter or delete topics, as kafka-topics.sh does.",
    )
    _root_arguments(t)
    action = t.add_mutually_exclusive_group(required=True)
    action.add_argument("--create", action="store_true", help="create a topic")
    action.add_argument("--list", action="store_true", help="list topic names, one per line")
    action.add_argument("--describe", action="store_true", help="describe every topic, or --topic")
    action.add_argument("--alter", action="store_true", help="change topic configs (--add-config, --delete-config)")
    action.add_argument(
        "--delete",
        action="store_true",
        help="delete a topic: its partition directories become -delete dirs, removed after "
        "file.delete.delay.ms by the maintenance job",
    )
    t.add_argument("--topic", help="the topic")
    t.add_argument("--partitions", type=_positive_int, help="partition count for --create (default 1)")
    t.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a topic config override for --create (repeatable), Kafka's key names",
    )
    t.add_argument("--if-not-exists", action="store_true", help="with --create: do nothing if the topic exists")
    t.add_argument("--if-exists", action="store_true", help="with --delete: do nothing if the topic does not exist")
    t.add_argument(
        "--add-config",
        action="append",
        default=[],
        metavar="K=V[,K=V]",
        help="with --alter: configs to set; list values in brackets: cleanup.policy=[compact,delete]",
    )
    t.add_argument(
        "--delete-config",
        action="append",
        default=[],
        metavar="K[,K]",
        help="with --alter: configs to remove (back to the default)",
    )
    t.set_defaults(func=cmd_topics, parser=t)

    p = sub.add_parser(
        "produce",
        help="append JSON-line records from stdin (kafka-console-producer.sh)",
        description='Append records read from stdin, one JSON object per line: {"key": str|null, '
        '"value": str|null, "timestamp": ms, "partition": int, "headers": [[k, v], ...]}.',
    )
    _root_arguments(p)
    p.add_argument("--topic", required=True)
    p.add_argument(
        "--compression",
        "--compression-codec",
        choices=CODECS,
        default="none",
        help="the producer's codec (default none)",
    )
    p.add_argument("--no-create", action="store_true", help="fail if the topic does not exist")
    p.add_argument("--partitions", type=_positive_int, help="partition count when the topic is created (default 1)")
    p.add_argument(
        "--batch-size",
        type=_positive_int,
        default=DEFAULT_BATCH_SIZE,
        help=f"records per batch (default {DEFAULT_BATCH_SIZE})",
    )
    p.set_defaults(func=cmd_produce, parser=p)

    c = sub.add_parser(
        "consume",
        help="print records as JSON lines (kafka-console-consumer.sh)",
        description="Print records as JSON lines, partition after partition.",
    )
    _root_arguments(c)
    c.add_argument("--topic", required=True)
    c.add_argument("--partition", type=_non_negative_int, help="only this partition (default: all, in order)")
    start = c.add_mutually_exclusive_group()
    start.add_argument(
        "--offset",
        type=_offset,
        default="earliest",
        help="an offset, 'earliest' (default) or 'latest' (the log end: prints nothing)",
    )
    start.add_argument(
        "--from-beginning", action="store_const", dest="offset", const="earliest", help="same as --offset earliest"
    )
    start.add_argument(
        "--timestamp",
        type=_int,
        metavar="MS",
        help="start at the earliest offset whose timestamp >= MS (epoch milliseconds)",
    )
    c.add_argument("--max-messages", type=_positive_int, help="stop after this many records")
    c.add_argument(
        "--isolation-level",
        choices=(READ_UNCOMMITTED, READ_COMMITTED),
        default=READ_UNCOMMITTED,
        help="read_committed: no aborted transactional records, and nothing from the first still-open "
        "transaction on ('latest' and --timestamp too: the last stable offset); default read_uncommitted "
        "(kafka-console-consumer.sh's flag)",
    )
    c.set_defaults(func=cmd_consume, parser=c)

    d = sub.add_parser(
        "dump-log",
        help="print segment, index and time index files (kafka-dump-log.sh)",
        description="Print .log, .index, .timeindex and .txnindex files as Kafka's DumpLogSegments.",
    )
    d.add_argument(
        "files", nargs="*", metavar="FILE", help="files to dump (paths or URLs: file://, memory://, s3://... with --fs)"
    )
    d.add_argument(
        "--files",
        dest="files_opt",
        action="append",
        default=[],
        metavar="FILE1,FILE2",
        help="comma separated files, Kafka's form",
    )
    d.add_argument("--print-data-log", action="store_true", help="print keys and values (implies --deep-iteration)")
    d.add_argument("--deep-iteration", action="store_true", help="print every record, not only batches")
    d.add_argument("--skip-record-metadata", action="store_true", help="do not print record metadata")
    d.add_argument("--verify-index-only", action="store_true", help="check indexes without printing entries")
    d.add_argument("--index-sanity-check", action="store_true", help="only run the index sanity check")
    d.add_argument(
        "--max-message-size",
        type=_positive_int,
        default=DEFAULT_MAX_MESSAGE_SIZE,
        help=f"largest batch read, and largest a batch's records may decompress to, in bytes (default "
        f"{DEFAULT_MAX_MESSAGE_SIZE})",
    )
    d.add_argument(
        "--max-bytes", type=_positive_int, default=NO_MAX_BYTES, help="read at most this many bytes of each .log file"
    )
    _fs_option(d)
    d.set_defaults(func=cmd_dump_log, parser=d)

    s = sub.add_parser(
        "describe",
        help="topics, partitions, offsets and segments of a log dir",
        description="Describe a log dir: topics, partitions, log start/end offsets, segments, bytes.",
    )
    _root_arguments(s)
    s.add_argument("--topic", action="append", help="only these topics (repeatable)")
    s.add_argument("--json", action="store_true", help="print LogManager.describe() as JSON (its to_dict())")
    s.set_defaults(func=cmd_describe, parser=s)

    r = sub.add_parser(
        "delete-records",
        help="move a partition's log start offset up (kafka-delete-records.sh)",
        description="Delete the records of a partition before an offset, as kafka-delete-records.sh "
        "does: the log start offset moves up; whole segments below it are removed by "
        "the next retention run.",
    )
    _root_arguments(r)
    r.add_argument("--topic", required=True)
    r.add_argument("--partition", type=_non_negative_int, required=True)
    r.add_argument(
        "--offset",
        type=_option("long", at_least=-1, expected="an offset >= 0, or -1 for the high watermark"),
        required=True,
        help="the new log start offset; -1: the high watermark (the log end)",
    )
    r.set_defaults(func=cmd_delete_records, parser=r)

    m = sub.add_parser(
        "maintain",
        help="retention, compaction, delayed deletes, checkpoints and tables (Kafka's LogManager)",
        description="Run the maintenance job: per partition retention, compaction (cleanup.policy "
        "compact) and removal of .deleted files past file.delete.delay.ms; per log dir "
        "removal of deleted topics and the checkpoints. Prints one line per partition.",
    )
    _root_arguments(m)
    m.add_argument("--once", action="store_true", help="one pass, then exit (for cron or Airflow)")
    m.add_argument(
        "--interval-ms",
        type=_option("long", at_least=1, expected="a positive number of milliseconds"),
        default=DEFAULT_CHECK_INTERVAL_MS,
        help=f"time between passes without --once (log.retention.check.interval.ms; default "
        f"{DEFAULT_CHECK_INTERVAL_MS})",
    )
    m.add_argument("--topic", action="append", help="only these topics (repeatable)")
    m.add_argument(
        "--cleaner-config",
        action="append",
        default=[],
        type=_key_value,
        metavar="KEY=VALUE",
        help="log.cleaner.dedupe.buffer.size, log.cleaner.io.max.bytes.per.second, "
        "log.cleaner.io.buffer.load.factor, kafkalog.segment.merge.min.age.ms, "
        "kafkalog.maintenance.lease.ttl.ms or transactional.id.expiration.ms (repeatable)",
    )
    m.add_argument(
        "--spark",
        action="store_true",
        help="with --once: run the pass as a Spark job, the partitions spread over the executors",
    )
    m.add_argument("--master", default="local[*]", help="with --spark: the Spark master URL (default local[*])")
    m.set_defaults(func=cmd_maintain, parser=m)

    tb = sub.add_parser(
        "table",
        help="one pass of a topic's Iceberg table (table.mode)",
        description="Keep a topic's Iceberg table up to date now: one materialization pass, as `maintain` runs "
        "for every table (docs/tables.md). The last line names the table and its current metadata file, "
        "which any Iceberg reader opens without the catalog.",
    )
    _root_arguments(tb)
    tb.add_argument("--topic", required=True)
    tb.add_argument(
        "--forget",
        action="store_true",
        help="forget the topic's table instead (ROOT's record of it): its table configs may then change and the "
        "next pass makes or adopts a table from the log start; the table itself stays in its catalog",
    )
    tb.set_defaults(func=cmd_table, parser=tb)

    x = sub.add_parser(
        "export-to-broker",
        help="hand a topic to a Kafka broker: partition directories for its log.dir",
        description="Write a topic's partitions as Kafka partition directories (segments checked and "
        "indexed, partition.metadata with the cluster's topic id, leader-epoch-checkpoint) "
        "into a stopped broker's log dir, or into a staging directory to copy to the "
        "broker hosts. See docs/kafka-broker.md.",
    )
    _root_arguments(x)
    x.add_argument("--topic", required=True, help="the topic (created on the cluster first, same partition count)")
    x.add_argument(
        "--topic-id",
        metavar="ID",
        help="the cluster's TopicId for it (kafka-topics.sh --describe); required for a staging "
        "directory, read from the broker's partition directories otherwise",
    )
    x.add_argument(
        "--to",
        required=True,
        metavar="DIR",
        help="a stopped broker's log dir (it holds meta.properties), or a staging directory (missing, "
        "empty, or holding only partition directories)",
    )
    x.add_argument(
        "--partition",
        type=_non_negative_int,
        action="append",
        help="only this partition (repeatable; default: all, or in a broker's log dir those it holds)",
    )
    x.add_argument(
        "--allow-unclean-shutdown",
        action="store_true",
        help="export into a broker log dir without .kafka_cleanshutdown (the broker then recovers every "
        "segment of the log dir at its next start)",
    )
    x.set_defaults(func=cmd_export_to_broker, parser=x)
    parser.epilog = _command_list(sub) + "\n\n`kafkalog COMMAND --help` shows a command's options."
    return parser


def _command_list(sub: argparse._SubParsersAction) -> str:
    """The commands, one a line with its help string, as git and Kafka's tools list theirs."""
    commands = [(a.dest, a.help) for a in sub._choices_actions]
    width = max(len(name) for name, _ in commands)
    return "commands:\n" + "\n".join(f"  {name:<{width}}  {text}" for name, text in commands)


def _root_arguments(parser) -> None:
    """ROOT and the --fs options that reach it: every command that opens a ROOT takes both."""
    parser.add_argument("root", metavar="ROOT", help=ROOT_HELP)
    _fs_option(parser)


def _fs_option(parser) -> None:
    parser.add_argument(
        "--fs",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an fsspec storage option for ROOT, e.g. endpoint_url=http://127.0.0.1:9000 "
        "(repeatable; JSON values are decoded; credentials come from the environment)",
    )


def _manager(args) -> LogManager:
    return LogManager(args.root, storage_options_from_cli(args.fs))


def _existing(args) -> LogManager:
    """A LogManager for a log dir that must already exist (reading commands)."""
    lm = _manager(args)
    for d in lm.log_dirs:
        if lm.fs.isdir(d):
            continue
        if lm.fs.exists(d):
            hint = (
                f"; to print a segment or index file use: kafkalog dump-log {lm.url(d)}"
                if parse_segment_file(lm.fs.basename(d)) is not None
                else ""
            )
            raise KafkaStorageError(f"{lm.url(d)} is a file, not a log dir (a directory of topic partitions){hint}")
        if d == lm.root:
            raise KafkaStorageError(f"log dir {lm.url()} does not exist")
    return lm


_LOG_DIR_FILES = (ROOT_LOCK_FILE, "meta.properties") + CHECKPOINT_FILES


def not_a_log_dir(lm: LogManager) -> str | None:
    """Why ROOT is not a log dir, or None. A log dir holds topic files, partition directories (live or
    being deleted), checkpoint files or its lock file; an empty directory is an empty log dir. A
    directory holding only other things is not one (a partition directory, a project directory...)."""
    listings = {d: lm.fs.listdir(d) for d in lm.log_dirs if lm.fs.isdir(d)}
    tp = parse_partition_dir(lm.fs.basename(lm.root)) if len(lm.log_dirs) == 1 else None
    if tp is not None and any(parse_segment_file(f.name) is not None for f in listings.get(lm.root, ())):
        parent = lm.url(lm.fs.dirname(lm.root)) or "."
        return (
            f"{lm.url()} is the directory of partition {tp.partition} of topic '{tp.topic}', not a log dir: "
            f"describe its log dir (kafkalog describe {parent} --topic {tp.topic}), or print its segment "
            f"files with kafkalog dump-log"
        )
    others = []
    for files in listings.values():
        for f in files:
            if f.is_dir and parse_log_dir_name(f.name) is not None:
                return None
            if not f.is_dir and (f.name.endswith(TOPIC_FILE_SUFFIX) or f.name in _LOG_DIR_FILES):
                return None
            others.append(f.name)
    if not others:
        return None
    shown = ", ".join(sorted(others)[:3]) + (", ..." if len(others) > 3 else "")
    return (
        f"{lm.url()} is not a log dir: it holds no topic files (*{TOPIC_FILE_SUFFIX}), partition "
        f"directories (<topic>-<partition>) or checkpoint files, only {len(others)} other entr"
        f"{'y' if len(others) == 1 else 'ies'} ({shown})"
    )


# ---------------------------------------------------------------- topics


def _split_config_list(text: str) -> list[str]:
    """Split 'a=1,b=[x,y],c=2' at commas outside brackets (kafka-configs.sh --add-config syntax)."""
    items: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    items.append("".join(cur))
    return [i for i in (x.strip() for x in items) if i]


def parse_add_config(values: list[str]) -> dict[str, str]:
    pairs = parse_config_pairs(item for v in values for item in _split_config_list(v))
    return {k: (v[1:-1] if v.startswith("[") and v.endswith("]") else v) for k, v in pairs.items()}


def cmd_topics(args, stdin, out, err) -> int:
    lm = _manager(args) if args.create else _existing(args)
    needs_topic = args.create or args.alter or args.delete
    if needs_topic and not args.topic:
        args.parser.error("--topic is required with --create, --alter and --delete")
    if not args.delete and args.if_exists:
        args.parser.error("--if-exists goes with --delete")
    if not args.create and (args.partitions or args.config or args.if_not_exists):
        args.parser.error("--partitions, --config and --if-not-exists go with --create")
    if not args.alter and (args.add_config or args.delete_config):
        args.parser.error("--add-config and --delete-config go with --alter")
    if args.create:
        if args.if_not_exists and args.topic in lm.topics():
            return 0
        lm.create_topic(args.topic, args.partitions or 1, parse_config_pairs(args.config))
        out.write(f"Created topic {args.topic}.\n")
    elif args.delete:
        if args.if_exists and args.topic not in lm.topics():
            return 0
        lm.delete_topic(args.topic)
        out.write(f"Topic {args.topic} is marked for deletion.\n")
    elif args.list:
        for name in lm.topics():
            out.write(name + "\n")
    elif args.describe:
        topics = [args.topic] if args.topic else lm.topics()
        if args.topic:
            lm.topic(args.topic)  # a missing topic is an error, not an empty answer
        for t in lm.describe(topics).topics:
            configs = ",".join(f"{k}={v}" for k, v in sorted(t.config.items()))
            out.write(
                f"Topic: {t.topic}\tTopicId: {t.topic_id or 'none'}\t"
                f"PartitionCount: {len(t.partitions)}\tConfigs: {configs}\n"
            )
            for p in t.partitions:
                out.write(
                    f"\tTopic: {t.topic}\tPartition: {p.partition}\tLogStartOffset: {p.log_start_offset}"
                    f"\tLogEndOffset: {p.log_end_offset}\tSize: {p.size}\tSegments: {len(p.segments)}\n"
                )
    else:
        if not args.add_config and not args.delete_config:
            args.parser.error("--alter needs --add-config or --delete-config")
        add = parse_add_config(args.add_config)
        delete = [k for v in args.delete_config for k in _split_config_list(v)]
        current = lm.topic(args.topic).config.overrides
        unknown = [k for k in delete if k not in CONFIG_KEYS_BY_NAME]
        if unknown:
            raise InvalidConfigError(f"Unknown topic config name: {unknown[0]!r}")
        unset = [k for k in delete if k not in current]
        if unset:
            raise InvalidConfigError(f"Invalid config(s): {','.join(unset)} (not set on topic {args.topic})")
        both = sorted(set(add) & set(delete))
        if both:
            raise InvalidConfigError(f"Invalid config(s): {','.join(both)} (both added and deleted)")
        lm.alter_topic_config(args.topic, add, delete)
        out.write(f"Completed updating config for topic {args.topic}.\n")
    return 0


# ---------------------------------------------------------------- produce / consume


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def cmd_produce(args, stdin: BinaryIO, out, err) -> int:
    lm = _manager(args)
    produce(
        lm,
        args.topic,
        stdin,
        out,
        compression=args.compression,
        batch_size=args.batch_size,
        create=not args.no_create,
        partitions=args.partitions,
        progress=err if _isatty(err) else None,
        summary=err,
    )
    return 0


def _wants_ascii(stream) -> bool:
    enc = (getattr(stream, "encoding", None) or "utf-8").lower().replace("-", "").replace("_", "")
    return enc not in ("utf8", "utf8sig")


def cmd_consume(args, stdin, out, err) -> int:
    lm = _existing(args)
    if isinstance(args.offset, int) and args.partition is None:
        partitions = lm.topic(args.topic).partitions
        if partitions > 1:
            args.parser.error(
                f"--offset {args.offset} needs --partition: topic {args.topic} has {partitions} "
                f"partitions (or use earliest / latest)"
            )
    consume(
        lm,
        args.topic,
        out,
        partition=args.partition,
        offset=args.offset,
        timestamp=args.timestamp,
        max_messages=args.max_messages,
        ensure_ascii=_wants_ascii(out),
        isolation_level=args.isolation_level,
    )
    return 0


# ---------------------------------------------------------------- dump-log / describe


def cmd_dump_log(args, stdin, out, err) -> int:
    files = list(args.files) + [f for v in args.files_opt for f in v.split(",") if f]
    if not files:
        args.parser.error("give the files to dump (FILE... or --files a,b)")
    opts = DumpOptions(
        print_data_log=args.print_data_log,
        deep_iteration=args.deep_iteration,
        verify_index_only=args.verify_index_only,
        index_sanity_check=args.index_sanity_check,
        skip_record_metadata=args.skip_record_metadata,
        max_message_size=args.max_message_size,
        max_bytes=args.max_bytes,
    )
    with _fsspec_defaults(files, storage_options_from_cli(args.fs)):
        return dump_files(files, opts, out, err)


@contextlib.contextmanager
def _fsspec_defaults(urls: list[str], options: dict):
    """dump-log opens each file by its URL: the --fs options become fsspec's configured defaults
    (fsspec.config.conf) for those URLs' protocols while the files are dumped, then are taken back."""
    if not options:
        yield
        return
    protocols = {u.split("://", 1)[0] for u in urls if "://" in u} - {"file", "memory"}
    saved = {p: fsspec.config.conf.get(p) for p in protocols}
    try:
        for p in protocols:
            fsspec.config.conf[p] = {**(saved[p] or {}), **options}
        yield
    finally:
        for p, v in saved.items():
            if v is None:
                fsspec.config.conf.pop(p, None)
            else:
                fsspec.config.conf[p] = v


def _table(header: list[str], rows: list[list]) -> list[str]:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in cells]


def cmd_describe(args, stdin, out, err) -> int:
    lm = _existing(args)
    problem = not_a_log_dir(lm)
    if problem:
        raise KafkaStorageError(problem)
    if args.topic:
        for t in args.topic:
            lm.topic(t)
    doc = lm.describe(args.topic)
    if args.json:  # the document only: every message goes to stderr
        out.write(json.dumps(doc.to_dict(), indent=2) + "\n")
        return 0
    if not doc.topics:
        out.write(
            f"Log dir: {doc.root}\n\nNo topics (create one with: kafkalog topics ROOT --create "
            f"--topic T, or kafkalog produce ROOT --topic T).\n"
        )
        return 0
    parts, segs = [], []
    total = 0
    for t in doc.topics:
        for p in t.partitions:
            parts.append([t.topic, p.partition, p.log_start_offset, p.log_end_offset, p.size, len(p.segments)])
            total += p.size
            for s in p.segments:
                segs.append([t.topic, p.partition, s.base_offset, s.size, s.largest_timestamp])
    lines = [f"Log dir: {doc.root}", ""]
    lines += _table(["TOPIC", "PARTITION", "LOG-START-OFFSET", "LOG-END-OFFSET", "SIZE", "SEGMENTS"], parts)
    lines += [""] + _table(["TOPIC", "PARTITION", "BASE-OFFSET", "SIZE", "LARGEST-TIMESTAMP"], segs)
    tables = [_table_row(t) for t in doc.topics if t.table is not None]
    if tables:
        header = ["TOPIC", "TABLE", "MODE", "OFFSETS-BEHIND", "TIME-BEHIND-MS", "LAST-COMMIT-MS", "GAPS"]
        lines += [""] + _table(header, [row for row, _ in tables])
        lines += [note for _, notes in tables for note in notes]
    lines += ["", f"{len(doc.topics)} topic(s), {len(parts)} partition(s), {len(segs)} segment(s), {total} bytes"]
    out.write("\n".join(lines) + "\n")
    return 0


def _table_row(t) -> tuple[list, list[str]]:
    """A topic's table as a row of describe's TABLES section, and the lines under it (gaps, errors)."""
    d = t.table
    notes = [f"  {t.topic}: table state: {d.error}"] if d.error else []
    notes += [
        f"  {t.topic}: GAP: partition {p} offsets {a}..{b - 1} were deleted from the log before the table had them"
        for p, a, b in d.gaps
    ]
    mode = d.mode + (" (paused: table.mode=off)" if d.paused else "")
    last = d.committed_at_ms if d.committed_at_ms >= 0 else "never"
    return [t.topic, d.table, mode, d.offsets_behind, d.time_behind_ms, last, len(d.gaps)], notes


# ---------------------------------------------------------------- delete-records


def cmd_delete_records(args, stdin, out, err) -> int:
    lm = _existing(args)
    tp = TopicPartition(args.topic, args.partition)
    out.write("Executing records delete operation\n")
    low = lm.delete_records(tp, args.offset)
    out.write(f"Records delete operation completed:\npartition: {tp}\tlow_watermark: {low}\n")
    return 0


# ---------------------------------------------------------------- maintain


def cmd_maintain(args, stdin, out, err) -> int:
    lm = _existing(args)
    for t in args.topic or []:
        lm.topic(t)
    if args.spark and not args.once:
        args.parser.error("--spark runs one pass: use it with --once (a scheduler repeats it)")
    kwargs = dict(
        topics=args.topic,
        cleaner_settings=dict(args.cleaner_config),
        out=out,
        storage_options=storage_options_from_cli(args.fs),
    )
    from storage.log_maintenance import run_once  # the cleaner and its numba kernels: maintain only

    if args.spark:
        from .maintenance import run_on_spark

        reports = run_on_spark(args.root, master=args.master, **kwargs)
    elif args.once:
        reports = run_once(args.root, **kwargs)
    else:
        _maintain_loop(run_once, args.root, args.interval_ms, kwargs, out, err)
        return 0
    return 1 if any(r.errors for r in reports) or any(t.error for t in getattr(reports, "tables", ())) else 0


CLOCK: Time = SYSTEM_TIME  # maintain's loop: the wait between passes and the time of day it names (tests: a MockTime)


def _maintain_loop(run_once, root: str, interval_ms: int, kwargs: dict, out, err) -> None:
    """A pass every interval_ms (Kafka's log.retention.check.interval.ms, from one pass's start to the next's)
    until Ctrl-C, each followed by one line on stderr saying when the next runs. Ctrl-C ends the wait at once,
    or the pass in progress: every step of a pass is crash-safe (a compaction swap is finished or discarded
    when the partition is next opened), so stopping one mid-way is no worse than a crash."""
    try:
        while True:
            started = CLOCK.hi_res_clock_ms()
            run_once(root, **kwargs)
            wait_ms = max(0, interval_ms - (CLOCK.hi_res_clock_ms() - started))
            out.flush()  # the pass's lines now, not when a file's or pipe's buffer fills
            err.write(_next_pass_line(CLOCK.milliseconds(), wait_ms))
            err.flush()
            CLOCK.sleep(wait_ms)
    except KeyboardInterrupt:
        if _isatty(out):  # a pass's progress bar cleared, so that `kafkalog: interrupted` stands alone
            out.write("\r\033[K")
            out.flush()
        raise


def _next_pass_line(now_ms: int, wait_ms: int) -> str:
    """`next pass at 12:34:56 (in 60 s); Ctrl-C stops`: local time, with its date when that is not today."""
    now = datetime.datetime.fromtimestamp(now_ms / 1000)
    at = datetime.datetime.fromtimestamp((now_ms + wait_ms) / 1000)
    when = at.strftime("%H:%M:%S" if at.date() == now.date() else "%Y-%m-%d %H:%M:%S")
    seconds = f"{wait_ms / 1000:.3f}".rstrip("0").rstrip(".")
    return f"next pass at {when} (in {seconds} s); Ctrl-C stops\n"


# ---------------------------------------------------------------- table


class _TableProgress:
    """A bar of offsets read on a terminal, cleared before the pass's own lines."""

    def __init__(self, out):
        self.out, self.shown = out, False

    def __call__(self, done: int, total: int) -> None:
        width = 30
        filled = width * done // max(1, total)
        self.out.write(f"\r\033[K[{'#' * filled}{'.' * (width - filled)}] {done}/{total} offsets read")
        self.out.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.out.write("\r\033[K")
            self.out.flush()


def cmd_table(args, stdin, out, err) -> int:
    from storage.tables.table_config import TableConfig, require_pyiceberg
    from storage.tables.table_state import forget_state

    lm = _existing(args)
    meta = lm.topic(args.topic)
    if args.forget:
        gone = forget_state(lm.fs, lm.root, args.topic)
        out.write(
            f"Forgot the table of topic {args.topic}.\n" if gone else f"Topic {args.topic} has no table to forget.\n"
        )
        return 0
    if TableConfig.of(args.topic, meta.config) is None:
        raise InvalidConfigError(
            f"topic '{args.topic}' has no table: set one with kafkalog topics ROOT --alter --topic {args.topic} "
            f"--add-config table.mode=append (docs/tables.md)"
        )
    require_pyiceberg(args.topic)
    from storage.tables.materializer import materialize_topic

    progress = _TableProgress(out) if _isatty(out) else None
    try:
        rep = materialize_topic(lm, args.topic, storage_options=storage_options_from_cli(args.fs), progress=progress)
    finally:
        if progress is not None:
            progress.clear()
    if rep.error:
        raise TableError(rep.error)  # one line on stderr, exit 1, as every command's error
    out.write(rep.line() + "\n")
    out.write(f"table {rep.table}: {rep.metadata_location}\n")
    return 0


# ---------------------------------------------------------------- export-to-broker


def cmd_export_to_broker(args, stdin, out, err) -> int:
    from storage.export import export_topic

    lm = _existing(args)
    result = export_topic(
        lm,
        args.topic,
        args.to,
        topic_id=args.topic_id,
        partitions=args.partition,
        allow_unclean_shutdown=args.allow_unclean_shutdown,
        on_partition=lambda part: out.write(_partition_line(part)),
        uninterrupted=sigint_deferred,
    )
    out.write(summary_line(result))
    return 0


def _partition_line(p: PartitionExport) -> str:
    extra = []
    if p.skipped_segments:
        extra.append(f"{p.skipped_segments} segment(s) below the log start left out")
    if p.recordless_segments:
        extra.append(f"{p.recordless_segments} segment(s) holding no record left out")
    if p.epochs_reset:
        extra.append(f"partitionLeaderEpoch set to 0 in {p.epochs_reset} batch(es)")
    if p.producers_cleared:
        extra.append(f"producer id without a sequence cleared in {p.producers_cleared} batch(es)")
    if p.txn_batches:
        extra.append(
            f"{p.txn_batches} transactional batch(es) and marker(s) carried, {p.aborted_txns} aborted "
            f"transaction(s) in .txnindex, {p.producers} producer(s) in the snapshot at the log end"
        )
    return (
        f"{p.tp.topic}-{p.tp.partition}: {p.segments} segment(s), {_records(p.records, p.markers)}, {p.bytes} bytes, "
        f"log start "
        f"offset {p.broker_log_start}, log end offset {p.log_end}" + "".join(f"; {e}" for e in extra) + "\n"
    )


def _records(records: int, markers: int) -> str:
    """Data records as a consumer counts them, and the offsets transaction markers take beside them."""
    return f"{records} records" + (f" (and {markers} transaction markers, one offset each)" if markers else "")


def summary_line(r: ExportResult) -> str:
    segs = sum(p.segments for p in r.partitions)
    records = sum(p.records for p in r.partitions)
    markers = sum(p.markers for p in r.partitions)
    size = sum(p.bytes for p in r.partitions)
    head_ = (
        f"Exported {len(r.partitions)} partition(s) of topic {r.topic} (TopicId {r.topic_id}): {segs} segment(s), "
        f"{_records(records, markers)}, {size} bytes in {r.seconds:.2f} s, "
    )
    if r.broker_log_dir:
        text = head_ + f"into the broker's log dir {r.target}; start the broker"
        if r.not_here:
            text += (
                f". Partition(s) {', '.join(map(str, r.not_here))} have no directory in this log dir and were "
                f"not exported here: run this where the broker keeps them (another broker or log dir)"
            )
        return text + "\n"
    text = head_ + (
        f"into the staging directory {r.target}; copy its {r.topic}-<partition> directories into the "
        f"log dir of each broker that holds them, stopped cleanly"
    )
    if r.delete_records_file:
        text += (
            f". Some partitions start above their first segment: once the broker runs, "
            f"kafka-delete-records.sh --offset-json-file {r.delete_records_file} sets their log start offsets"
        )
    return text + "\n"


# ---------------------------------------------------------------- entry point


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """parse_args, but an unknown argument is reported by the subcommand it was given to, with its usage
    and a did-you-mean over that subcommand's option strings (argparse alone sends it to the top-level
    parser, whose usage says nothing about the subcommand's options)."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        owner = getattr(args, "parser", parser)
        options = [o for a in owner._actions for o in a.option_strings]
        hints = []
        for arg in extras:
            if arg.startswith("-"):
                close = difflib.get_close_matches(arg.split("=", 1)[0], options, n=1, cutoff=0.6)
                if close:
                    hints.append(f"{arg.split('=', 1)[0]}: did you mean {close[0]}?")
        owner.error(f"unrecognized arguments: {' '.join(extras)}" + (f" ({'; '.join(hints)})" if hints else ""))
    return args


def _silence(out) -> None:
    """Point stdout at /dev/null, so that the flush at exit does not fail again on a pipe nobody reads."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


def main(argv: list[str] | None = None, *, stdin: BinaryIO | TextIO | None = None) -> int:
    """Run one kafkalog command; returns the exit code (0 ok, 1 error, 2 usage, 130 interrupted)."""
    out, err = sys.stdout, sys.stderr
    if not logging.getLogger().handlers:  # the engine's warnings (a rebuilt index, a cut tail), one line each
        logging.basicConfig(format="kafkalog: warning: %(message)s", level=logging.WARNING)
    if stdin is None:
        stdin = sys.stdin.buffer if hasattr(sys.stdin, "buffer") else sys.stdin
    try:
        parser = build_parser()
        args = parse_args(parser, argv)
        if args.command is None:  # `kafkalog` alone: the usage error is the help, with its list of commands
            parser.print_help(err)
            return 2
        return args.func(args, stdin, out, err) or 0
    except SystemExit as e:  # argparse: --help (0) and usage errors (2)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except KeyboardInterrupt:  # Ctrl-C: one line, no traceback, the shell's code for SIGINT
        main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main_thread else None  # a second Ctrl-C
        try:
            try:
                out.flush()  # whole lines: what was printed so far
            except (OSError, ValueError):  # the reader of a pipe left too
                _silence(out)
            err.write("kafkalog: interrupted\n")
            err.flush()
        finally:
            if main_thread:
                signal.signal(signal.SIGINT, previous)
        return INTERRUPTED
    except BrokenPipeError:  # `kafkalog consume ... | head`: the reader left; stop quietly
        _silence(out)
        return 0
    except (KafkaLogError, OSError) as e:
        try:
            out.flush()
        except (OSError, ValueError):
            pass
        err.write(f"kafkalog: error: {_one_line(e)}\n")
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
