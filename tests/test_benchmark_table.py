"""benchmarks/table.py at its smallest size: a benchmark is code, and one that breaks unseen measures nothing.

It runs where every case of it runs: pyspark 4.1 with Iceberg's Spark runtime (the `iceberg_spark` step of
.ci/run), not in the default suite (on another pyspark its Spark scan case only says it was skipped)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

pytestmark = [pytest.mark.spark, pytest.mark.iceberg_spark]


def test_the_table_benchmark_runs_and_prints_every_case():
    import pyspark

    from tools.iceberg import jars

    if (
        not pyspark.__version__.startswith(jars.SPARK_MINOR + ".")
        and os.environ.get("KAFKALOG_REQUIRE_ICEBERG_SPARK") != "1"
    ):
        pytest.skip(f"Iceberg's Spark runtime is for Spark {jars.SPARK_MINOR}; pyspark here is {pyspark.__version__}")
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
    assert "ratio table scan / kafkalog read" in p.stdout and "floor: spark.read.parquet" in p.stdout, p.stdout
