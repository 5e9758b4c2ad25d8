"""Logs on object stores (S3, GCS, Azure through fsspec): no append, no rename, no locks.

Every append is one immutable segment object made with a create-only write. Open
immutable_segment.py first, then object_store.py (the filesystem), object_reader.py (reads pinned
to one object version), segment_metadata.py (the per-partition hint), object_producer_state.py (the writer
state read from the batches) with writer_state_hint.py (its hint file) and maintenance_lease.py.
"""
