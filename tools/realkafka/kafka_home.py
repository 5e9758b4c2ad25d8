"""A Kafka installation's layout built from the Maven jars: a stand-in for the distribution's scripts.

Docs tell a reader to run `bin/kafka-topics.sh ...` from Kafka's installation directory. The tests have
Kafka 4.4's jars (jars.py), not its distribution, so `KafkaHome.build()` lays out what those commands need:

    bin/kafka-run-class.sh      java with the jars as classpath (kafka-run-class.sh's job); LOG_DIR is
                                `logs/`, passed as -Dkafka.logs.dir; `-daemon` runs the class with nohup,
                                output in logs/kafkaServer.out
    bin/kafka-<tool>.sh         one line each: the main class Kafka's own script runs (SCRIPTS, checked
                                against Kafka's bin/*.sh and the 4.4 jars: DumpLogSegments is now in the
                                tools module, org.apache.kafka.tools)
    bin/kafka-server-start.sh   kafka.Kafka with config/log4j2.yaml, as Kafka's
    bin/kafka-server-stop.sh    SIGTERM (a controlled shutdown), as Kafka's
    config/server.properties    one KRaft node (process.roles=broker,controller), listeners on free ports
    config/log4j2.yaml          the distribution's broker logging: the root logger to logs/server.log and
                                stdout; controller, cleaner, state-change, request and authorizer loggers
                                to their own files, not to server.log
    config/tools-log4j2.yaml    the tools' logging: WARN and up to stderr

Differences on purpose: kafka-server-stop.sh signals only the broker this directory started (the PID the
start script keeps in logs/kafkaServer.pid), where Kafka's signals every `kafka.Kafka` process of the host
(other tests run brokers of their own); heaps are small and the JIT quick (a shared 2-core machine); no GC log.
`format()` formats the storage once, as a user does (kafka-storage.sh format --standalone).
"""

from __future__ import annotations

import base64
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from . import jars

# script -> the Java main class Kafka's bin/<script> runs through kafka-run-class.sh
SCRIPTS = {
    "kafka-topics.sh": "org.apache.kafka.tools.TopicCommand",
    "kafka-get-offsets.sh": "org.apache.kafka.tools.GetOffsetShell",
    "kafka-console-consumer.sh": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-delete-records.sh": "org.apache.kafka.tools.DeleteRecordsCommand",
    "kafka-dump-log.sh": "org.apache.kafka.tools.DumpLogSegments",
    "kafka-storage.sh": "kafka.tools.StorageTool",
}
BROKER_MAIN = "kafka.Kafka"
BROKER_HEAP = "-Xmx768m"
TOOL_HEAP = "-Xmx256m"
JVM_OPTS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true"

RUN_CLASS = """#!/bin/bash
# Stand-in for Kafka's kafka-run-class.sh (tools/realkafka/kafka_home.py): the Maven jars as classpath.
base_dir=$(cd "$(dirname "$0")/.." && pwd)
LOG_DIR=${{LOG_DIR:-$base_dir/logs}}
KAFKA_HEAP_OPTS=${{KAFKA_HEAP_OPTS:-{tool_heap}}}
KAFKA_LOG4J_OPTS=${{KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=$base_dir/config/tools-log4j2.yaml}}
CLASSPATH='{classpath}'
daemon=false
if [ "$1" = "-daemon" ]; then daemon=true; shift; fi
JAVA_ARGS=($KAFKA_HEAP_OPTS {jvm_opts} -Dkafka.logs.dir="$LOG_DIR" $KAFKA_LOG4J_OPTS -cp "$CLASSPATH" $KAFKA_OPTS "$@")
if [ "$daemon" = true ]; then
  mkdir -p "$LOG_DIR"
  nohup java "${{JAVA_ARGS[@]}}" > "$LOG_DIR/kafkaServer.out" 2>&1 < /dev/null &
  echo $! > "$LOG_DIR/kafkaServer.pid"
else
  exec java "${{JAVA_ARGS[@]}}"
fi
"""

TOOL = """#!/bin/bash
exec "$(dirname "$0")/kafka-run-class.sh" {main} "$@"
"""

SERVER_START = """#!/bin/bash
# Stand-in for Kafka's kafka-server-start.sh: [-daemon] server.properties
if [ $# -lt 1 ]; then echo "USAGE: $0 [-daemon] server.properties [--override property=value]*"; exit 1; fi
base_dir=$(dirname "$0")
export KAFKA_LOG4J_OPTS=${{KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=$base_dir/../config/log4j2.yaml}}
export KAFKA_HEAP_OPTS=${{KAFKA_HEAP_OPTS:-{broker_heap}}}
EXTRA_ARGS=""
if [ "$1" = "-daemon" ]; then EXTRA_ARGS="-daemon"; shift; fi
exec "$base_dir/kafka-run-class.sh" $EXTRA_ARGS {main} "$@"
"""

SERVER_STOP = """#!/bin/bash
# Stand-in for Kafka's kafka-server-stop.sh: SIGTERM to the broker, which shuts down cleanly. Kafka's signals
# every kafka.Kafka process of the host; this one only the broker this directory started.
pid_file="$(dirname "$0")/../logs/kafkaServer.pid"
PIDS=$(cat "$pid_file" 2>/dev/null)
if [ -z "$PIDS" ] || ! kill -0 $PIDS 2>/dev/null; then
  echo "No kafka server to stop"
  exit 1
fi
kill -s "${SIGNAL:-TERM}" $PIDS
"""

# Kafka 4.4's config/log4j2.yaml, appenders and loggers as the distribution routes them (server.log gets the
# root logger and the loggers with additivity; hourly rolling files).
BROKER_LOG4J = """Configuration:
  Properties:
    Property:
      - name: "kafka.logs.dir"
        value: "."
      - name: "logPattern"
        value: "[%d] %p %m (%c)%n"
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "${logPattern}"
    RollingFile:
{appenders}
  Loggers:
    Root:
      level: INFO
      AppenderRef:
        - ref: STDOUT
        - ref: KafkaAppender
    Logger:
      - name: kafka
        level: INFO
      - name: org.apache.kafka
        level: INFO
{loggers}
"""
FILES = {  # appender -> file under kafka.logs.dir
    "KafkaAppender": "server.log",
    "StateChangeAppender": "state-change.log",
    "RequestAppender": "kafka-request.log",
    "CleanerAppender": "log-cleaner.log",
    "ControllerAppender": "controller.log",
    "AuthorizerAppender": "kafka-authorizer.log",
}
OWN_FILE_LOGGERS = [  # (logger, level, appender): additivity false, so not in server.log
    ("kafka.request.logger", "WARN", "RequestAppender"),
    ("kafka.network.RequestChannel$", "WARN", "RequestAppender"),
    ("org.apache.kafka.controller", "INFO", "ControllerAppender"),
    ("org.apache.kafka.storage.internals.log.LogCleaner", "INFO", "CleanerAppender"),
    ("org.apache.kafka.storage.internals.log.LogCleaner$CleanerThread", "INFO", "CleanerAppender"),
    ("org.apache.kafka.storage.internals.log.Cleaner", "INFO", "CleanerAppender"),
    ("state.change.logger", "INFO", "StateChangeAppender"),
    ("kafka.authorizer.logger", "INFO", "AuthorizerAppender"),
]
TOOLS_LOG4J = """Configuration:
  Appenders:
    Console:
      name: STDERR
      target: SYSTEM_ERR
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDERR
"""

# a one-node cluster: replication factors 1; the rest is Kafka's defaults but for what makes a test wait
SERVER_DEFAULTS = {
    "num.partitions": "1",
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",  # a console consumer's group forms at once (default 3 s)
    "log.retention.check.interval.ms": "1000",  # retention (Kafka's default 7 days) is applied within seconds
    "log.initial.task.delay.ms": "0",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _broker_log4j() -> str:
    appenders = "".join(
        f'      - name: {name}\n        fileName: "${{sys:kafka.logs.dir}}/{file}"\n'
        f'        filePattern: "${{sys:kafka.logs.dir}}/{file}.%d{{yyyy-MM-dd-HH}}"\n'
        '        PatternLayout:\n          pattern: "${logPattern}"\n'
        "        TimeBasedTriggeringPolicy:\n          modulate: true\n          interval: 1\n"
        for name, file in FILES.items()
    )
    loggers = "".join(
        f'      - name: "{logger}"\n        level: {level}\n        additivity: false\n'
        f"        AppenderRef:\n          ref: {appender}\n"
        for logger, level, appender in OWN_FILE_LOGGERS
    )
    return BROKER_LOG4J.replace("{appenders}", appenders.rstrip("\n")).replace("{loggers}", loggers.rstrip("\n"))


class KafkaHome:
    """A directory laid out as a Kafka installation (bin/, config/, logs/) for one KRaft node whose log dir
    is `log_dir` and whose clients connect to `localhost:<port>`."""

    def __init__(self, home: str | os.PathLike, log_dir: str | os.PathLike, configs: dict[str, str] | None = None):
        self.home = Path(home)
        self.log_dir = Path(log_dir)
        self.configs = {**SERVER_DEFAULTS, **(configs or {})}
        self.port = _free_port()
        self.controller_port = _free_port()

    @property
    def bootstrap(self) -> str:
        return f"localhost:{self.port}"

    @property
    def server_log(self) -> Path:
        return self.home / "logs" / "server.log"

    def server_log_text(self) -> str:
        return self.server_log.read_text(errors="replace") if self.server_log.exists() else ""

    def build(self) -> KafkaHome:
        """Write bin/, config/ and an empty logs/."""
        bin_dir, config = self.home / "bin", self.home / "config"
        for d in (bin_dir, config, self.home / "logs"):
            d.mkdir(parents=True, exist_ok=True)
        scripts = {
            "kafka-run-class.sh": RUN_CLASS.format(
                tool_heap=TOOL_HEAP, classpath=jars.kafka_classpath(), jvm_opts=JVM_OPTS
            ),
            "kafka-server-start.sh": SERVER_START.format(broker_heap=BROKER_HEAP, main=BROKER_MAIN),
            "kafka-server-stop.sh": SERVER_STOP,
            **{name: TOOL.format(main=main) for name, main in SCRIPTS.items()},
        }
        for name, text in scripts.items():
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"localhost:{self.controller_port}",
            "listeners": f"PLAINTEXT://localhost:{self.port},CONTROLLER://localhost:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://localhost:{self.port}",
            "inter.broker.listener.name": "PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.log_dir),
            **self.configs,
        }
        (config / "server.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (config / "log4j2.yaml").write_text(_broker_log4j())
        (config / "tools-log4j2.yaml").write_text(TOOLS_LOG4J)
        return self

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run bin/<args[0]> from the installation directory, as a user does."""
        done = subprocess.run(
            [str(self.home / "bin" / args[0]), *args[1:]], cwd=self.home, capture_output=True, text=True
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done

    def format(self) -> None:
        """kafka-storage.sh format --standalone with a fresh cluster id, once (as Kafka's quickstart)."""
        cluster_id = "-"
        while cluster_id.startswith("-"):  # as Kafka's Uuid.randomUuid: no id the tool reads as an option
            cluster_id = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        self.run("kafka-storage.sh", "format", "--standalone", "-t", cluster_id, "-c", "config/server.properties")

    def pid(self) -> int | None:
        """The PID of the broker the start script last started, if that process still runs."""
        try:
            pid = int((self.home / "logs" / "kafkaServer.pid").read_text())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        return pid

    def kill(self) -> None:
        """Clean-up after a test: SIGKILL the broker this directory started, if it still runs."""
        pid = self.pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60.0  # a hang guard only: SIGKILL ends a process at once
        while self.pid() is not None and time.monotonic() < deadline:
            time.sleep(0.05)
