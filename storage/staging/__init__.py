"""The sink's two-phase append: executors stage encoded batches, the driver commits them once.

Open record_stager.py first (phase 1: partition rows as Kafka's producer does, encode, stage beside
each partition's log), then staged_commit.py (phase 2: append under the partition lock, exactly
once per writer and batch id) and partitioner.py (Kafka's murmur2 partitioner, vectorised).
"""
