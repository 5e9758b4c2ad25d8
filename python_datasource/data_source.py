"""The `kafkalog` PySpark data source: option parsing and planning; all log logic is in storage/."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource

from storage.errors import InvalidConfigError
from storage.log_manager import LogManager

from .options import SinkOptions, check_schema
from .reader import KafkaLogBatchReader, KafkaLogStreamReader, source_schema
from .source_options import SourceOptions
from .writer import KafkaLogBatchWriter, KafkaLogStreamWriter


class KafkaLogDataSource(DataSource):
    """format("kafkalog"): Kafka-format logs under a root directory, written exactly once."""

    @classmethod
    def name(cls) -> str:
        return "kafkalog"

    def schema(self) -> str:
        """Spark's Kafka source schema, plus headers with includeHeaders=true."""
        include = str(self.options.get("includeHeaders", self.options.get("includeheaders", "false"))).lower()
        return source_schema(include == "true")

    def reader(self, schema):
        return KafkaLogBatchReader(SourceOptions.parse(dict(self.options), streaming=False))

    def streamReader(self, schema):
        opts = SourceOptions.parse(dict(self.options), streaming=True)
        if opts.max_offsets_per_trigger is not None or opts.min_offsets_per_trigger is not None:
            from . import reader

            if reader.ReadMaxRows is None:
                raise InvalidConfigError("maxOffsetsPerTrigger / minOffsetsPerTrigger need pyspark 4.2 or later "
                                         "(the read-limit API for Python streaming sources)")
        return KafkaLogStreamReader(opts)

    def _sink_options(self, schema, overwrite: bool) -> SinkOptions:
        if overwrite:
            raise InvalidConfigError("the kafkalog sink only appends: a log cannot be overwritten "
                                     "(use mode('append'))")
        opts = SinkOptions.parse(dict(self.options))
        check_schema(schema, opts)
        if opts.topic is not None:  # create it now, on the driver, so tasks agree on its partition count
            lm = LogManager(opts.path, opts.storage_options)
            lm.get_or_create_topic(opts.topic, opts.partitions, opts.topic_config)
        return opts

    def writer(self, schema, overwrite: bool):
        opts = self._sink_options(schema, overwrite)
        return KafkaLogBatchWriter(opts, opts.writer_id())

    def streamWriter(self, schema, overwrite: bool):
        opts = self._sink_options(schema, overwrite)
        return KafkaLogStreamWriter(opts, opts.writer_id())
