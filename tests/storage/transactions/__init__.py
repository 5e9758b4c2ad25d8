"""Tests of storage/transactions: Kafka's producer state snapshots and transaction files."""
