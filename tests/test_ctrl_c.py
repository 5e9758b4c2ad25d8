"""Ctrl-C as a terminal sends it (SIGINT to the whole process group) at five moments of the demo and of each
Spark example: while Spark starts, right after, during the first micro-batch (or write job), between
micro-batches (or jobs), and during the final read-back. Each time: exit code 130, at most two lines after
the signal (what it stops, what was committed), no trace of Python's, Java's or Spark's, and no process of
the run left: not the JVM, not a Python worker."""

from __future__ import annotations

import os
import sys

import pytest

from tests.helpers import REPO
from tests.helpers.interrupt import has_java, interrupt_at, noise

pytestmark = [pytest.mark.spark, pytest.mark.long]  # 25 Spark starts: the long tier

EXAMPLES = os.path.join(REPO, "examples")


def _staging(root: str) -> bool:
    return os.path.isdir(root) and any(n.startswith(".kafkalog-staged-") for n in os.listdir(root))


def _committed(root: str, topic: str) -> bool:
    """A partition of the topic holds a record: a micro-batch (or write) has committed."""
    d = os.path.join(root, f"{topic}-0")
    return os.path.isdir(d) and any(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if n.endswith(".log"))


def _said(text: str):
    return lambda root, lines, pids: any(text in ln for ln in lines)


START = lambda root, lines, pids: any("starting Spark" in ln for ln in lines) and has_java(pids)  # noqa: E731
STARTED = _said("Spark started in")
BATCH = lambda root, lines, pids: _staging(root)  # noqa: E731


def _between(topic: str):
    return lambda root, lines, pids: _committed(root, topic)


# script, extra arguments, moment name, condition(root, lines, pids)
CASES = [
    ("streaming_pipeline.py", [], "start", START),
    ("streaming_pipeline.py", [], "started", STARTED),
    ("streaming_pipeline.py", ["1000000000"], "first micro-batch", BATCH),
    ("streaming_pipeline.py", ["1000000000"], "between micro-batches", _between("events")),
    ("streaming_pipeline.py", ["300"], "read-back", _said("reading the log back")),
    ("time_travel.py", [], "start", START),
    ("time_travel.py", [], "started", STARTED),
    ("time_travel.py", [], "first write", BATCH),
    ("time_travel.py", [], "after the write", _between("readings")),
    ("time_travel.py", [], "read-back", _said("sensor")),
    ("follow_topic.py", ["60"], "start", START),
    ("follow_topic.py", ["60"], "started", STARTED),
    ("follow_topic.py", ["60"], "first micro-batch", BATCH),
    ("follow_topic.py", ["60"], "between micro-batches", _said("reader started")),
    ("follow_topic.py", ["5"], "read-back", _said("the reader catches up")),
    ("compacted_changelog.py", [], "start", START),
    ("compacted_changelog.py", [], "started", STARTED),
    ("compacted_changelog.py", [], "first write", BATCH),
    ("compacted_changelog.py", [], "between writes", _between("customers")),
    ("compacted_changelog.py", [], "maintenance and read-back", _said("maintenance pass 1")),
    ("topic_as_table.py", [], "start", START),
    ("topic_as_table.py", [], "started", STARTED),
    ("topic_as_table.py", [], "first micro-batch", BATCH),
    ("topic_as_table.py", [], "between micro-batches", _between("views")),
    ("topic_as_table.py", [], "maintenance and read-back", _said("the maintenance pass materializes")),
]


@pytest.mark.parametrize(
    "script, args, moment, when", CASES, ids=[f"{c[0].removesuffix('.py')}-{c[2].replace(' ', '-')}" for c in CASES]
)
def test_ctrl_c_ends_in_two_lines_and_leaves_no_process(tmp_path, script, args, moment, when):
    root = str(tmp_path / "logs")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYSPARK_PYTHON": sys.executable}
    r = interrupt_at(
        [sys.executable, os.path.join(EXAMPLES, script), root, *args],
        lambda lines, pids: when(root, lines, pids),
        env=env,
        cwd=str(tmp_path),
    )
    shown = "\n".join(r.before[-10:] + ["--- SIGINT ---"] + r.after)
    assert r.rc == 130, shown
    assert 1 <= len(r.after) <= 2 and "interrupted" in r.after[0], shown
    assert not noise(r.after), shown
    assert not r.left, f"left running: {r.left}\n{shown}"
