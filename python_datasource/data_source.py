"""The `kafkalog` PySpark data source: option parsing and planning; all log logic is in storage/."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource

from storage.errors import InvalidConfigError
from storage.log_manager import LogManager

from .options import SinkOptions, check_schema
from .writer import KafkaLogBatchWriter, KafkaLogStreamWriter


class KafkaLogDataSource(DataSource):
    """format("kafkalog"): Kafka-format logs under a root directory, written exactly once."""

    @classmethod
    def name(cls) -> str:
        return "kafkalog"

    def _sink_options(self, schema, overwrite: bool) -> SinkOptions:
        if overwrite:
            raise InvalidConfigError("the kafkalog sink only appends: a log cannot be overwritten "
                                     "(use mode('append'))")
        opts = SinkOptions.parse(dict(self.options))
        check_schema(schema, opts)
        if opts.topic is not None:  # create it now, on the driver, so tasks agree on its partition count
            LogManager(opts.path).get_or_create_topic(opts.topic, opts.partitions, opts.topic_config)
        return opts

    def writer(self, schema, overwrite: bool):
        opts = self._sink_options(schema, overwrite)
        return KafkaLogBatchWriter(opts, opts.writer_id())

    def streamWriter(self, schema, overwrite: bool):
        opts = self._sink_options(schema, overwrite)
        return KafkaLogStreamWriter(opts, opts.writer_id())
