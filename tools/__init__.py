"""Development tools shared by tests/ and benchmarks/, not shipped: a real Kafka broker with its jars, an S3 server."""
