"""The README's first command runs examples/streaming_pipeline.py: it must print records and keep
Spark's noise off the screen; examples/compacted_changelog.py checks every claim it prints."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.spark

EXAMPLES = os.path.join(REPO, "examples")


def run(script, *args, cwd):
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_the_demo_writes_and_shows_records_and_no_stack_traces(tmp_path):
    p = run("streaming_pipeline.py", str(tmp_path / "demo"), "300", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert '"topic": "events"' in p.stdout  # consume printed records
    assert "kafka-python read" in p.stdout
    noise = [ln for ln in p.stderr.splitlines() if "Exception" in ln or "Traceback" in ln or " ERROR " in ln]
    assert not noise, noise[:5]


def test_the_changelog_example_drops_tombstones_as_it_says(tmp_path):
    p = run("compacted_changelog.py", str(tmp_path / "changelog"), cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    second = p.stdout.split("maintenance pass 2")[-1]
    assert "100 tombstones dropped, none left" in second and "(0 tombstones)" not in second
    assert not [ln for ln in p.stdout.splitlines() if ln.startswith(("FAIL", "error"))]
