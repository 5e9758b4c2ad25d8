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
    # a task that query.stop() cancels: "Aborting task" and "Aborted commit for partition", each with a trace
    "org.apache.spark.util.Utils",
    "org.apache.spark.sql.execution.datasources.v2.DataWritingSparkTask",
    # spark.stop() while a task's status update is in flight: "Exception in statusUpdate" (its pool shut down)
    "org.apache.spark.scheduler.TaskSchedulerImpl",
)
_active: Interrupt | None = None  # the Interrupt in force (session() tells it the SparkSession)
_interrupted = False  # a Ctrl-C came: an error from here on is its consequence (a JVM call cut short)
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C


_said = threading.RLock()  # a progress line and a Ctrl-C's line never cross: see say()


@contextlib.contextmanager
def _no_interrupt_inside() -> Iterator[None]:
    """Hold off the Ctrl-C handler for a few statements: the lock for other threads; on the main thread, where
    the handler runs, SIGINT is also blocked (a pending one is handled on leaving)."""
    main = threading.current_thread() is threading.main_thread()
    if main:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        with _said:
            yield
    finally:
        if main:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def say(message: str) -> None:
    """A progress line on stderr (stdout stays the command's output), flushed at once; none after a Ctrl-C,
    which has the last word: what it stops and what was committed."""
    with _no_interrupt_inside():
        if not _interrupted:
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


def _start(app: str, master: str, conf: dict, prog: str):
    """Start Spark with SIGINT held off every thread but one that waits for it: pyspark's own handler, which
    SparkContext installs and which calls the JVM from inside a signal handler (py4j then prints 40 lines of
    "reentrant call" if the main thread was waiting on the JVM), never runs; ours replaces it before SIGINT
    comes back. A Ctrl-C meanwhile ends the process at once with one line, the half-started JVM killed with
    it. The JVM runs in a session of its own, so a terminal's Ctrl-C never reaches it or its Python workers:
    this process hears it and stops them."""
    from pyspark import SparkConf, SparkContext  # a first import after install compiles pyspark's modules
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    spark_conf = SparkConf().setMaster(master).setAppName(app)
    spark_conf.set("spark.ui.enabled", "false").set("spark.ui.showConsoleProgress", "false")
    for key, value in conf.items():
        spark_conf.set(key, str(value))
    main = threading.current_thread() is threading.main_thread()
    starting = threading.Event()
    if main:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # threads made from here on inherit it

        def watch() -> None:
            while starting.is_set():
                if signal.sigtimedwait({signal.SIGINT}, 0.1) is not None:
                    exit_interrupted(
                        prog, "interrupted while Spark was starting; nothing was written", kill_children=True
                    )

        starting.set()
        threading.Thread(target=watch, name="ctrl-c-while-spark-starts", daemon=True).start()
    try:
        with still(f"{prog}: still starting Spark"):
            try:
                out_r, out_w = os.pipe()
                err_r, err_w = os.pipe()
                _forward(out_r, sys.stdout)
                _forward(err_r, sys.stderr)
                try:
                    gateway = launch_gateway(
                        spark_conf, popen_kwargs={"start_new_session": True, "stdout": out_w, "stderr": err_w}
                    )
                finally:
                    os.close(out_w)
                    os.close(err_w)
                SparkContext(conf=spark_conf, gateway=gateway)
                spark = SparkSession.builder.getOrCreate()
            except Exception as e:  # pyspark's JAVA_GATEWAY_EXITED and the like: the JVM did not come up
                sys.exit(f"{prog}: error: Spark did not start: {' '.join(str(e).split())[:300]}")
    finally:
        if main:
            signal.signal(signal.SIGINT, _active._on_signal if _active is not None else _raise_interrupt)
            starting.clear()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return spark


_JVM_NOISE = (b"WARNING: Using incubator modules",)  # Java 17 announces Spark's vector module at every start


def _forward(fd: int, to) -> None:
    """Copy the lines of a pipe from Spark's JVM (and the Python workers it forks) to `to`, in a daemon thread
    that ends with this process."""

    def run() -> None:
        with os.fdopen(fd, "rb") as pipe:
            for line in pipe:
                if line.startswith(_JVM_NOISE) or _interrupted:  # after a Ctrl-C: Spark's traces of what it cancels
                    continue
                with contextlib.suppress(Exception):
                    to.buffer.write(line) if hasattr(to, "buffer") else to.write(line.decode(errors="replace"))
                    to.flush()

    threading.Thread(target=run, name="spark-output", daemon=True).start()


def _take_sigint(handler):
    """Install a SIGINT handler (main thread only); returns the one it replaces."""
    if threading.current_thread() is not threading.main_thread() or handler is None:
        return None
    return signal.signal(signal.SIGINT, handler)


def _raise_interrupt(signum, frame) -> None:
    """Raise KeyboardInterrupt where the main thread is, py4j's log of the call it cuts short silenced (its
    "KeyboardInterrupt while sending command" and a traceback): the process is ending."""
    import logging

    global _interrupted
    _interrupted = True
    logging.disable(logging.CRITICAL)
    raise KeyboardInterrupt


def _children(pid: int) -> list[int]:
    """Every process descended from `pid` (Linux /proc; elsewhere `ps`), deepest last."""
    parents: dict[int, list[int]] = {}
    try:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat", "rb") as f:
                        stat = f.read().decode(errors="replace")
                except OSError:
                    continue
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                parents.setdefault(ppid, []).append(int(entry))
    except OSError:
        out = subprocess.run(["ps", "-A", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
        for line in out.splitlines():
            child, ppid = map(int, line.split())
            parents.setdefault(ppid, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def exit_interrupted(prog: str, message: str, *, kill_children: bool = False) -> None:
    """End the process after a Ctrl-C: one line on stderr, exit code 130, no traceback. Spark's JVM, once
    started, ends when its gateway's pipe closes with this process (it runs its shutdown hooks: its temp
    files go); kill_children kills it and its workers outright, for a JVM still starting."""
    import logging

    global _interrupted
    logging.disable(logging.CRITICAL)  # py4j logs the call the Ctrl-C cut short
    with _said:
        _interrupted = True  # nothing more from the progress lines or Spark's JVM
        print(f"{prog}: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    if kill_children:
        for pid in _children(os.getpid()):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    os._exit(EXIT_INTERRUPTED)


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
    spark = _start(app, master, conf or {}, prog)
    spark.sparkContext.setLogLevel("ERROR")
    say(f"{prog}: Spark started in {time.monotonic() - began:.0f} s")
    return spark


class Interrupt:
    """Ctrl-C (SIGINT) as a request: `requested` turns true and the caller stops at a point of its choosing.

    Inside `with Interrupt() as stop:` a stream's wait loop checks `stop.requested` and stops the query. A
    second Ctrl-C, or one that comes while `stop.immediate` is true (a batch job), raises KeyboardInterrupt,
    which `exit_on_interrupt` turns into one line and exit code 130; Spark's JVM goes with the process. The
    handler never calls the JVM itself: py4j cannot take a call from a signal handler while the main thread
    waits on it (pyspark's own handler prints 40 lines of "reentrant call" when it tries). The previous handler
    comes back on exit.
    """

    def __init__(self, spark=None, *, prog: str = "kafkalog", message: str | None = None):
        self.spark = spark
        self.prog = prog
        self.message = message or "interrupted: stopping the query; what is committed stays, and a run again resumes"
        self.requested = False
        self.immediate = False
        self._previous: object = None

    def __enter__(self) -> Interrupt:
        global _active
        self._previous = _take_sigint(self._on_signal)
        if self._previous is not None:
            _active = self
        return self

    def __exit__(self, *exc) -> None:
        global _active
        if self._previous is not None:
            _take_sigint(self._previous)
            _active = None

    def attach(self, spark) -> None:
        """The session this Interrupt stops (kept for the caller; the handler makes no JVM call)."""
        self.spark = spark

    def _on_signal(self, signum, frame) -> None:
        if self.requested or self.immediate:
            _raise_interrupt(signum, frame)
        global _interrupted
        with _said:
            _interrupted = True
            self.requested = True
            print(f"{self.prog}: {self.message}", file=sys.stderr, flush=True)


def stop_between_batches(query, *, deadline: float | None = None) -> None:
    """Stop a streaming query once the micro-batch under way (if any) has ended, so none is cut short. With
    a processing-time trigger the next one often starts at once, leaving no moment with no trigger active to
    see: the end is also read from the progress (its batch id moves). A query that is down is left as it is."""

    def last_batch() -> int:
        progress = query.lastProgress
        return -1 if progress is None else int(progress["batchId"])

    under_way = last_batch()
    while query.isActive and query.status["isTriggerActive"] and last_batch() == under_way:
        if deadline is not None and time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    query.stop()


def stop_now(*queries) -> None:
    """Stop streaming queries at once, after a Ctrl-C: a micro-batch they cut short is not committed (the
    sink's next run writes it, exactly once). Spark logs the tasks it kills as errors with Java traces:
    its logging is turned off first, since the caller says in one line what happened."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is not None:
        sc.setLogLevel("OFF")
    for query in queries:
        query.stop()


def committed_in(root: str, topic: str) -> str:
    """What a Ctrl-C leaves, for the last line: the data records committed to a topic on local disk, as a
    read_committed consumer counts them (transaction markers take offsets but are not records)."""
    from storage.errors import KafkaLogError
    from storage.log_manager import LogManager

    if not os.path.isdir(root):
        return f"nothing is committed in {root}"
    try:
        lm = LogManager(root)
        records = 0
        for tp in lm.partitions(topic):
            with lm.open_log(tp) as log:
                records += log.count_records(isolation_level="read_committed").records
    except KafkaLogError:
        return f"nothing is committed to topic {topic!r} in {root}"
    return f"{records} records are committed to topic {topic!r} in {root}"


def exit_on_interrupt(spark=None, *, prog: str, immediate: bool = True, summary=None) -> Interrupt:
    """For a script: Ctrl-C ends the process with one line on stderr and exit code 130, with no traceback
    (Python's or Java's), and no process of Spark's left running. immediate=False: the first Ctrl-C only sets
    `requested` (a stream's loop stops its query), a second one ends the process. `summary()`, if given, says
    what was committed: it ends the line. An error raised after a Ctrl-C (a JVM call it cut short) ends the
    same way."""
    stop = Interrupt(spark, prog=prog).__enter__()
    stop.immediate = immediate
    previous = sys.excepthook

    def hook(kind, value, tb) -> None:
        if issubclass(kind, KeyboardInterrupt) or _interrupted:
            said = "interrupted"
            if summary is not None:
                with contextlib.suppress(Exception):
                    said += f"; {summary()}"
            exit_interrupted(prog, said)
        previous(kind, value, tb)

    def unraisable(info) -> None:
        # the KeyboardInterrupt landed in a finalizer (py4j's weakref callbacks run during any call), where
        # Python only reports it: a moment later, from a thread that nothing waits on (a raise inside this hook
        # is swallowed too), SIGINT comes again to the main thread; if that lands in a finalizer, again
        if info.exc_type is not None and issubclass(info.exc_type, KeyboardInterrupt):
            import _thread

            def again() -> None:
                time.sleep(0.05)
                _thread.interrupt_main(signal.SIGINT)

            _thread.start_new_thread(again, ())
            return
        previous_unraisable(info)

    sys.excepthook = hook
    previous_unraisable = sys.unraisablehook
    sys.unraisablehook = unraisable
    return stop
