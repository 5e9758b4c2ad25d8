"""Every script in benchmarks/ at its smallest settings: a benchmark is code, and one that breaks unseen
measures nothing (vs_kafka.py died on its own record count for weeks once the sink became transactional).

Not in the default suite (each starts its own Spark, broker or S3 server: minutes in all): `--benchmarks` (or
KAFKALOG_BENCHMARKS=1) runs them, as .ci/run does. table.py runs where every case of it runs: pyspark 4.1 with
Iceberg's Spark runtime (the `iceberg_spark` step of .ci/run; on another pyspark its Spark scan only says it
was skipped).
"""

from __future__ import annotations

import os

import pytest

from tests.helpers import REPO
from tests.helpers.spark_procs import run_script

BENCHMARKS = os.path.join(REPO, "benchmarks")

#: script -> (its smallest settings, text its table prints: the run reached its figures)
SMOKE = {
    "codec.py": (["--records", "2000", "--kafka-python-records", "200"], "ours/aiokafka"),
    "compaction.py": (["--records", "20000", "--keys", "1000"], "built 20,000 records"),
    "latency.py": (["--rounds", "1", "--batches", "2", "--rows-per-batch", "100"], "median triggerExecution"),
    "lookup.py": (["--rounds", "1"], "name/register"),
    "read_committed.py": (["--records", "4000", "--rounds", "1", "--range-size", "100"], "ratio read_committed"),
    "s3_lookup.py": (["--segments", "10"], "built 10 segment objects"),
    "scale.py": (["--max-partitions", "10", "--max-segments", "10"], "Growth (per-unit wall cost"),
    "sink.py": (["--rows", "20000", "--runs", "1"], "/ python noop (the floor)"),
    "sink_path.py": (["--quick"], "transactional commit over transactional=false"),
    "sink_transactions.py": (["--rows", "200", "--rounds", "2"], "transactional"),
    "source.py": (["20000", "1"], "rows/s"),
    "timestamp_lookup.py": (["--quick"], "bytes read"),
    "vs_kafka.py": (["--quick"], "broker cpu"),
}


def _wanted(config) -> bool:
    return bool(config.getoption("--benchmarks") or os.environ.get("KAFKALOG_BENCHMARKS") == "1")


def test_every_benchmark_script_is_in_the_smoke_list():
    scripts = sorted(f for f in os.listdir(BENCHMARKS) if f.endswith(".py") and f != "table.py")
    assert scripts == sorted(SMOKE), "a script in benchmarks/ with no smoke run here, or one that is gone"


def _run(script: str, args: list[str], tmp_path) -> str:
    """The script's stdout, once it exited 0."""
    p = run_script(os.path.join(BENCHMARKS, script), *args, cwd=REPO, timeout=1800, env={"TMPDIR": str(tmp_path)})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_the_benchmark_runs_at_its_smallest_size_and_prints_its_table(script, pytestconfig, tmp_path):
    if not _wanted(pytestconfig):
        pytest.skip("the benchmarks' smoke runs: pass --benchmarks (or KAFKALOG_BENCHMARKS=1)")
    args, shown = SMOKE[script]
    out = _run(script, args, tmp_path)
    assert shown in out, out[-3000:]


@pytest.mark.spark
@pytest.mark.iceberg_spark
def test_the_table_benchmark_runs_and_prints_every_case(tmp_path):
    import pyspark

    from tools.iceberg import jars

    if (
        not pyspark.__version__.startswith(jars.SPARK_MINOR + ".")
        and os.environ.get("KAFKALOG_REQUIRE_ICEBERG_SPARK") != "1"
    ):
        pytest.skip(f"Iceberg's Spark runtime is for Spark {jars.SPARK_MINOR}; pyspark here is {pyspark.__version__}")
    out = _run("table.py", ["--quick"], tmp_path)
    for case in ("1 materialization", "2 Spark scan", "3 pruning", "4 DuckDB", "5 upsert", "6 freshness"):
        assert f"\n{case}" in out, out
    assert "ratio pass / spark.read kafkalog" in out and "a one-day range plans" in out
    assert "ratio table scan / kafkalog read" in out and "floor: spark.read.parquet" in out, out
