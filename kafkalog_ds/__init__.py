"""kafkalog-ds: Kafka-format logs without a broker. The `kafkalog` command lives in kafkalog_ds.cli."""
