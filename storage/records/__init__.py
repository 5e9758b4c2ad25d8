"""Kafka RecordBatch v2: the batch header, compression codecs, encoder and vectorized decoder."""
