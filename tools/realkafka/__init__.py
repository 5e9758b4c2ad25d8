"""Real Kafka for the tests and benchmarks: jars resolved with Maven, a KRaft broker, Kafka's Java clients."""
