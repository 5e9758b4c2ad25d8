"""benchmarks/table.py at its smallest size: a benchmark is code, and one that breaks unseen measures nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.spark


def test_the_table_benchmark_runs_and_prints_every_case():
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    p = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "table.py"), "--quick"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for case in ("1 materialization", "2 Spark scan", "3 pruning", "4 DuckDB", "5 upsert", "6 freshness"):
        assert f"\n{case}" in p.stdout, p.stdout
    assert "ratio pass / spark.read kafkalog" in p.stdout and "a one-day range plans" in p.stdout
