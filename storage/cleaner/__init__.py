"""Log compaction, as Kafka's LogCleaner does it, and the merge of small segments.

Open log_cleaner_manager.py first (which log to clean, the cleaner-offset-checkpoint), then
cleaner.py (the two passes), offset_map.py (SkimpyOffsetMap), transaction_metadata.py (Kafka's
CleanedTransactionMetadata: aborted data, markers, the cleaned `.txnindex`), cleaner_batches.py and
_cleaner_kernels.py (the record filter), segment_merger.py and throttler.py.
"""
