"""The README's first command runs examples/streaming_pipeline.py: it must print records and keep
Spark's noise off the screen; examples/compacted_changelog.py checks every claim it prints."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.helpers import REPO
from tests.helpers.spark_procs import run_script

pytestmark = [pytest.mark.spark, pytest.mark.long]  # whole programs, a Spark start each: the long tier

EXAMPLES = os.path.join(REPO, "examples")


def run(script, *args, cwd):
    return run_script(os.path.join(EXAMPLES, script), *args, cwd=cwd, timeout=900)


def test_the_changelog_example_drops_tombstones_as_it_says(tmp_path):
    p = run("compacted_changelog.py", str(tmp_path / "changelog"), cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    second = p.stdout.split("maintenance pass 2")[-1]
    assert "100 tombstones dropped, none left" in second and "(0 tombstones)" not in second
    assert not [ln for ln in p.stdout.splitlines() if ln.startswith(("FAIL", "error"))]


def quiet(stderr_lines: list[str]) -> list[str]:
    """The lines that are noise: a trace or an error line of Python's or Java's."""
    marks = ("Exception", "Traceback", "ERROR", "KeyboardInterrupt", "WARN")
    return [ln for ln in stderr_lines if any(m in ln for m in marks) and "incubator modules" not in ln]


def test_the_demo_shows_records_resumes_and_ctrl_c_ends_in_one_line(tmp_path):
    """Run twice: the first run prints records and no Spark noise; the rerun names the offsets it appends
    from, and Ctrl-C (SIGINT, sent once the query is up) stops it: exit 130, a last line saying what was
    committed, no trace of any kind (every moment of every example: tests/test_ctrl_c.py)."""
    root = str(tmp_path / "demo")
    first = run("streaming_pipeline.py", root, "300", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert '"topic": "events"' in first.stdout  # consume printed records
    assert "kafka-python read" in first.stdout
    assert not quiet(first.stderr.splitlines()), quiet(first.stderr.splitlines())[:5]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    p = subprocess.Popen(
        [sys.executable, os.path.join(EXAMPLES, "streaming_pipeline.py"), root, "100000000"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    assert p.stderr is not None
    for line in p.stderr:  # wait on the condition: the query has started
        lines.append(line.rstrip("\n"))
        if "query started" in line:
            p.send_signal(signal.SIGINT)
            break
    _, rest = p.communicate(timeout=900)  # the rest of stderr, after the lines read above
    err = lines + rest.splitlines()
    assert p.returncode == 130, "\n".join(err[-30:])
    assert any(ln.startswith(f"streaming_pipeline: resuming from checkpoint {root}-checkpoint") for ln in err), err
    assert "partition 0 at offset" in "\n".join(err)
    assert err[-1].startswith("streaming_pipeline: stopped: committed "), err[-5:]
    assert not quiet(err), quiet(err)[:5]


def _table_example_checks(p) -> None:
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "NOT OK" not in p.stdout and p.stdout.count("\nok: ") == 4, p.stdout
    assert "table kafkalog.views: file://" in p.stdout and ".metadata.json" in p.stdout
    assert not quiet(p.stderr.splitlines()), quiet(p.stderr.splitlines())[:5]


def test_the_table_example_queries_the_table_with_spark_sql_and_duckdb(tmp_path):
    """On this pyspark (no Iceberg runtime for it): Spark SQL over pyiceberg's Arrow, and DuckDB."""
    _table_example_checks(run("topic_as_table.py", str(tmp_path / "table"), cwd=tmp_path))


@pytest.mark.iceberg_spark
def test_the_table_example_reads_the_table_through_icebergs_spark_runtime(tmp_path, monkeypatch):
    """On pyspark 4.1 (.ci/run's venv): Spark SQL reads the table through Iceberg's Spark runtime."""
    import pyspark

    from tools.iceberg import jars

    if (
        not pyspark.__version__.startswith(jars.SPARK_MINOR + ".")
        and os.environ.get("KAFKALOG_REQUIRE_ICEBERG_SPARK") != "1"
    ):
        pytest.skip(f"Iceberg's Spark runtime is for Spark {jars.SPARK_MINOR}; pyspark here is {pyspark.__version__}")
    monkeypatch.setenv("KAFKALOG_ICEBERG_JARS", ",".join(jars.spark_runtime_jars()))
    p = run("topic_as_table.py", str(tmp_path / "table"), cwd=tmp_path)
    _table_example_checks(p)
    assert "through Iceberg's Spark runtime" in p.stdout
