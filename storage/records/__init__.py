"""Kafka RecordBatch v2: the batch header, compression codecs, encoder and vectorized decoder.

Open record_batch.py first (the header layout and batch scans), then builder.py (Arrow -> batches),
decoder.py (batches -> Arrow) and compression.py; _record_kernels.py holds the numba loops.
"""
