"""Limits of Kafka's wire and file formats, named once: Java's Integer and Long bounds.

Kafka writes these as Integer.MAX_VALUE and Long.MAX_VALUE; here they bound int32 fields (relative
offsets and positions in a segment, partition numbers, batch lengths, sequences) and int64 ones
(offsets, timestamps, config values). numba kernels read them as module globals, frozen at compile time.
"""

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
