"""Control records: a control record's key (`int16 version | int16 type`, Kafka's ControlRecordType) and the
value of a transaction marker (`int16 version | int32 coordinatorEpoch`, Kafka's EndTransactionMarker), and
the control batch that carries one marker (Kafka's MemoryRecords.withEndTransactionMarker).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

import crc32c

from ..common.constants import INT32_MAX, INT32_MIN
from ..errors import CorruptRecordError, InvalidRecordError
from ..records.record_batch import (
    ATTRIBUTES_OFFSET,
    CONTROL_FLAG_MASK,
    CRC_OFFSET,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    MAGIC_V2,
    NO_PARTITION_LEADER_EPOCH,
    NO_SEQUENCE,
    RECORD_BATCH_OVERHEAD,
    TRANSACTIONAL_FLAG_MASK,
)

CONTROL_RECORD_KEY_VERSION = 0
CONTROL_RECORD_KEY_SIZE = 4
END_TXN_MARKER_VERSION = 0
END_TXN_MARKER_VALUE_SIZE = 6
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi")
# A marker's one record has a fixed shape: zigzag varints length 16, attributes 0, timestampDelta 0,
# offsetDelta 0, keyLength 4, the key, valueLength 6, the value, 0 headers. Written here rather than by the
# Arrow encoder, so that a commit that only writes markers loads no numba (a test checks the two agree).
_MARKER_RECORD = struct.Struct(">BbBBB4sB6sB")
_MARKER_RECORD_BODY = _MARKER_RECORD.size - 1
_MARKER_BATCH_SIZE = RECORD_BATCH_OVERHEAD + _MARKER_RECORD.size


class ControlRecordType(enum.IntEnum):
    """The type in a control record's key. ABORT and COMMIT end a transaction; 2-6 are KRaft's own control
    records (its metadata and snapshot logs), known here by id only; UNKNOWN (-1) stands for any other id,
    which Kafka's readers ignore."""

    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6
    UNKNOWN = -1

    @classmethod
    def from_type_id(cls, type_id: int) -> ControlRecordType:
        """The type for an id read from a key; UNKNOWN for an id Kafka does not know (Kafka's fromTypeId)."""
        try:
            return cls(type_id) if type_id >= 0 else cls.UNKNOWN
        except ValueError:
            return cls.UNKNOWN

    def record_key(self) -> bytes:
        """The 4-byte key of a control record of this type, version 0."""
        if self is ControlRecordType.UNKNOWN:
            raise InvalidRecordError("cannot serialize the UNKNOWN control record type")
        return _KEY.pack(CONTROL_RECORD_KEY_VERSION, int(self))


def parse_control_type_id(key: bytes | None, *, source: str | None = None, position: int | None = None) -> int:
    """The type id in a control record's key, checked as Kafka's ControlRecordType.parseTypeId does: at least
    4 bytes, a version that is not negative (a higher version is read as version 0; longer keys are allowed).
    Anything else raises CorruptRecordError naming `source` and `position` (the batch's, where known)."""
    if key is None or len(key) < CONTROL_RECORD_KEY_SIZE:
        found = "a null key" if key is None else f"only {len(key)} bytes"
        raise CorruptRecordError(
            f"invalid control record key: must have at least {CONTROL_RECORD_KEY_SIZE} bytes, but found {found}",
            source=source,
            position=position,
        )
    version, type_id = _KEY.unpack_from(key, 0)
    if version < 0:
        raise CorruptRecordError(
            f"invalid control record key version {version}, may indicate data corruption",
            source=source,
            position=position,
        )
    return type_id


def parse_control_type(key: bytes | None, *, source: str | None = None, position: int | None = None):
    """The ControlRecordType of a control record's key (Kafka's ControlRecordType.parse)."""
    return ControlRecordType.from_type_id(parse_control_type_id(key, source=source, position=position))


@dataclass(frozen=True)
class EndTransactionMarker:
    """The COMMIT or ABORT record that ends a producer's transaction in a partition.

    Key: `int16 version (0) | int16 type` (ABORT 0, COMMIT 1). Value: `int16 version (0) | int32
    coordinatorEpoch`, the epoch of the transaction coordinator that wrote it. It is the only record of a
    control batch (attributes transactional + control, uncompressed, baseSequence -1) that carries the
    transaction's producerId and epoch.
    """

    control_type: ControlRecordType
    coordinator_epoch: int

    def __post_init__(self) -> None:
        if self.control_type not in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
            raise InvalidRecordError(
                f"invalid control record type for an end transaction marker: {self.control_type!r}"
            )
        if not INT32_MIN <= self.coordinator_epoch <= INT32_MAX:
            raise InvalidRecordError(f"coordinator epoch {self.coordinator_epoch} is not an int32")

    def key(self) -> bytes:
        return self.control_type.record_key()

    def value(self) -> bytes:
        return _VALUE.pack(END_TXN_MARKER_VERSION, self.coordinator_epoch)

    @classmethod
    def deserialize(
        cls, key: bytes | None, value: bytes | None, *, source: str | None = None, position: int | None = None
    ) -> EndTransactionMarker:
        """A marker from its record's key and value, checked as Kafka's EndTransactionMarker.deserialize does:
        the key's type must be ABORT or COMMIT, the value at least 6 bytes with a version that is not negative
        (a higher version is read as version 0). CorruptRecordError names `source` and `position`."""
        control_type = parse_control_type(key, source=source, position=position)
        if control_type not in (ControlRecordType.ABORT, ControlRecordType.COMMIT):
            raise CorruptRecordError(
                f"control record of type {control_type.name} is not a transaction marker",
                source=source,
                position=position,
            )
        if value is None or len(value) < END_TXN_MARKER_VALUE_SIZE:
            found = "a null value" if value is None else f"only {len(value)} bytes"
            raise CorruptRecordError(
                f"invalid end transaction marker value: must have at least {END_TXN_MARKER_VALUE_SIZE} bytes, "
                f"but found {found}",
                source=source,
                position=position,
            )
        version, coordinator_epoch = _VALUE.unpack_from(value, 0)
        if version < 0:
            raise CorruptRecordError(
                f"invalid end transaction marker version {version}, may indicate data corruption",
                source=source,
                position=position,
            )
        return cls(control_type, coordinator_epoch)

    def to_batch(
        self,
        *,
        base_offset: int,
        timestamp: int,
        producer_id: int,
        producer_epoch: int,
        partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    ) -> bytes:
        """The control batch that holds this marker, as Kafka's MemoryRecords.withEndTransactionMarker builds it:
        one record at base_offset with CreateTime `timestamp`, attributes transactional + control (0x30),
        no compression, the producer's id and epoch, baseSequence -1."""
        if producer_id < 0:
            raise InvalidRecordError("transactional batches need a producer id")
        out = bytearray(_MARKER_BATCH_SIZE)
        try:
            HEADER_STRUCT.pack_into(
                out,
                0,
                base_offset,
                _MARKER_BATCH_SIZE - LOG_OVERHEAD,
                partition_leader_epoch,
                MAGIC_V2,
                0,  # crc, below
                TRANSACTIONAL_FLAG_MASK | CONTROL_FLAG_MASK,  # CreateTime, no compression
                0,  # lastOffsetDelta
                timestamp,
                timestamp,
                producer_id,
                producer_epoch,
                NO_SEQUENCE,
                1,
            )
        except struct.error as exc:
            raise InvalidRecordError(f"batch header field out of range: {exc}") from None
        _MARKER_RECORD.pack_into(
            out,
            RECORD_BATCH_OVERHEAD,
            _MARKER_RECORD_BODY << 1,
            0,
            0,
            0,
            CONTROL_RECORD_KEY_SIZE << 1,
            self.key(),
            END_TXN_MARKER_VALUE_SIZE << 1,
            self.value(),
            0,
        )
        struct.pack_into(">I", out, CRC_OFFSET, crc32c.crc32c(memoryview(out)[ATTRIBUTES_OFFSET:]))
        return bytes(out)
