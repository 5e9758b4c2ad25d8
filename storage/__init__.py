"""The log engine: Kafka's on-disk log format, segments, indexes, recovery and LogManager work.

Open log_manager.py first (a log dir of topics and partitions), then log.py (one partition) and
log_segment.py; subpackages: common/ (the clock, named limits, the JIT), fs/ (the filesystem seam,
local disk), metadata/ (checkpoint, meta.properties and topic files), records/ (the batch format),
cleaner/, objects/, staging/, transactions/, tables/, and export/ (a topic handed to a Kafka broker).
Never imports Spark.
"""
