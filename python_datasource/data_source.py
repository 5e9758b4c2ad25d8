"""The `kafkalog` PySpark data source: option parsing and planning; all log logic is in storage/."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource

from storage.errors import InvalidConfigError

from .errors import short_traceback

# Spark runs each method in its own short-lived or reused Python process (its lookup of data sources by
# name, schema() and planning on the driver, the writer's commit on the driver, reads and writes on
# executors): each imports only what it needs, inside the method, so the lookup imports nothing of ours but
# this module, schema() loads no Arrow or log engine and no process loads numba before a kernel runs.


class KafkaLogDataSource(DataSource):
    """format("kafkalog"): Kafka-format logs under a root directory, written exactly once.

    Writing takes Spark's Kafka sink columns (value, and key, headers, topic, partition, timestamp) and
    options (topic, which overrides a topic column, plus path, compression.type, partitions, any Kafka
    topic config). Reading takes Spark's Kafka source options (subscribe / subscribePattern / assign,
    startingOffsets, endingOffsets, by timestamp, failOnDataLoss, minPartitions, maxRecordsPerPartition,
    includeHeaders, maxOffsetsPerTrigger, ...) and gives its schema; a user-specified schema selects
    columns of it. kafka.isolation.level is read_uncommitted (the default: every data record) or
    read_committed (as Kafka's consumer: aborted transactions dropped, and every "latest" - endingOffsets,
    a stream's latest offsets, a timestamp lookup - is the last stable offset, so nothing of a transaction
    still open is read; an explicit endingOffsets past it is data loss). The user guide is docs/spark.md;
    all log logic is in storage/.
    """

    @classmethod
    def name(cls) -> str:
        return "kafkalog"

    @short_traceback
    def schema(self) -> str:
        """Spark's Kafka source schema, plus headers with includeHeaders=true. The options a batch and a
        stream read share are checked here, where Spark reports an error as it is."""
        from .source_options import SourceOptions, source_schema

        options = dict(self.options)
        if any(k.lower() in ("subscribe", "subscribepattern", "assign") for k in options):
            SourceOptions.parse(options, streaming=None, warn=False)  # reader() warns, in its own process
        include = str(self.options.get("includeHeaders", self.options.get("includeheaders", "false"))).lower()
        return source_schema(include == "true")

    @short_traceback
    def reader(self, schema):
        from .reader import KafkaLogBatchReader, selected_columns
        from .source_options import SourceOptions

        opts = SourceOptions.parse(dict(self.options), streaming=False)
        return KafkaLogBatchReader(opts, selected_columns(schema, opts.include_headers))

    def streamReader(self, schema):
        """An invalid option fails the query from initialOffset(): pyspark's stream runner (4.3) would
        hide an error raised here behind an UnboundLocalError of its own."""
        from .reader import FailedStreamReader, KafkaLogStreamReader, selected_columns
        from .source_options import SourceOptions

        try:
            opts = SourceOptions.parse(dict(self.options), streaming=True, warn=False)  # the reader logs them
            if opts.max_offsets_per_trigger is not None or opts.min_offsets_per_trigger is not None:
                from . import reader

                if reader.ReadMaxRows is None:
                    raise InvalidConfigError(
                        "maxOffsetsPerTrigger / minOffsetsPerTrigger need pyspark 4.2 or "
                        "later (the read-limit API for Python streaming sources)"
                    )
            return KafkaLogStreamReader(opts, selected_columns(schema, opts.include_headers))
        except InvalidConfigError as e:
            return FailedStreamReader(e)

    def _sink_options(self, schema):
        """Everything a write can be refused for without reading its rows, checked here on the driver before
        any task runs: the options, the input columns and their types, the topic option's name and, for a
        topic that exists, an explicit `partitions` against its partition count. What only the rows show (a
        partition the topic lacks, a null topic) is found by the tasks (writer.py)."""
        from storage.log_manager import LogManager

        from .options import SinkOptions, check_schema

        opts = SinkOptions.parse(dict(self.options))
        check_schema(schema, opts)
        if opts.topic is not None:  # create it now, on the driver, so tasks agree on its partition count
            lm = LogManager(opts.path, opts.storage_options)
            meta = lm.get_or_create_topic(opts.topic, opts.partitions, opts.topic_config)
            if opts.partitions_given and meta.partitions != opts.partitions:
                raise InvalidConfigError(
                    f"option 'partitions' is {opts.partitions} but topic '{opts.topic}' exists with "
                    f"{meta.partitions} partition(s): the option sets the partition count of a topic the sink "
                    f"creates, and a topic's count does not change; set it to {meta.partitions} or leave it out"
                )
        return opts

    @short_traceback
    def writer(self, schema, overwrite: bool):
        if overwrite:
            raise InvalidConfigError(
                'Save mode Overwrite not allowed for kafkalog: use .mode("append"). A log is only appended to; '
                "Spark's Kafka sink allows Append too (and ErrorIfExists, its default, which Spark refuses for "
                "Python data sources)"
            )
        from .writer import KafkaLogBatchWriter

        opts = self._sink_options(schema)
        return KafkaLogBatchWriter(opts, opts.writer_id())

    @short_traceback
    def streamWriter(self, schema, overwrite: bool):
        """outputMode('complete') arrives as overwrite=True: as Spark's Kafka sink does, every trigger
        appends the whole result table (nothing is truncated)."""
        from .writer import KafkaLogStreamWriter

        opts = self._sink_options(schema)
        return KafkaLogStreamWriter(opts, opts.writer_id())
