"""A real Kafka broker for the tests: one combined KRaft broker+controller on 127.0.0.1, started by us.

KafkaBroker formats its storage directory (kafka-storage.sh format), starts `kafka.Kafka` with free ports and
its log in a file, waits until the broker answers a request, and stops it by its PID (SIGTERM: a controlled,
clean shutdown; kill() is the unclean one). Its log is kept in the work directory and quoted by `BrokerError`.
`tool()` drives Kafka's own Java producer, consumer and admin client (KafkaTool.java, compiled per version);
`dump_log()` runs Kafka's DumpLogSegments.

Each Kafka version of jars.KAFKA_VERSIONS runs (`version=`, the newest by default). What differs between the
generations is handled here, so that a test reads the same on both:

    quorum          4.x: controller.quorum.bootstrap.servers, `kafka-storage format --standalone` (KIP-853);
                    3.x: a static controller.quorum.voters (1@127.0.0.1:<port>), a plain `format`
    broker configs  share.coordinator.* exist from 4.x only (a 3.x broker would warn of unknown keys)
    topic configs   4.x refuses segment.bytes below 1 MiB and takes the test-only internal.segment.bytes for
                    smaller segments; 3.x has no such key and takes segment.bytes down to 14 bytes: tool()
                    sends a 3.x broker internal.segment.bytes as segment.bytes
    tool classes    DumpLogSegments is org.apache.kafka.tools.DumpLogSegments from 4.x, kafka.tools.DumpLogSegments
                    (Scala, kafka_2.13) in 3.x: `main_class()` gives a version's name for Kafka 4's
    tool output     3.x's DumpLogSegments ends the line of a producer snapshot's entry that holds no batch with a
                    space ("lastTimestamp: N "), 4.x's (and `kafkalog dump-log`) not: dump_log_output() drops it
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from . import jars

HERE = Path(__file__).resolve().parent
TOOL_SOURCE = HERE / "KafkaTool.java"
HANG_S = 180.0  # a guard against a hang only: every wait below is on a condition
READY_LINE = "Kafka Server started"
# Kafka 4's main classes that another generation has under another name: {Kafka 4's name: {major: name}}
MOVED_MAINS = {"org.apache.kafka.tools.DumpLogSegments": {3: "kafka.tools.DumpLogSegments"}}
# topic configs Kafka 4 has that 3.x names otherwise: {Kafka 4's key: {major: key}}
MOVED_TOPIC_CONFIGS = {"internal.segment.bytes": {3: "segment.bytes"}}

BROKER_DEFAULTS = {
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "log.cleaner.backoff.ms": "200",  # the cleaner looks for work often (default 15 s)
    "log.retention.check.interval.ms": "1000",  # retention runs often (default 5 min)
    "log.initial.task.delay.ms": "0",  # and starts at once (default 30 s)
    # the tests write timestamps from 2023; a topic whose test is about retention sets retention.ms itself
    "log.retention.ms": "-1",
}
SINCE_4 = ("share.coordinator.",)  # broker config prefixes a 3.x broker does not know
# 3.x's DumpLogSegments line of a producer snapshot's entry that holds no batch: ends with a space (4.x's does not)
BATCHLESS_ENTRY = re.compile(r"^(producerId: [^\n]* lastTimestamp: -?\d+) $", re.MULTILINE)


class BrokerError(RuntimeError):
    """The broker failed to start, died or a tool run failed; the message quotes the broker's log."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def major(version: str) -> int:
    return int(version.split(".")[0])


def main_class(name: str, version: str = jars.NEWEST_KAFKA) -> str:
    """The main class that Kafka 4 calls `name`, as this version names it."""
    return MOVED_MAINS.get(name, {}).get(major(version), name)


def topic_configs(configs: dict[str, str], version: str = jars.NEWEST_KAFKA) -> dict[str, str]:
    """Topic configs as Kafka 4 spells them, as this version takes them."""
    return {MOVED_TOPIC_CONFIGS.get(k, {}).get(major(version), k): v for k, v in configs.items()}


def tool_classes(version: str = jars.NEWEST_KAFKA) -> Path:
    """KafkaTool compiled once per Kafka version against its kafka-clients, into the jar cache."""
    key = hashlib.sha256(TOOL_SOURCE.read_bytes() + str(jars.kafka_dir(version)).encode()).hexdigest()[:12]
    out = jars.cache_dir() / f"kafkatool-{version}-{key}"
    if not (out / "KafkaTool.class").exists():
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["javac", "-nowarn", "-cp", jars.kafka_classpath(version), "-d", str(tmp), str(TOOL_SOURCE)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise BrokerError(f"javac KafkaTool.java failed:\n{done.stderr}")
        try:
            os.rename(tmp, out)
        except OSError:  # another process compiled it first
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def java_command(version: str, main: str, *args: str, heap: str = "512m") -> list[str]:
    """`java` running a Kafka version's main class (named as Kafka 4 names it: main_class()) on its jars."""
    return [
        "java",
        f"-Xmx{heap}",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-cp",
        jars.kafka_classpath(version),
        main_class(main, version),
        *args,
    ]


class KafkaBroker:
    """One KRaft node (process.roles=broker,controller) of a Kafka version (jars.KAFKA_VERSIONS) whose data lives
    in `workdir`/data; with log_dirs=n, in n log dirs (`log_dirs`; `log_dir` is the first, also the metadata's)."""

    def __init__(
        self,
        workdir: str | os.PathLike,
        configs: dict[str, str] | None = None,
        heap: str = "768m",
        *,
        version: str = jars.NEWEST_KAFKA,
        log_dirs: int = 1,
    ):
        if version not in jars.KAFKA_VERSIONS:
            raise ValueError(f"Kafka {version} is not one of the tests' versions {jars.KAFKA_VERSIONS}")
        if log_dirs < 1:
            raise ValueError(f"log_dirs={log_dirs}: a broker has at least one log dir")
        self.version = version
        self.major = major(version)
        self.workdir = Path(workdir)
        self.log_dirs = [self.workdir / "data"] + [self.workdir / f"data-{i}" for i in range(1, log_dirs)]
        self.log_dir = self.log_dirs[0]
        self.log_file = self.workdir / "server.log"
        defaults = {k: v for k, v in BROKER_DEFAULTS.items() if self.major >= 4 or not k.startswith(SINCE_4)}
        self.configs = {**defaults, **(configs or {})}
        self.heap = heap
        self.proc: subprocess.Popen | None = None
        self.port = self.controller_port = 0
        self._formatted = False

    # ---- lifecycle ----

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _java(self, main: str, *args: str, log4j: bool = True) -> list[str]:
        """java running `main` (Kafka 4's name; this version's class: main_class()) on this version's jars."""
        cmd = java_command(self.version, main, *args, heap=self.heap)
        if log4j:
            cmd.insert(1, f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}")
        return cmd

    def _write_config(self) -> Path:
        self.port, self.controller_port = _free_port(), _free_port()
        if self.major >= 4:  # the voters come from the log, bootstrapped by `format --standalone`
            quorum = {"controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}"}
        else:  # a static voter set, by node id (the port may change between starts)
            quorum = {"controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}"}
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            **quorum,
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": ",".join(str(d) for d in self.log_dirs),
            **self.configs,
        }
        path = self.workdir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.workdir / "log4j2.properties").write_text(
            "status = warn\n"
            "appender.f.type = File\nappender.f.name = F\nappender.f.append = true\n"
            f"appender.f.fileName = {self.log_file}\n"
            "appender.f.layout.type = PatternLayout\nappender.f.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = INFO\nrootLogger.appenderRef.f.ref = F\n"
            # the per-request and metadata chatter of a test broker says nothing about its logs
            "logger.kafka.name = kafka.request.logger\nlogger.kafka.level = WARN\n"
        )
        return path

    def start(self) -> KafkaBroker:
        """Format on first start, start the broker (new ports each time) and wait until it answers."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self._write_config()
        if not self._formatted and not (self.log_dir / "meta.properties").exists():
            cluster_id = "-"
            while cluster_id.startswith("-"):  # as Kafka's Uuid.randomUuid: no id the tool reads as an option
                cluster_id = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
            standalone = ["--standalone"] if self.major >= 4 else []
            done = subprocess.run(
                self._java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config), *standalone),
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                raise BrokerError(f"kafka-storage format failed:\n{done.stdout}\n{done.stderr}")
        self._formatted = True
        self._log_start = self.log_file.stat().st_size if self.log_file.exists() else 0
        out = open(self.workdir / "stdout.txt", "ab")
        self.proc = subprocess.Popen(
            self._java("kafka.Kafka", str(config)), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        out.close()
        self._wait(self._answers, "the broker to answer on " + self.bootstrap)
        return self

    def ensure_running(self) -> KafkaBroker:
        """Start the broker unless it runs (tests sharing it may have stopped it)."""
        if not self.running:
            self.start()
        return self

    def _answers(self) -> bool:
        if READY_LINE not in self.log_since_start():
            return False
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=5):
                return True
        except OSError:
            return False

    def _wait(self, condition, what: str) -> None:
        deadline = time.monotonic() + HANG_S
        while not condition():
            if self.proc is not None and self.proc.poll() is not None:
                raise BrokerError(
                    f"the broker exited ({self.proc.returncode}) while waiting for {what}\n" + self.log_tail()
                )
            if time.monotonic() > deadline:
                raise BrokerError(f"no sign of {what} after {HANG_S:.0f} s (a hang)\n" + self.log_tail())
            time.sleep(0.05)

    def stop(self) -> None:
        """A clean shutdown: SIGTERM to the broker's PID, then wait for it to exit."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(HANG_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                raise BrokerError("the broker did not stop on SIGTERM\n" + self.log_tail()) from None
        self.proc = None

    def kill(self) -> None:
        """An unclean stop (SIGKILL)."""
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # ---- its log ----

    def log_text(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def log_since_start(self) -> str:
        if not self.log_file.exists():
            return ""
        with open(self.log_file, "rb") as f:
            f.seek(self._log_start)
            return f.read().decode(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        # the config dump (tab-indented lines) says nothing a failure needs
        tail = [line for line in self.log_text().splitlines() if not line.startswith("\t")][-lines:]
        return f"--- last {len(tail)} lines of {self.log_file} ---\n" + "\n".join(tail)

    def wait_for_log(self, needle: str, what: str | None = None) -> str:
        """Wait until the log since the last start holds `needle`; returns that log."""
        self._wait(lambda: needle in self.log_since_start(), what or repr(needle))
        return self.log_since_start()

    # ---- Kafka's own clients and tools ----

    def _for_this_version(self, command: dict) -> dict:
        """A KafkaTool command with its topic configs (createTopic's configs, alterConfigs' set) as this version
        takes them (topic_configs())."""
        key = {"createTopic": "configs", "alterConfigs": "set"}.get(command.get("op", ""))
        if key is None or not command.get(key):
            return command
        return {**command, key: topic_configs(command[key], self.version)}

    def tool(self, *commands: dict) -> list:
        """Run KafkaTool commands (Kafka's Java producer, consumer, admin) in one JVM; one result each."""
        cmd = [
            "java",
            "-Xmx512m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-Dlog4j2.level=WARN",
            "-cp",
            f"{jars.kafka_classpath(self.version)}{os.pathsep}{tool_classes(self.version)}",
            "KafkaTool",
            self.bootstrap,
        ]
        sent = [self._for_this_version(c) for c in commands]
        done = subprocess.run(cmd, input=json.dumps(sent), capture_output=True, text=True)
        if done.returncode != 0:
            raise BrokerError(
                f"KafkaTool {[c['op'] for c in commands]} failed:\n"
                + "\n".join(done.stderr.splitlines()[-30:])
                + "\n"
                + self.log_tail(20)
            )
        return json.loads(done.stdout)

    def dump_log_output(self, files: Iterable[str | os.PathLike], *flags: str) -> tuple[str, str]:
        """This version's DumpLogSegments (kafka-dump-log.sh) over these files: (stdout, stderr). Its stderr holds
        its report of index entries that do not match the log and of non-consecutive offsets."""
        args = ["--files", ",".join(str(f) for f in files), *flags]
        done = subprocess.run(
            self._java("org.apache.kafka.tools.DumpLogSegments", *args, log4j=False), capture_output=True, text=True
        )
        if done.returncode != 0:
            raise BrokerError(f"DumpLogSegments {args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        if self.major < 4:  # as 4.x prints it (the module's docstring: tool output)
            return BATCHLESS_ENTRY.sub(r"\1", done.stdout), done.stderr
        return done.stdout, done.stderr

    def dump_log(self, files: Iterable[str | os.PathLike], *flags: str) -> str:
        """This version's DumpLogSegments (kafka-dump-log.sh) over these files: what it prints on stdout."""
        return self.dump_log_output(files, *flags)[0]
