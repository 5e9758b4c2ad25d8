"""Kafka's transactions on disk: the formats a transactional producer's partitions hold, and how a reader
applies them.

control_records.py: control record keys (ControlRecordType) and the COMMIT/ABORT marker
(EndTransactionMarker), and the one-record control batch a coordinator writes;
transaction_index.py: the per-segment `.txnindex` of aborted transactions (TransactionIndex, AbortedTxn);
producer_snapshot.py: the producer state snapshot `<20-digit offset>.snapshot` (Kafka's
ProducerStateManager.readSnapshot/writeSnapshot), its naming and listing;
producer_table.py: each producer's snapshot entry (Kafka's ProducerStateEntry), advanced from batch headers,
which a writer writes as a snapshot at each roll and clean close;
transaction_state.py: the transactions open in a partition, its last stable offset and the aborted
transactions its markers complete (the transaction half of Kafka's ProducerStateManager), rebuilt from
the latest snapshot plus a header scan;
transaction_view.py: a Log's transactions as a read_committed reader sees them (TransactionView: the last
stable offset, the aborted transactions over a range, the segments' `.txnindex` files), loaded on first use;
isolation.py: the isolation levels (read_uncommitted, read_committed) and their option parsing;
writer_state.py: the sink's per-partition writer state, the contract (WriterState) both flavours keep;
producer_state_manager.py: its lock-protected flavour (local disks), the state file;
commit_stamp.py: a commit's writer id and batch id put into its batches (where the batches carry the state);
transaction_coordinator.py: the sink's transactions: the create-only decision file (the role of Kafka's
transaction log), the COMMIT/ABORT marker batch it appends and the `.txnindex` entry of an abort.
"""
