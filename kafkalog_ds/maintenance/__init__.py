"""The maintenance job as a Spark job: storage/log_maintenance.py's pass with the partitions spread over
Spark executors, TASKS_PER_CORE tasks per core, each maintaining its slice under one LogManager snapshot.
Tables (table.mode) first: each topic's partitions are read and written as data files by one task each,
and the driver makes one catalog commit per table.

    kafkalog maintain ROOT --once --spark [--master URL]     (kafkalog_ds/cli.py, the one parser)
    python -m kafkalog_ds.maintenance ROOT [options]         the same as `kafkalog maintain ROOT --once`,
                                                             for spark-submit (__main__.py)
"""

from __future__ import annotations

from storage import log_maintenance
from storage.log_maintenance import PartitionReport, maintain_partitions

TASKS_PER_CORE = 4  # partitions go to this many tasks per core, each with one LogManager snapshot


def run_once(root: str, *, spark=None, **kwargs) -> list[PartitionReport]:
    """One maintenance pass (storage.log_maintenance.run_once, same keywords); with `spark`, a
    SparkSession, its partitions are maintained and its tables' data files written by Spark tasks."""
    if spark is None:
        return log_maintenance.run_once(root, **kwargs)
    writes = _writes_on_spark(spark)
    return log_maintenance.run_once(root, distribute=_on_spark(spark), distribute_writes=writes, **kwargs)


def run_on_spark(root: str, *, master: str, **kwargs) -> list[PartitionReport]:
    """One pass as a Spark job of its own (`kafkalog maintain --once --spark`): a session on `master`,
    stopped when the pass ends."""
    from ..local_spark import session  # Spark's console kept to errors, as the examples' sessions

    spark = session("kafkalog-maintenance", master=master, prog="kafkalog maintain")
    try:
        return run_once(root, spark=spark, **kwargs)
    finally:
        spark.stop()


def _on_spark(spark) -> log_maintenance.Distribute:
    def distribute(tps, task_args) -> list[PartitionReport]:
        sc = spark.sparkContext
        slices = min(len(tps), max(1, sc.defaultParallelism) * TASKS_PER_CORE)
        rdd = sc.parallelize([tuple(tp) for tp in tps], slices)
        return rdd.mapPartitions(lambda part: maintain_partitions(list(part), *task_args)).collect()

    return distribute


def _writes_on_spark(spark):
    """A table's write jobs (storage/tables/materializer.WriteJob), one Spark task each; their results come
    back to the driver, which commits them. A failed task is retried by Spark: the files of its failed
    attempt are in no commit, and the driver removes them after it (they name the pass)."""

    def distribute(jobs):
        from storage.tables.materializer import write_ranges

        sc = spark.sparkContext
        return sc.parallelize(jobs, len(jobs)).map(write_ranges).collect()

    return distribute
