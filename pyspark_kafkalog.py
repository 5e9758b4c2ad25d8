"""Found by pyspark's data source discovery (top-level `pyspark_*` modules): format("kafkalog") works
with no register() call."""

from python_datasource.data_source import KafkaLogDataSource as DefaultSource

__all__ = ["DefaultSource"]
