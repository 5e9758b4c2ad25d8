"""The log engine: Kafka's on-disk log format, segments, indexes and recovery. Never imports Spark."""
