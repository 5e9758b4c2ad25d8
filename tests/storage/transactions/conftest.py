"""These tests take Kafka's snapshot at every clean close (as a broker does at shutdown): the close threshold a
sink's per-commit writers use (storage.log.CLOSE_SNAPSHOT_MIN_OFFSETS) is 0 here; test_producer_table.py tests
the threshold itself."""

import pytest

import storage.log


@pytest.fixture(autouse=True)
def _snapshot_at_every_close(monkeypatch):
    monkeypatch.setattr(storage.log, "CLOSE_SNAPSHOT_MIN_OFFSETS", 0)
