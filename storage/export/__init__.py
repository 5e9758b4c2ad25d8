"""A kafkalog topic handed to a Kafka broker: partition directories a broker loads as its own, with nothing
to recover or rebuild (docs/kafka-broker.md says why each file is as it is). `kafkalog export-to-broker`.

topic_export.py: the export of a topic (export_topic, ExportResult): every partition written aside first,
then put in place;
broker_log_dir.py: the target, a stopped broker's log dir (its `.lock`, `.kafka_cleanshutdown`, checkpoint
files) or a staging directory;
partition_export.py: one partition's directory (PartitionExport), its producer snapshot and
leader-epoch-checkpoint;
exported_segment.py: one segment's `.log`, `.index` and `.timeindex`;
producer_fields.py: the producer fields Kafka's cleaner would refuse, cleared;
exported_transactions.py: the refusal of an open transaction, the aborted ones' `.txnindex` files;
partition_metadata_file.py: `partition.metadata` and the topic id in it;
durable_files.py: the fsynced writes, replacements and directory exchanges.
"""

from .partition_export import PartitionExport
from .partition_metadata_file import check_topic_id, read_partition_metadata
from .topic_export import ExportResult, export_topic

__all__ = ["ExportResult", "PartitionExport", "check_topic_id", "export_topic", "read_partition_metadata"]
