"""benchmarks/table.py at its smallest size: a benchmark is code, and one that breaks unseen measures nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.spark


def _run_quick():
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "table.py"), "--quick"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )


def test_the_table_benchmark_runs_and_prints_every_case():
    p = _run_quick()
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for case in ("1 materialization", "2 Spark scan", "3 pruning", "4 DuckDB", "5 upsert", "6 freshness"):
        assert f"\n{case}" in p.stdout, p.stdout
    assert "ratio pass / spark.read kafkalog" in p.stdout and "a one-day range plans" in p.stdout


@pytest.mark.iceberg_spark
def test_the_table_benchmarks_spark_scan_runs_on_icebergs_spark_runtime():
    """On pyspark 4.1 (.ci/run's venv), case 2 runs instead of saying it was skipped."""
    import pyspark

    from tools.iceberg import jars

    if (
        not pyspark.__version__.startswith(jars.SPARK_MINOR + ".")
        and os.environ.get("KAFKALOG_REQUIRE_ICEBERG_SPARK") != "1"
    ):
        pytest.skip(f"Iceberg's Spark runtime is for Spark {jars.SPARK_MINOR}; pyspark here is {pyspark.__version__}")
    p = _run_quick()
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "ratio table scan / kafkalog read" in p.stdout and "floor: spark.read.parquet" in p.stdout, p.stdout
