"""Kafka's transaction and producer-state files on disk.

producer_snapshot.py: the producer state snapshot `<20-digit offset>.snapshot` (Kafka's
ProducerStateManager.readSnapshot/writeSnapshot), its naming and listing.
"""
