"""kafkalog_ds/local_spark.py without a JVM: the one-line Java check and Ctrl-C as a request (a real SIGINT
to this process; Ctrl-C sent to the examples under Spark is tests/test_ctrl_c.py)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from kafkalog_ds import local_spark


@pytest.fixture(autouse=True)
def _no_ctrl_c_left_behind(monkeypatch):
    """A test's SIGINT marks the module interrupted (progress lines muted): not for the tests after it."""
    monkeypatch.setattr(local_spark, "_interrupted", False)


class FakeContext:
    def __init__(self):
        self.calls = []

    def setLogLevel(self, level):  # noqa: N802 (pyspark's name)
        self.calls.append(("setLogLevel", level))

    def cancelAllJobs(self):  # noqa: N802
        self.calls.append(("cancelAllJobs",))


class FakeSpark:
    def __init__(self):
        self.sparkContext = FakeContext()


def test_no_java_is_one_line_naming_java_17(monkeypatch, tmp_path):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert "Java 17" in local_spark.java_missing_reason()
    with pytest.raises(SystemExit) as e:
        local_spark.session("t", prog="demo")
    assert str(e.value).startswith("demo: error: Spark needs Java 17") and "\n" not in str(e.value)


def test_a_java_on_path_or_in_java_home_is_enough(monkeypatch, tmp_path):
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text("#!/bin/sh\necho 'openjdk version \"17.0.9\" 2023-10-17' >&2\n")
    java.chmod(0o755)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(java.parent))
    assert local_spark.java_missing_reason() is None
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    assert local_spark.java_missing_reason() is None


def test_the_first_ctrl_c_is_a_request_the_second_raises_and_neither_calls_the_jvm(capsys):
    """The handler never calls Spark: py4j cannot take a call from a signal handler while the main thread waits
    on the JVM (pyspark's own handler printed 40 lines of "reentrant call" doing so)."""
    spark = FakeSpark()
    before = signal.getsignal(signal.SIGINT)
    with local_spark.Interrupt(spark, prog="demo", message="interrupted: stopping the query") as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert spark.sparkContext.calls == []
    assert signal.getsignal(signal.SIGINT) is before
    assert capsys.readouterr().err == "demo: interrupted: stopping the query\n"


def test_outside_a_stream_ctrl_c_raises_at_once_and_silences_py4js_log():
    import logging

    spark = FakeSpark()
    try:
        with local_spark.Interrupt(spark) as stop:
            stop.immediate = True
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
        assert spark.sparkContext.calls == []
        assert logging.root.manager.disable == logging.CRITICAL  # py4j logs the call a Ctrl-C cuts short
    finally:
        logging.disable(logging.NOTSET)


# A Ctrl-C whose KeyboardInterrupt lands in a finalizer (py4j releases JVM objects from weakref callbacks
# during any call), where Python only reports it; the script then waits for ever, or till it is stopped.
_LANDS_IN_A_FINALIZER = """
import os, signal, time, weakref
from kafkalog_ds.local_spark import exit_on_interrupt, say
exit_on_interrupt(prog="demo", summary=lambda: "3 records are committed")
class Obj: pass
def finalizer(_):
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(3): pass  # the handler runs here, inside the callback
obj = Obj(); ref = weakref.ref(obj, finalizer); del obj
say("the interrupt was swallowed")
while True:
    time.sleep(0.1)
"""


def test_a_ctrl_c_that_lands_in_a_finalizer_still_ends_the_process_in_one_line():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _LANDS_IN_A_FINALIZER], capture_output=True, text=True, timeout=120
    )  # 120 s: a hang guard, the process ends within a moment
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "demo: interrupted; 3 records are committed\n")


def test_descendants_are_found_through_proc(tmp_path):
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run(['sleep', '60'])"])
    try:
        for _ in range(600):  # until the grandchild is there (a condition; 60 s at most)
            found = local_spark._children(os.getpid())
            if local_spark._children(child.pid):
                break
            time.sleep(0.1)
        assert child.pid in found and local_spark._children(child.pid)  # the child and its sleep
    finally:  # only this test's processes: the suite's SparkSession's JVM is a child of this process too
        for pid in [*local_spark._children(child.pid), child.pid]:
            os.kill(pid, signal.SIGKILL)
        child.wait()


def test_the_quiet_configuration_sets_the_gateway_level_so_spark_announces_nothing():
    conf_dir = local_spark._quiet_conf_dir()
    with open(os.path.join(conf_dir, "log4j2.properties")) as f:
        text = f.read()
    assert "rootLogger.level = error" in text
    assert "logger.repl.name = org.apache.spark.api.python.PythonGatewayServer" in text  # else "Setting default..."


@pytest.mark.parametrize(
    "reported, major", [('openjdk version "11.0.21" 2023-10-17', 11), ('java version "1.8.0_392"', 8)]
)
def test_a_java_older_than_17_is_one_line_naming_it(monkeypatch, tmp_path, reported, major):
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.write_text(f"#!/bin/sh\necho '{reported}' >&2\n")
    java.chmod(0o755)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(java.parent))
    assert local_spark.java_major_version(str(java)) == major
    reason = local_spark.java_missing_reason()
    assert reason == f"Spark needs Java 17 or later; {java} is Java {major} (set JAVA_HOME to a newer JDK)"
