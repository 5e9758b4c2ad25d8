"""A quiet SparkSession for the examples and `kafkalog maintain --spark`, and one-line endings.

Spark's console (start-up WARN lines, `[Stage N:>` bars, Java traces of jobs it cancels) says nothing a
user of these commands can act on: `session()` keeps Spark's own logging to errors from the first line,
says what it is waiting for, and turns a missing Java into one line. `Interrupt` makes Ctrl-C a request
the caller honours between micro-batches (or at once outside a stream) instead of pyspark's handler,
which cancels every job mid-task and raises KeyboardInterrupt wherever the driver happens to be.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

# Spark's loggers whose errors the callers report themselves, in one line, from query.exception() or the
# raised error: a stream stopped or failed logs them as ERROR with a Java trace.
_REPORTED_BY_CALLER = (
    "org.apache.spark.sql.execution.streaming.MicroBatchExecution",
    "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",
    "org.apache.spark.sql.execution.datasources.v2.WriteToDataSourceV2Exec",
    "org.apache.spark.sql.execution.datasources.v2.AppendDataExec",
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.executor.Executor",
)
_active: Interrupt | None = None  # the Interrupt in force, which session() re-installs after pyspark's handler
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C


def say(message: str) -> None:
    """A progress line on stderr (stdout stays the command's output), flushed at once."""
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def still(what: str, every_s: float = 5.0) -> Iterator[None]:
    """Say `what (N s)` every `every_s` seconds while the block runs: no silence over 10 s on a first run
    (a JVM's start, a first import, a first compile of the record kernels)."""
    began = time.monotonic()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(every_s):
            say(f"{what} ({time.monotonic() - began:.0f} s)")

    threading.Thread(target=beat, daemon=True).start()
    try:
        yield
    finally:
        done.set()


def _quiet_conf_dir() -> str:
    """A temporary SPARK_CONF_DIR whose log4j2.properties keeps Spark's logging to errors from the start
    (setLogLevel comes after the start-up lines); removed when the process ends."""
    conf_dir = tempfile.mkdtemp(prefix="kafkalog-spark-conf-")
    atexit.register(shutil.rmtree, conf_dir, True)
    lines = [
        "rootLogger.level = error",
        "rootLogger.appenderRef.stderr.ref = console",
        # Spark gives pyspark's gateway its own level (WARN, announced on stderr) unless one is set here
        "logger.repl.name = org.apache.spark.api.python.PythonGatewayServer",
        "logger.repl.level = error",
        "appender.console.type = Console",
        "appender.console.name = console",
        "appender.console.target = SYSTEM_ERR",
        "appender.console.layout.type = PatternLayout",
        "appender.console.layout.pattern = %p %c{1}: %m%n",
    ]
    for i, name in enumerate(_REPORTED_BY_CALLER):
        lines += [f"logger.quiet{i}.name = {name}", f"logger.quiet{i}.level = off"]
    with open(os.path.join(conf_dir, "log4j2.properties"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return conf_dir


MIN_JAVA = 17  # Spark 4's floor


def java_missing_reason() -> str | None:
    """Why Spark cannot start a JVM here, in one line (no `java`, or one older than Java 17), or None."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else None
    if java is None or not os.path.exists(java):
        java = shutil.which("java")
    if java is None:
        return f"Spark needs Java {MIN_JAVA} or later: no `java` on PATH and no JAVA_HOME; install a JDK and run again"
    version = java_major_version(java)
    if version is not None and version < MIN_JAVA:
        return f"Spark needs Java {MIN_JAVA} or later; {java} is Java {version} (set JAVA_HOME to a newer JDK)"
    return None


def java_major_version(java: str) -> int | None:
    """The major version `java -version` reports ("1.8.0_392" is 8, "17.0.9" is 17), or None if unknown."""
    try:
        p = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', p.stderr + p.stdout)
    if m is None:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def session(app: str, *, master: str = "local[2]", conf: dict | None = None, prog: str = "kafkalog"):
    """A SparkSession with Spark's console kept to errors, progress bars off, and the workers running this
    interpreter (which has kafkalog-ds installed). Exits with one line when Spark cannot start."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_CONF_DIR", _quiet_conf_dir())
    reason = java_missing_reason()
    if reason is not None:
        sys.exit(f"{prog}: error: {reason}")
    say(f"{prog}: starting Spark ({master}); the first start takes 10-30 s")
    began = time.monotonic()
    with still(f"{prog}: still starting Spark"):
        from pyspark.sql import SparkSession  # a first import after install compiles pyspark's modules

        builder = (
            SparkSession.builder.master(master)
            .appName(app)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
        )
        for key, value in (conf or {}).items():
            builder = builder.config(key, value)
        try:
            spark = builder.getOrCreate()
        except Exception as e:  # pyspark's JAVA_GATEWAY_EXITED and the like: the JVM did not come up
            sys.exit(f"{prog}: error: Spark did not start: {' '.join(str(e).split())[:300]}")
    spark.sparkContext.setLogLevel("ERROR")
    if _active is not None:  # SparkContext put pyspark's own SIGINT handler in place: ours again
        _active.attach(spark)
    say(f"{prog}: Spark started in {time.monotonic() - began:.0f} s")
    return spark


class Interrupt:
    """Ctrl-C (SIGINT) as a request: `requested` turns true and the caller stops at a point of its choosing.

    Inside `with Interrupt(spark) as stop:` a stream's wait loop checks `stop.requested` and stops the query
    between micro-batches. A second Ctrl-C, or one that comes while `stop.immediate` is true (a batch job),
    cancels Spark's jobs and raises KeyboardInterrupt, which `main()`-level code turns into one line and
    exit code 130. The previous handler (pyspark's) comes back on exit.
    """

    def __init__(self, spark=None, *, prog: str = "kafkalog"):
        self.spark = spark
        self.prog = prog
        self.requested = False
        self.immediate = False
        self._previous: object = None

    def __enter__(self) -> Interrupt:
        global _active
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_signal)
            _active = self
        return self

    def __exit__(self, *exc) -> None:
        global _active
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)  # type: ignore[arg-type]
            _active = None

    def attach(self, spark) -> None:
        """Cancel this session's jobs on an immediate Ctrl-C, and take SIGINT back from pyspark's handler."""
        self.spark = spark
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        if self.requested or self.immediate:
            self.cancel_jobs()
            raise KeyboardInterrupt
        self.requested = True
        say(f"{self.prog}: interrupted: stopping after the micro-batch under way (Ctrl-C again to stop at once)")

    def cancel_jobs(self) -> None:
        """Silence Spark (the jobs it cancels log traces) and cancel them."""
        if self.spark is None:
            return
        try:
            self.spark.sparkContext.setLogLevel("OFF")
            self.spark.sparkContext.cancelAllJobs()
        except Exception:  # the JVM may be gone already; there is nothing left to cancel
            pass


def stop_between_batches(query, *, deadline: float | None = None) -> None:
    """Stop a streaming query when no micro-batch is under way, so none is cut short (that logs a
    cancelled task); a query that is down already is left as it is."""
    while query.isActive and query.status["isTriggerActive"]:
        if deadline is not None and time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    query.stop()


def exit_on_interrupt(spark, *, prog: str, immediate: bool = True) -> Interrupt:
    """For a script: Ctrl-C cancels Spark's jobs and ends the process with one line on stderr and exit code
    130, with no traceback (Python's or Java's). immediate=False: the first Ctrl-C only sets `requested`
    (a stream's loop stops between micro-batches), a second one ends the process."""
    stop = Interrupt(spark, prog=prog).__enter__()
    stop.immediate = immediate
    previous = sys.excepthook

    def hook(kind, value, tb) -> None:
        if issubclass(kind, KeyboardInterrupt):
            print(f"{prog}: interrupted", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(EXIT_INTERRUPTED)  # the JVM goes with its gateway; nothing here is half written
        previous(kind, value, tb)

    sys.excepthook = hook
    return stop
