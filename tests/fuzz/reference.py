"""The fuzzer's oracle: what a partition directory holds, computed from its bytes without the engine.

Nothing here imports `storage` or `kafkalog_ds`. Batch headers are checked with our own struct
parse and CRC-32C (the `crc32c` package); compressed record areas are inflated with the codec
libraries Kafka's Python clients use (zlib, cramjam/python-snappy, lz4, zstandard), each bounded to
the topic's max.message.bytes; records are parsed with a strict port of Java's
`DefaultRecord.readFrom`, and every batch the oracle calls valid is cross-checked against
kafka-python's own `DefaultRecordBatch` (see `_kafka_python_records`).

The rules (DESIGN.md, "What must be checked before bytes are trusted", plus Java's record parser):

- framing: 12 + batchLength fits in the file, batchLength >= 49, magic == 2;
- CRC-32C of everything after the crc field matches; the codec is one of 0..4;
- baseOffset..lastOffset inside [the segment's base offset, the next segment's base offset) (the
  issue's rule: a batch lies inside its segment's offset range) and above the previous batch's last
  offset;
  lastOffset - segment base fits in int32; lastOffsetDelta >= 0; 0 <= recordCount <= lastOffsetDelta+1;
- the record area (inflated, at most max.message.bytes) holds exactly recordCount records and no
  more bytes, each record's body exactly its length varint, no negative header count or header key
  length, varints at most 5 (int) / 10 (long) bytes (Java's limits);
- offsetDeltas strictly increase within [0, lastOffsetDelta].

The READ_COMMITTED answer (View.committed, `committed_view`) is computed from the valid prefix's batches
alone, as Kafka decides it: the broker's producer state (ProducerAppendInfo.append) for every batch with a
producer id (>= 0): a transactional data batch opens its producer's transaction if none is open; a control
batch's first record is read as an EndTransactionMarker (key: at least 4 bytes, int16 version >= 0, type
ABORT 0 or COMMIT 1; value: at least 6 bytes, int16 version >= 0; a higher version is read as 0; the
coordinator epoch and the batch's producer epoch do not matter when a log is loaded) and ends the open
transaction of its producer id (an ABORT: an aborted range [first offset, marker offset]); a control batch
whose marker does not read so ends the committed view there (an error is due, naming it). Then the
consumer (CompletedFetch): control records dropped, transactional data batches of a producer inside one of
its aborted ranges dropped, nothing at or past the last stable offset (the first offset of a transaction
left open in the valid prefix). `.txnindex` and `.snapshot` files are not read: they are hints.

The VALID PREFIX of a partition is every record, in order, of the batches before the first byte
that breaks a rule; a partial batch at the end of the last segment (a torn tail) also ends it.
Records below the log start offset (log-start-offset-checkpoint) are not part of it.

Records are kept as digests (`Rec`), so a log of 3 GB of decompressed values costs kilobytes here.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import zlib
from dataclasses import dataclass, field

import crc32c

LOG_OVERHEAD = 12  # baseOffset int64 + batchLength int32
HEADER_SIZE = 61
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # 49
MAGIC = 2
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
DEFAULT_MAX_MESSAGE_BYTES = 1048588
DUMP_MAX_MESSAGE_SIZE = 5 * 1024 * 1024  # dump-log's --max-message-size default (Kafka's)
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
CONTROL_MASK = 0x20
TRANSACTIONAL_MASK = 0x10
ABORT, COMMIT = 0, 1  # ControlRecordType ids of the transaction markers
TIMESTAMP_TYPE_MASK = 0x08
TSTYPE_NAMES = {0: "CreateTime", 1: "LogAppendTime"}

HEADER = struct.Struct(">qiibIhiqqqhii")
SEGMENT_RE = re.compile(r"^(\d{20})\.log$")


class OracleError(Exception):
    """The oracle disagrees with kafka-python on a batch it calls valid: a bug in the oracle."""


# ---------------------------------------------------------------- records and digests


def _wrap64(v: int) -> int:
    return (v + 2**63) % 2**64 - 2**63


def _feed(h, data: bytes) -> None:
    """Length, then the bytes; above 4 KiB their CRC-32C instead (hardware speed for the bomb's
    3 GB of values; a mutation that keeps the length changes the CRC but for a 2**-32 chance)."""
    if len(data) > 4096:
        h.update(struct.pack(">iI", len(data), crc32c.crc32c(data)))
    else:
        h.update(struct.pack(">i", len(data)))
        h.update(data)


def record_digest(timestamp: int, tstype: int, key: bytes | None, value: bytes | None, headers) -> str:
    """The identity of a record's content (offset aside): the same function serves the oracle, the
    child processes that read through the engine, and the parsers of CLI output."""
    h = hashlib.blake2b(digest_size=12)
    h.update(struct.pack(">qb", int(timestamp), int(tstype)))
    for part in (key, value):
        if part is None:
            h.update(b"\xff\xff\xff\xff")
        else:
            _feed(h, part)
    headers = list(headers or ())
    h.update(struct.pack(">i", len(headers)))
    for k, v in headers:
        kb = k.encode("utf-8", "surrogatepass") if isinstance(k, str) else bytes(k)
        _feed(h, kb)
        if v is None:
            h.update(b"\xff\xff\xff\xff")
        else:
            _feed(h, v)
    return h.hexdigest()


def _short(b: bytes | None, n: int = 24) -> str:
    if b is None:
        return "null"
    s = repr(bytes(b[:n]))
    return s + (f"..(+{len(b) - n})" if len(b) > n else "")


def dump_text(b: bytes) -> str:
    """What dump-log prints for a key or payload: Kafka's StringDecoder, malformed input replaced."""
    return b.decode("utf-8", "replace")


def dump_tail(key: bytes | None, value: bytes | None, header_keys) -> str:
    """The end of dump-log's record line from 'headerKeys:' on (with --print-data-log)."""
    s = f"headerKeys: [{','.join(header_keys)}]"
    if key is not None:
        s += f" key: {dump_text(key)}"
    if value is not None:
        s += f" payload: {dump_text(value)}"
    return s


def text_digest(s: str) -> str:
    h = hashlib.blake2b(digest_size=12)
    _feed(h, s.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


@dataclass
class Rec:
    offset: int
    timestamp: int
    tstype: int
    digest: str
    key_size: int
    value_size: int
    header_keys: tuple
    tail_digest: str  # text_digest(dump_tail(...)): compared with dump-log's line
    preview: str

    @staticmethod
    def make(offset, timestamp, tstype, key, value, headers) -> Rec:
        hkeys = tuple(k for k, _ in headers)
        return Rec(
            offset,
            timestamp,
            tstype,
            record_digest(timestamp, tstype, key, value, headers),
            -1 if key is None else len(key),
            -1 if value is None else len(value),
            hkeys,
            text_digest(dump_tail(key, value, hkeys)),
            f"ts={timestamp} key={_short(key)} value={_short(value)} headers={len(headers)}",
        )


# ---------------------------------------------------------------- varints (Java's ByteUtils)


class RecordFormatError(Exception):
    pass


def _read_varint(buf, pos: int, end: int) -> tuple[int, int]:
    """Java readVarint: at most 5 bytes, 32-bit wrap-around, zigzag."""
    raw = 0
    shift = 0
    for _i in range(5):
        if pos >= end:
            raise RecordFormatError("varint runs past the end of the record data")
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            raw &= 0xFFFFFFFF
            v = (raw >> 1) ^ -(raw & 1)
            return (v + 2**31) % 2**32 - 2**31, pos
        shift += 7
    raise RecordFormatError("varint is too long (5th byte has its high bit set)")


def _read_varlong(buf, pos: int, end: int) -> tuple[int, int]:
    raw = 0
    shift = 0
    for _i in range(10):
        if pos >= end:
            raise RecordFormatError("varlong runs past the end of the record data")
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            raw &= 0xFFFFFFFFFFFFFFFF
            return _wrap64((raw >> 1) ^ -(raw & 1)), pos
        shift += 7
    raise RecordFormatError("varlong is too long (10th byte has its high bit set)")


def encode_varint(v: int) -> bytes:
    """Zigzag LEB128 of a signed 64-bit value (used by the mutators)."""
    raw = ((v << 1) ^ (v >> 63)) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while True:
        b = raw & 0x7F
        raw >>= 7
        if raw:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


@dataclass
class RawRecord:
    """One record as stored, with where its varint fields sit (the mutators use the positions)."""

    start: int  # position of the length varint in the record area
    end: int
    length: int
    attributes: int
    timestamp_delta: int
    offset_delta: int
    key: bytes | None
    value: bytes | None
    headers: list
    fields: dict  # name -> (position, encoded size) of each varint


def parse_records(buf: bytes, count: int) -> tuple[list[RawRecord], str | None]:
    """Java's record iteration over an (inflated) record area: exactly `count` records, each body
    exactly its length, then no bytes left. Returns the records read and the first error (or None)."""
    out: list[RawRecord] = []
    pos = 0
    end = len(buf)
    if count < 0:
        return out, f"invalid record count {count}"
    try:
        for i in range(count):
            start = pos
            fields = {}
            length, p = _read_varint(buf, pos, end)
            fields["length"] = (pos, p - pos)
            if length < 0 or length > end - p:
                raise RecordFormatError(f"record {i}: length {length} but {end - p} bytes remain")
            body_end = p + length
            if p >= body_end:
                raise RecordFormatError(f"record {i}: empty record body")
            attributes = buf[p]
            p += 1
            q = p
            ts_delta, p = _read_varlong(buf, p, body_end)
            fields["timestampDelta"] = (q, p - q)
            q = p
            offset_delta, p = _read_varint(buf, p, body_end)
            fields["offsetDelta"] = (q, p - q)
            q = p
            klen, p = _read_varint(buf, p, body_end)
            fields["keyLength"] = (q, p - q)
            key = None
            if klen >= 0:  # Java: any negative size is null
                if klen > body_end - p:
                    raise RecordFormatError(f"record {i}: key length {klen} runs past the record")
                key = bytes(buf[p : p + klen])
                p += klen
            q = p
            vlen, p = _read_varint(buf, p, body_end)
            fields["valueLength"] = (q, p - q)
            value = None
            if vlen >= 0:
                if vlen > body_end - p:
                    raise RecordFormatError(f"record {i}: value length {vlen} runs past the record")
                value = bytes(buf[p : p + vlen])
                p += vlen
            q = p
            nh, p = _read_varint(buf, p, body_end)
            fields["headerCount"] = (q, p - q)
            if nh < 0:
                raise RecordFormatError(f"record {i}: invalid number of headers {nh}")
            headers = []
            for j in range(nh):
                q = p
                hk, p = _read_varint(buf, p, body_end)
                fields[f"header{j}KeyLength"] = (q, p - q)
                if hk < 0:
                    raise RecordFormatError(f"record {i}: negative header key size {hk}")
                if hk > body_end - p:
                    raise RecordFormatError(f"record {i}: header key length {hk} runs past the record")
                hkey = bytes(buf[p : p + hk]).decode("utf-8", "replace")  # Java's new String(.., UTF_8)
                p += hk
                q = p
                hv, p = _read_varint(buf, p, body_end)
                fields[f"header{j}ValueLength"] = (q, p - q)
                hval = None
                if hv >= 0:
                    if hv > body_end - p:
                        raise RecordFormatError(f"record {i}: header value length {hv} runs past the record")
                    hval = bytes(buf[p : p + hv])
                    p += hv
                headers.append((hkey, hval))
            if p != body_end:
                raise RecordFormatError(
                    f"record {i}: length says {length} bytes, the fields take {p - (body_end - length)}"
                )
            pos = body_end
            out.append(RawRecord(start, pos, length, attributes, ts_delta, offset_delta, key, value, headers, fields))
        if pos != end:
            raise RecordFormatError(f"{end - pos} bytes remain after the {count} declared records")
    except RecordFormatError as e:
        return out, str(e)
    return out, None


# ---------------------------------------------------------------- bounded decompression


class DecompressError(Exception):
    pass


def _gunzip(data: bytes, limit: int) -> bytes:
    """Java GZIPInputStream: one or more members; bytes after a member that are not another member
    are ignored (as Java's readTrailer does). The gzip trailer CRC and size are checked (zlib)."""
    out = bytearray()
    rest = data
    first = True
    while first or (len(rest) >= 2 and rest[:2] == b"\x1f\x8b"):
        first = False
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        chunk = rest
        while True:
            try:
                piece = d.decompress(chunk, limit + 1 - len(out))
            except zlib.error as e:
                raise DecompressError(f"gzip: {e}") from None
            out += piece
            if len(out) > limit:
                raise DecompressError(f"gzip: inflates past {limit} bytes")
            if d.eof:
                rest = d.unused_data
                break
            chunk = d.unconsumed_tail
            if not chunk:
                raise DecompressError("gzip: truncated stream")
    return bytes(out)


def _snappy_raw(block: bytes, limit: int) -> bytes:
    import cramjam

    try:
        n, _ = _uvarint(block, 0)
    except DecompressError:
        raise DecompressError("snappy: bad length preamble") from None
    if n > limit:
        raise DecompressError(f"snappy: block claims {n} bytes, more than {limit}")
    try:
        return bytes(cramjam.snappy.decompress_raw(block))
    except Exception as e:
        raise DecompressError(f"snappy: {e}") from None


def _uvarint(buf, pos):
    raw = shift = 0
    for _ in range(10):
        if pos >= len(buf):
            raise DecompressError("truncated varint")
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            return raw, pos
        shift += 7
    raise DecompressError("varint too long")


XERIAL_MAGIC = b"\x82SNAPPY\x00"


def _unsnappy(data: bytes, limit: int) -> bytes:
    """snappy-java's SnappyInputStream: xerial framing (16-byte header, then int32 length + raw
    block per chunk); a stream without the header is one raw block (as snappy-java falls back)."""
    if len(data) < 16 or data[:8] != XERIAL_MAGIC:
        return _snappy_raw(data, limit)
    pos = 16
    out = bytearray()
    while pos < len(data):
        if len(data) - pos < 4:
            raise DecompressError("snappy: truncated chunk length")
        n = struct.unpack_from(">i", data, pos)[0]
        pos += 4
        if n < 0 or n > len(data) - pos:
            raise DecompressError(f"snappy: chunk length {n} runs past the data")
        out += _snappy_raw(data[pos : pos + n], limit - len(out))
        pos += n
        if len(out) > limit:
            raise DecompressError(f"snappy: inflates past {limit} bytes")
    return bytes(out)


def _unlz4(data: bytes, limit: int) -> bytes:
    """Kafka's Lz4BlockInputStream: one LZ4 frame with independent blocks; what follows the frame is
    not read."""
    import lz4.frame

    if len(data) < 7 or data[:4] != b"\x04\x22\x4d\x18":
        raise DecompressError("lz4: bad frame magic")
    flg = data[4]
    if not flg & 0x20:
        raise DecompressError("lz4: linked blocks (Java rejects them)")
    d = lz4.frame.LZ4FrameDecompressor()
    try:
        out = d.decompress(data, max_length=limit + 1)
    except RuntimeError as e:
        raise DecompressError(f"lz4: {e}") from None
    if len(out) > limit:
        raise DecompressError(f"lz4: inflates past {limit} bytes")
    if not d.eof:
        raise DecompressError("lz4: truncated frame")
    return bytes(out)


def _unzstd(data: bytes, limit: int) -> bytes:
    """zstd-jni's ZstdInputStream: one or more complete frames, nothing else. Input is fed in small
    slices so that the output is checked against the bound as it grows (a zstd block inflates at
    most ~128 KiB per input byte)."""
    import zstandard

    out = bytearray()
    rest = data
    while rest:
        d = zstandard.ZstdDecompressor().decompressobj()
        pos = 0
        try:
            while pos < len(rest) and not d.eof:
                out += d.decompress(rest[pos : pos + 64])
                pos += 64
                if len(out) > limit:
                    raise DecompressError(f"zstd: inflates past {limit} bytes")
        except zstandard.ZstdError as e:
            raise DecompressError(f"zstd: {e}") from None
        if not d.eof:
            raise DecompressError("zstd: truncated frame")
        rest = d.unused_data + rest[pos:] if pos < len(rest) else d.unused_data
    return bytes(out)


def decompress(codec: int, data: bytes, limit: int) -> bytes:
    if codec == 1:
        return _gunzip(data, limit)
    if codec == 2:
        return _unsnappy(data, limit)
    if codec == 3:
        return _unlz4(data, limit)
    if codec == 4:
        return _unzstd(data, limit)
    raise DecompressError(f"unknown codec {codec}")


# ---------------------------------------------------------------- batches


@dataclass
class Batch:
    file: str
    position: int
    size: int  # 12 + batchLength
    base_offset: int
    batch_length: int
    epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    crc_ok: bool
    records: list  # list[Rec] decoded from the bytes (raw, before semantic checks)
    area_size: int  # bytes of the (inflated) record area
    structure_error: str | None  # Java's parser fails (decompression, record framing)
    semantic_error: str | None  # DESIGN's extra checks fail (offset deltas, counts)
    records_area: bytes | None = None  # inflated record area (only when keep_area)
    marker: tuple | None = None  # a control batch's first record as (key, value) bytes
    fresh: bool = False  # decoded now (not from the cache): cross-checked with kafka-python

    @property
    def codec(self) -> int:
        return self.attributes & 7

    @property
    def last_offset_raw(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def last_offset(self) -> int:  # Java's long arithmetic, as tools print it
        return _wrap64(self.last_offset_raw)

    @property
    def control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def tstype(self) -> int:
        return 1 if self.attributes & TIMESTAMP_TYPE_MASK else 0


def parse_header(buf, pos: int) -> tuple:
    return HEADER.unpack_from(buf, pos)


def decode_batch(path: str, data: bytes, pos: int, max_bytes: int, *, keep_area: bool = False) -> Batch:
    """One framed batch at `pos` (the caller checked 12 + batchLength fits and batchLength >= 49)."""
    (base, blen, epoch, magic, crc, attrs, lod, bts, mts, pid, pepoch, bseq, count) = parse_header(data, pos)
    size = LOG_OVERHEAD + blen
    body = data[pos + 21 : pos + size]
    crc_ok = crc32c.crc32c(body) == crc
    b = Batch(
        path,
        pos,
        size,
        base,
        blen,
        epoch,
        magic,
        crc,
        attrs,
        lod,
        bts,
        mts,
        pid,
        pepoch,
        bseq,
        count,
        crc_ok,
        [],
        0,
        None,
        None,
    )
    key = (hashlib.blake2b(bytes(data[pos : pos + size]), digest_size=16).digest(), max_bytes)
    hit = _DECODED.get(key)
    if hit is not None and not keep_area:
        b.records, b.area_size, b.structure_error, b.semantic_error, b.marker = hit
        return b
    b.fresh = True
    _decode_records(b, data, pos, max_bytes, keep_area)
    if len(_DECODED) >= _DECODED_MAX:
        _DECODED.clear()
    _DECODED[key] = (b.records, b.area_size, b.structure_error, b.semantic_error, b.marker)
    return b


# decoded batches by content: a mutant differs from the corpus in one place, and the oracle reads
# each mutant several times (its views, dump-log's view, after e and f), so the bomb's 3000 inflations
# happen once per process, not per mutant. Only digests are kept (Rec), never record bytes.
_DECODED: dict = {}
_DECODED_MAX = 50_000


def _decode_records(b: Batch, data, pos: int, max_bytes: int, keep_area: bool) -> None:
    size, magic, attrs, count = b.size, b.magic, b.attributes, b.record_count
    base, lod, bts, mts = b.base_offset, b.last_offset_delta, b.base_timestamp, b.max_timestamp
    if magic != MAGIC:
        b.structure_error = f"magic {magic}"
        return
    area = data[pos + HEADER_SIZE : pos + size]
    codec = attrs & 7
    if codec not in CODEC_NAMES:
        b.structure_error = f"unknown codec {codec}"
        return
    if codec:
        try:
            area = decompress(codec, bytes(area), max_bytes)
        except DecompressError as e:
            b.structure_error = str(e)
            return
    if keep_area:
        b.records_area = bytes(area)
    b.area_size = len(area)
    raws, err = parse_records(area, count)
    del area
    if attrs & CONTROL_MASK and raws:
        b.marker = (raws[0].key, raws[0].value)
    tstype = b.tstype
    for r in raws:
        ts = mts if tstype == 1 else _wrap64(bts + r.timestamp_delta)
        b.records.append(Rec.make(_wrap64(base + r.offset_delta), ts, tstype, r.key, r.value, r.headers))
    if err:
        b.structure_error = err
        return
    prev = -1
    for r in raws:
        if r.offset_delta <= prev or r.offset_delta > lod:
            b.semantic_error = f"offsetDelta {r.offset_delta} after {prev} (lastOffsetDelta {lod})"
            break
        prev = r.offset_delta
    if b.semantic_error is None and lod < 0:
        b.semantic_error = f"lastOffsetDelta {lod} < 0"
    if b.semantic_error is None and count > lod + 1:
        b.semantic_error = f"recordCount {count} > lastOffsetDelta + 1 ({lod + 1})"


def _kafka_python_records(data: bytes, b: Batch) -> list | None:
    """kafka-python's view of a batch's records, as Rec digests (None if it cannot parse it)."""
    from kafka.record.default_records import DefaultRecordBatch

    try:
        kb = DefaultRecordBatch(bytes(data[b.position : b.position + b.size]))
        out = []
        for r in kb:
            out.append(Rec.make(r.offset, r.timestamp, r.timestamp_type, r.key, r.value, list(r.headers)))
        return out
    except Exception:  # noqa: BLE001 - kafka-python is laxer/stricter on odd bytes; see caller
        return None


# ---------------------------------------------------------------- files and views


@dataclass
class Segment:
    path: str
    base_offset: int
    size: int


def list_segments(part_dir: str) -> list[Segment]:
    out = []
    for name in os.listdir(part_dir):
        m = SEGMENT_RE.match(name)
        if m:
            p = os.path.join(part_dir, name)
            out.append(Segment(p, int(m.group(1)), os.path.getsize(p)))
    out.sort(key=lambda s: s.base_offset)
    return out


@dataclass
class Stop:
    """Where the valid prefix ends."""

    file: str
    position: int
    kind: str  # "torn" (partial batch at the end of the last segment) or "corrupt"
    reason: str
    batch_base_offset: int | None = None  # header baseOffset of the batch at fault, if framed
    # "batch": decidable from the framing, the 61-byte header, the CRC and the offsets (magic, codec
    # id, lastOffsetDelta/recordCount, offset order): recovery must cut there (DESIGN: "CRC, offsets
    # monotonic, sizes"; the engine's readers reject these from the header alone, so a log kept with
    # one cannot be read past it). "records": only the record area behind a valid CRC is bad; finding
    # it means inflating and parsing records, which Kafka's LogSegment.recover does not do either, so
    # recovery may keep such a batch (it is reported when read).
    level: str = "batch"


@dataclass
class View:
    name: str
    records: list  # list[Rec]
    end_offset: int  # next offset after the last valid batch (the oracle's log end offset)
    stop: Stop | None  # None: the whole log is valid
    log_start: int
    segments: list  # list[Segment] this view reads
    notes: list = field(default_factory=list)
    reader_only: bool = False  # a view readers may serve but a writer's recovery may not leave
    # what a read_committed reader serves (see the module docstring), and where that answer ends
    committed: list = field(default_factory=list)
    committed_stop: Stop | None = None
    lso: int = 0

    def offsets(self):
        return [r.offset for r in self.records]


def walk_segment(
    seg: Segment,
    next_base: int | None,
    prev_last: int,
    max_bytes: int,
    *,
    is_last: bool,
    data: bytes | None = None,
    cross_check: bool = True,
    recovery: bool = False,
):
    """Validate one segment's batches in order. Returns (batches, prev_last, stop or None).
    recovery=True: what a loader's recovery checks (batch level only; see Stop.level)."""
    if data is None:
        with open(seg.path, "rb") as f:
            data = f.read()
    name = os.path.basename(seg.path)
    pos = 0
    batches = []
    while pos < len(data):
        remaining = len(data) - pos
        if remaining < LOG_OVERHEAD:
            return (
                batches,
                prev_last,
                Stop(seg.path, pos, "torn" if is_last else "corrupt", f"{remaining} bytes, less than a batch header"),
            )
        base, blen = struct.unpack_from(">qi", data, pos)
        if blen < MIN_BATCH_LENGTH:
            return batches, prev_last, Stop(seg.path, pos, "corrupt", f"batchLength {blen} < {MIN_BATCH_LENGTH}", base)
        if LOG_OVERHEAD + blen > remaining:
            return (
                batches,
                prev_last,
                Stop(
                    seg.path,
                    pos,
                    "torn" if is_last else "corrupt",
                    f"batchLength {blen} runs past the end of {name} ({remaining} bytes left)",
                    base,
                ),
            )
        if remaining < HEADER_SIZE:  # cannot happen: blen >= 49 and fits
            raise AssertionError
        b = decode_batch(seg.path, data, pos, max_bytes)
        why = None
        if b.magic != MAGIC:
            why = f"magic {b.magic}"
        elif not b.crc_ok:
            why = "CRC mismatch"
        elif b.codec not in CODEC_NAMES:
            why = f"unknown codec {b.codec}"
        elif b.base_offset < seg.base_offset:
            why = f"baseOffset {b.base_offset} below the segment base {seg.base_offset}"
        elif b.base_offset <= prev_last:
            why = f"baseOffset {b.base_offset} not above the previous last offset {prev_last}"
        elif b.last_offset_delta < 0:
            why = f"lastOffsetDelta {b.last_offset_delta} < 0"
        elif b.last_offset_raw > INT64_MAX or b.last_offset_raw - seg.base_offset > INT32_MAX:
            why = f"lastOffset {b.last_offset_raw} does not fit the segment (base {seg.base_offset})"
        elif next_base is not None and b.last_offset >= next_base:
            why = f"offsets {b.base_offset}..{b.last_offset} not below the next segment's base {next_base}"
        elif b.record_count < 0 or b.record_count > b.last_offset_delta + 1:
            why = f"recordCount {b.record_count} (lastOffsetDelta {b.last_offset_delta})"
        level = "batch"
        if not why and (b.structure_error or b.semantic_error) and not recovery:
            why = f"records: {b.structure_error or b.semantic_error}"
            level = "records"
        if why:
            return batches, prev_last, Stop(seg.path, pos, "corrupt", why, b.base_offset, level)
        if cross_check and b.fresh and b.area_size <= 1 << 16:
            kp = _kafka_python_records(data, b)
            if kp is not None and [(r.offset, r.digest) for r in kp] != [(r.offset, r.digest) for r in b.records]:
                raise OracleError(f"kafka-python reads the batch at {seg.path}:{pos} differently")
        batches.append(b)
        prev_last = b.last_offset
        pos += b.size
    return batches, prev_last, None


def read_checkpoint(root: str, name: str) -> dict:
    p = os.path.join(root, name)
    out = {}
    if not os.path.exists(p):
        return out
    with open(p) as f:
        lines = f.read().split("\n")
    for line in lines[2:]:
        parts = line.split()
        if len(parts) == 3:
            out[(parts[0], int(parts[1]))] = int(parts[2])
    return out


def topic_config(root: str, topic: str) -> dict:
    p = os.path.join(root, f"{topic}.kafkalog-topic.json")
    if not os.path.exists(p):
        return {}
    with open(p) as f:
        return json.load(f).get("config", {})


def max_message_bytes(root: str, topic: str) -> int:
    return int(topic_config(root, topic).get("max.message.bytes", DEFAULT_MAX_MESSAGE_BYTES))


def _view_of(
    name: str,
    segments: list[Segment],
    max_bytes: int,
    log_start_ckpt: int,
    overrides: dict | None = None,
    truncate_first: bool = False,
) -> View:
    """Validate `segments` in order; `overrides` maps a segment path to bytes to use instead of the file."""
    records: list[Rec] = []
    prev_last = -1
    stop = None
    end_offset = segments[0].base_offset if segments else 0
    log_start = max(log_start_ckpt, segments[0].base_offset if segments else 0)
    prefix: list[Batch] = []
    for i, seg in enumerate(segments):
        nxt = segments[i + 1].base_offset if i + 1 < len(segments) else None
        data = (overrides or {}).get(seg.path)
        batches, prev_last, stop = walk_segment(seg, nxt, prev_last, max_bytes, is_last=nxt is None, data=data)
        prefix += batches
        for b in batches:
            if not b.control:
                records.extend(r for r in b.records if r.offset >= log_start)
            end_offset = b.last_offset + 1
        if stop is not None:
            break
        if not batches and nxt is None:
            end_offset = max(end_offset, seg.base_offset)
    view = View(name, records, end_offset, stop, log_start, segments)
    view.committed, view.committed_stop, view.lso = committed_view(prefix, stop, log_start, end_offset)
    return view


def marker_error(key: bytes | None, value: bytes | None) -> tuple[int | None, str | None]:
    """(control type, None) for a control record Kafka's EndTransactionMarker.deserialize accepts, else
    (None, why)."""
    if key is None or len(key) < 4:
        return None, f"control record key of {'null' if key is None else len(key)} bytes (at least 4)"
    version, ctype = struct.unpack_from(">hh", key, 0)
    if version < 0:
        return None, f"control record key version {version}"
    if ctype not in (ABORT, COMMIT):
        return None, f"control record type {ctype} is not a transaction marker"
    if value is None or len(value) < 6:
        return None, f"marker value of {'null' if value is None else len(value)} bytes (at least 6)"
    if struct.unpack_from(">h", value, 0)[0] < 0:
        return None, f"marker value version {struct.unpack_from('>h', value, 0)[0]}"
    return ctype, None


def committed_view(batches: list, stop: Stop | None, log_start: int, end_offset: int) -> tuple:
    """(records, stop, last stable offset) of a read_committed reader over the valid prefix's batches
    (see the module docstring)."""
    ongoing: dict[int, int] = {}  # producer id -> first offset of its open transaction
    aborted: dict[int, list] = {}  # producer id -> [(first, last)]
    upto = len(batches)
    cstop = stop
    for i, b in enumerate(batches):
        pid = b.producer_id
        if pid < 0:
            continue
        if b.control:
            if b.record_count == 0 or b.marker is None:
                continue  # an empty control batch: its transaction was cleaned away
            ctype, why = marker_error(*b.marker)
            if why:
                cstop = Stop(b.file, b.position, "corrupt", f"marker: {why}", b.base_offset)
                upto = i
                break
            first = ongoing.pop(pid, None)
            if first is not None and ctype == ABORT:
                aborted.setdefault(pid, []).append((first, b.base_offset))
        elif b.transactional and pid not in ongoing:
            ongoing[pid] = b.base_offset
    end = batches[upto].base_offset if upto < len(batches) else end_offset
    lso = min([end, *ongoing.values()])
    out = []
    for b in batches[:upto]:
        if b.control:
            continue
        if b.transactional and any(f <= b.base_offset <= last for f, last in aborted.get(b.producer_id, ())):
            continue
        out.extend(r for r in b.records if log_start <= r.offset < lso)
    return out, cstop, max(lso, log_start)


def partition_views(root: str, topic: str, partition: int = 0) -> list[View]:
    """The views a correct engine may serve for this partition. One, unless a `.log.swap` is present:

    - "log": the segments without the swap (rolled back, or not applied yet);
    - "post-swap": Kafka's completion: the swap recovered like any segment by a loader (cut at its
      first batch-level fault; record-level damage behind a valid CRC is kept, see Stop.level),
      replacing the segments whose base offset lies in [swap base, next offset after the swap's last
      kept batch);
    - "swap-as-is" (reader_only): a reader that applies the swap in memory without recovering it,
      replacing the segments in [swap base, next offset after its last framed batch). Writers must
      recover a swap, so this view does not count for them.

    Decision: a swap whose recovered content is empty gives no post-swap view (Kafka would rename it
    over the segment at its base offset and lose that segment; we do not accept that as correct)."""
    d = os.path.join(root, f"{topic}-{partition}")
    max_bytes = max_message_bytes(root, topic)
    ckpt = read_checkpoint(root, "log-start-offset-checkpoint").get((topic, partition), 0)
    segments = list_segments(d)
    views = [_view_of("log", segments, max_bytes, ckpt)]
    swaps = sorted(n for n in os.listdir(d) if re.match(r"^\d{20}\.log\.swap$", n))
    for n in swaps:
        sbase = int(n[:20])
        sp = os.path.join(d, n)
        with open(sp, "rb") as f:
            swap_data = f.read()
        sseg = Segment(sp, sbase, len(swap_data))
        # recover the swap on its own: offsets above its base, no upper bound
        sb, _, sstop = walk_segment(sseg, None, -1, max_bytes, is_last=True, data=swap_data, recovery=True)
        if not sb:
            views[0].notes.append(f"{n}: no valid batch, no post-swap view")
        else:
            swap_end = sb[-1].last_offset + 1
            keep = [s for s in segments if not (sbase <= s.base_offset < swap_end)]
            valid_len = sb[-1].position + sb[-1].size
            new_seg = Segment(sp, sbase, valid_len)
            segs = sorted(keep + [new_seg], key=lambda s: s.base_offset)
            v = _view_of("post-swap", segs, max_bytes, ckpt, overrides={sp: swap_data[:valid_len]})
            if sstop is not None:
                v.notes.append(f"swap recovered: cut at {sstop.position}: {sstop.reason}")
            views.append(v)
        if sstop is not None:  # the unrecovered swap differs from the recovered one
            framed = [p for p in _framed(swap_data)]
            if framed:
                last_pos, last_size = framed[-1]
                base, lod = (
                    struct.unpack_from(">q", swap_data, last_pos)[0],
                    struct.unpack_from(">i", swap_data, last_pos + 23)[0],
                )
                raw_end = base + lod + 1
                keep = [s for s in segments if not (sbase <= s.base_offset < raw_end)]
                segs = sorted(keep + [Segment(sp, sbase, len(swap_data))], key=lambda s: s.base_offset)
                v = _view_of("swap-as-is", segs, max_bytes, ckpt, overrides={sp: swap_data})
                v.reader_only = True
                views.append(v)
    return views


def _framed(data: bytes):
    """(position, size) of each batch framing finds (batchLength sane and inside the data)."""
    pos = 0
    while len(data) - pos >= HEADER_SIZE:
        blen = struct.unpack_from(">i", data, pos + 8)[0]
        if blen < MIN_BATCH_LENGTH or pos + LOG_OVERHEAD + blen > len(data):
            return
        yield pos, LOG_OVERHEAD + blen
        pos += LOG_OVERHEAD + blen


# ---------------------------------------------------------------- dump-log's per-file view


@dataclass
class DumpBatch:
    batch: Batch
    expect_error: bool  # records cannot be decoded: dump-log must say so under the batch
    magic_unknown: bool = False  # magic > 2: dump-log may stop there (error) or print it as v2


@dataclass
class DumpFile:
    path: str
    batches: list  # list[DumpBatch]
    trailing: int  # bytes dump-log must report as invalid at the end (0: none)
    stop_error: str | None  # dump-log must stop this file with an error (file and position)
    stop_position: int | None


def dump_view(path: str, max_bytes: int = DUMP_MAX_MESSAGE_SIZE) -> DumpFile:
    """What Kafka's DumpLogSegments reads in one .log file: framing only, no offset checks, CRC
    reported (isvalid) not enforced. Records are decoded as Java's iterator does."""
    with open(path, "rb") as f:
        data = f.read()
    out = DumpFile(path, [], 0, None, None)
    pos = 0
    while pos < len(data):
        remaining = len(data) - pos
        if remaining < LOG_OVERHEAD:
            out.trailing = remaining
            break
        base, blen = struct.unpack_from(">qi", data, pos)
        if blen < MIN_BATCH_LENGTH:
            if remaining < 17 and blen >= 0:
                out.trailing = remaining
                break
            out.stop_error = f"batchLength {blen} below the minimum"
            out.stop_position = pos
            break
        if LOG_OVERHEAD + blen > remaining:
            out.trailing = remaining
            break
        if LOG_OVERHEAD + blen > max_bytes:
            out.stop_error = f"batch of {LOG_OVERHEAD + blen} bytes larger than --max-message-size"
            out.stop_position = pos
            break
        magic = struct.unpack_from(">b", data, pos + 16)[0]
        if magic < MAGIC:  # v0/v1 message sets: not supported, an error naming the position
            out.stop_error = f"magic {magic}"
            out.stop_position = pos
            break
        # dump-log bounds decompression by --max-message-size (Kafka: no bound); use the larger one
        b = decode_batch(path, data, pos, max(max_bytes, DEFAULT_MAX_MESSAGE_BYTES))
        out.batches.append(DumpBatch(b, b.structure_error is not None, magic > MAGIC))
        pos += b.size
    return out


def view_summary(v: View) -> str:
    s = f"{v.name}: {len(v.records)} records, end offset {v.end_offset}"
    if v.stop:
        stop = v.stop
        where = f"{os.path.basename(stop.file)} position {stop.position}"
        s += f", valid prefix stops at {where} ({stop.kind}: {stop.reason})"
    if len(v.committed) != len(v.records) or v.committed_stop is not v.stop:
        s += f"; read_committed: {len(v.committed)} records, last stable offset {v.lso}"
        if v.committed_stop is not None and v.committed_stop is not v.stop:
            stop = v.committed_stop
            s += f", stops at {os.path.basename(stop.file)} position {stop.position} ({stop.reason})"
    return s
