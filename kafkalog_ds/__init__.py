"""kafkalog-ds: Kafka-format logs without a broker. The `kafkalog` command lives in kafkalog_ds.cli."""


def register(spark) -> None:
    """Register format("kafkalog") on a session where data source discovery is off."""
    from python_datasource.data_source import KafkaLogDataSource

    spark.dataSource.register(KafkaLogDataSource)
