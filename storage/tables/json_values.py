"""Record values (JSON bytes) parsed into the typed columns of `table.value.schema`; a value that does not parse
is an error row, never a dropped record.

Input: a binary or large_binary Arrow array of record values, nulls allowed (Kafka tombstones). Output
(ParsedValues): one array per top-level field of the ValueSchema, in its order, each as long as the input and
typed by ValueSchema.arrow_schema(): element i of every array belongs to record i. Then the error rows: their
indices (int64, ascending) and one message each (one line, at most MAX_MESSAGE_CHARS).

A value parses when it is exactly one JSON object (RFC 8259, UTF-8, blanks around it allowed) whose fields have
the JSON types of their schema types:

    BOOLEAN                  true or false
    TINYINT .. BIGINT        an integer literal (no fraction, no exponent) in the type's range
    FLOAT, DOUBLE            any number, or NaN, Infinity, -Infinity (and RapidJSON's Inf, -Inf, -NaN); one
                             beyond the type's range is infinity, but RapidJSON refuses one whose exponent,
                             less its digits after the point, is above 308 (1e309), wherever it is
    DECIMAL(p,s)             a number or a numeric string, rounded half away from zero to s digits after the
                             point (as Spark does); more than p-s digits before it is an error, and so are
                             more than 37 after it, or 76 in all, before rounding
    STRING, CHAR, VARCHAR    a string
    DATE                     a string yyyy-MM-dd naming a real day
    TIMESTAMP                an ISO 8601 string: yyyy-MM-dd, then optionally [T or blank]HH[:mm[:ss[.fraction]]]
                             and a zone (Z, +hh, +hhmm, +hh:mm); no zone means UTC; digits past the
                             microsecond are dropped (as Spark does)
    TIMESTAMP_NTZ            the same, without a zone
    ARRAY<T>                 an array of T values or nulls
    STRUCT<...>              an object, by these same rules

A null or missing field is null; for a NOT NULL field of an object that is there, it is an error. Keys the
schema does not name are ignored (at every level); a key it names, given twice in one object, is an error
(Spark keeps the last). Keys match names case-sensitively, as in Spark's from_json.

A null value (a tombstone) gives a row of nulls and no error. Every other value that does not parse gives an
error row, all of whose columns are null.

How it stays fast and aligned. The values that look like one object (their first non-blank byte is '{' and
their last '}') and are valid UTF-8 are parsed together: every value, with '{}' in place of the others, is
joined with newlines into one buffer that one pyarrow.json.read_json call parses. Row i of that parse is
record i because a JSON value cannot continue across the '\\n' between two such records: after the '}' that
ends a record, a nested value would have to go on with ',' or a closing bracket, but the next record starts
with '{'; and no string can hold a raw newline. So each row lies inside one record, each record starts at least
one row, and a parse with as many rows as records has exactly one row per record. Where the parse fails, the
bad records are found by further parses (_Reader), so that good records still parse in bulk.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Context, Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from .value_schema import ArrayType, CharType, DecimalType, Field, PrimitiveType, StructType, ValueSchema, ValueType

MAX_MESSAGE_CHARS = 300
#: Input bytes parsed as one buffer; a larger input is cut into record ranges of about this size.
CHUNK_BYTES = 64 << 20

_BLANK = np.zeros(256, dtype=bool)
_BLANK[[0x20, 0x09, 0x0A, 0x0D]] = True  # JSON's whitespace
# blanks trimmed by vector steps before records with longer runs are trimmed one by one
_TRIM_STEPS = 8
_INT_RANGES = {"tinyint": (-(2**7), 2**7 - 1), "smallint": (-(2**15), 2**15 - 1), "int": (-(2**31), 2**31 - 1)}
_ROW_RE = re.compile(r" in row (\d+)$")
_TOO_MANY = "not one JSON object: the value holds {} JSON values"
# the errors without a row that diagnose() explains: more rows than records, an integer that does not convert
_DIAGNOSED = (_TOO_MANY[:30], "Failed to convert JSON to int64")
#: careful scans nested deeper than this bisect instead
_MAX_DEPTH = 64
_ZONE_RE = r"[T ][0-9]{2}(:[0-9]{2}(:[0-9]{2}(\.[0-9]*)?)?)?(Z|[+-][0-9]{2}(:?[0-9]{2})?)$"
_FRACTION_RE = r"(\.[0-9]{6})[0-9]+"
# the forms the casts take (dates; timestamps without a zone, fraction cut to microseconds)
_DATE_RE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
_NAIVE_RE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9]{2}(:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,6})?)?)?)?$"
_NO_POS = np.zeros(0, dtype=np.int64)
_EXACT = Context(prec=100)
# Decimals are read as decimal256(76, 37) (or the type's scale, if 38): room to round any DECIMAL(p, s) value to s
# digits after the point, as Spark does, with its (at most 38) digits before the point fitting too.
_DECIMAL_READ_SCALE = 37
_EXACT_CHECK_DIGITS = 18
_HUGE_RE = r"[0-9]{40}|[0-9.][eE]\+?[0-9]"
_DECIMAL_STRING_RE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
# the key of the marker objects of _Reader.diagnose (a control character: no DDL name needs it)
_MARKER = "\u0001kafkalog-record"


@dataclass(frozen=True)
class ParsedValues:
    """The columns of a batch of values and its error rows (see the module docstring)."""

    schema: pa.Schema
    columns: tuple[pa.Array, ...]
    error_rows: np.ndarray  # int64, ascending
    error_messages: list[str]

    def table(self) -> pa.Table:
        return pa.Table.from_arrays(list(self.columns), schema=self.schema)


def parse_json_values(values: pa.Array | pa.ChunkedArray, schema: ValueSchema) -> ParsedValues:
    """Each value parsed as one JSON object of `schema`'s fields; a value that does not is an error row."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
        raise TypeError(f"values must be binary or large_binary, not {values.type}")
    arrow_schema = schema.arrow_schema()
    offsets = _offsets(values)
    if len(values) and offsets[-1] - offsets[0] > CHUNK_BYTES:
        cuts = np.searchsorted(offsets, np.arange(offsets[0], offsets[-1], CHUNK_BYTES), side="right") - 1
        bounds = sorted({int(c) for c in cuts if c > 0} | {0, len(values)})
        parts = [_parse(values.slice(a, b - a), schema) for a, b in zip(bounds, bounds[1:], strict=False)]
        return ParsedValues(
            arrow_schema,
            tuple(pa.concat_arrays([p[0][k] for p in parts]) for k in range(len(schema.fields))),
            np.concatenate([p[1] + a for p, a in zip(parts, bounds, strict=False)]).astype(np.int64),
            [m for p in parts for m in p[2]],
        )
    arrays, rows, messages = _parse(values, schema)
    return ParsedValues(arrow_schema, arrays, rows, messages)


# ---------------------------------------------------------------- one chunk


def _offsets(values: pa.Array) -> np.ndarray:
    dtype = np.int64 if pa.types.is_large_binary(values.type) else np.int32
    buf = values.buffers()[1]
    if buf is None:
        return np.zeros(len(values) + 1, dtype=np.int64)
    return np.frombuffer(buf, dtype=dtype)[values.offset : values.offset + len(values) + 1].astype(np.int64)


def _parse(values: pa.Array, schema: ValueSchema) -> tuple[tuple[pa.Array, ...], np.ndarray, list[str]]:
    n = len(values)
    errors: dict[int, str] = {}
    offsets = _offsets(values)
    data_buf = values.buffers()[2]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, dtype=np.uint8)
    valid = np.ones(n, dtype=bool) if values.null_count == 0 else values.is_valid().to_numpy(zero_copy_only=False)

    # 1. shape: the first non-blank byte '{' and the last '}'
    first, end = _trim(data, offsets[:-1].copy(), offsets[1:].copy())
    nonblank = first < end
    shaped = valid & nonblank
    idx = np.flatnonzero(shaped)
    shaped[idx] = (data[first[idx]] == ord("{")) & (data[end[idx] - 1] == ord("}"))
    for i in np.flatnonzero(valid & ~shaped).tolist():
        errors[i] = _shape_message(data, int(offsets[i]), int(offsets[i + 1]), int(first[i]), int(end[i]))

    # 2. UTF-8: pyarrow's JSON reader does not check it (it even puts invalid bytes into string columns)
    candidate = shaped
    lines: pa.Array | None = _placeholders(values, candidate)
    for i in _invalid_utf8(lines):
        candidate[i] = False
        errors[i] = _utf8_message(data[offsets[i] : offsets[i + 1]].tobytes())
        lines = None

    # 3. JSON: one parse of all candidates, bad records found as _Reader says
    reader = _Reader(values, candidate, schema, lines)
    if candidate.any():
        table, found = reader.read_all()
        errors.update(found)
        candidate[list(found)] = False
        parsed = candidate.copy()  # rows that hold what the reader read
        if _needs_exact_check(schema.fields):
            for i, m in _huge_decimals(values, np.flatnonzero(candidate), schema.fields).items():
                errors[i] = m
                candidate[i] = False
    else:
        table = reader.nulls(n)
        parsed = candidate

    # 4. types: the read columns to the schema's, checking what the reader cannot (ranges, dates, NOT NULL)
    arrays = []
    for field, column in zip(schema.fields, table.columns, strict=True):
        arr = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        converted, pos, msgs = _convert(field.type, arr, field.name) if _converts(field.type) else (arr, _NO_POS, [])
        if not field.nullable:
            missing = np.flatnonzero(candidate & ~converted.is_valid().to_numpy(zero_copy_only=False))
            pos = np.concatenate([pos, missing])
            msgs = msgs + [f"field {field.name}: missing or null, but it is NOT NULL"] * len(missing)
        for p, m in zip(pos.tolist(), msgs, strict=True):
            if candidate[p] and p not in errors:
                errors[p] = m
        arrays.append(converted)
    bad = np.zeros(n, dtype=bool)
    bad[list(errors)] = True
    if (bad & parsed).any():  # error rows that hold what did parse: null them
        take = pa.array(np.arange(n), mask=bad)
        arrays = [a.take(take) for a in arrays]

    rows = np.flatnonzero(bad).astype(np.int64)
    return tuple(arrays), rows, [_one_line(errors[i]) for i in rows.tolist()]


def _trim(data: np.ndarray, first: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each record's bounds without leading and trailing JSON blanks; first == end for a blank record."""
    for front in (True, False):
        idx = np.flatnonzero(first < end)
        for _ in range(_TRIM_STEPS):
            if not idx.size:
                break
            idx = idx[_BLANK[data[first[idx] if front else end[idx] - 1]]]
            if front:
                first[idx] += 1
            else:
                end[idx] -= 1
            idx = idx[first[idx] < end[idx]]
        for i in idx.tolist():  # runs of more than _TRIM_STEPS blanks, rare
            text = data[first[i] : end[i]].tobytes()
            if front:
                first[i] += len(text) - len(text.lstrip(b" \t\r\n"))
            else:
                end[i] -= len(text) - len(text.rstrip(b" \t\r\n"))
    return first, end


def _placeholders(values: pa.Array, candidate: np.ndarray, *, joined: bool = True) -> pa.Array:
    """The values, '{}' in place of every one that is not a candidate; joined, each followed by a newline."""
    if not candidate.all():
        values = pc.if_else(pa.array(candidate), values, pa.scalar(b"{}", values.type))
    if not joined:
        return values
    return pc.binary_join_element_wise(values, pa.scalar(b"", values.type), pa.scalar(b"\n", values.type))


def _invalid_utf8(lines: pa.Array) -> list[int]:
    """The indices of the elements that are not UTF-8: one validation of all, halves only where it fails."""
    out: list[int] = []
    stack = [(0, len(lines))]
    while stack:
        lo, hi = stack.pop()
        try:
            lines.slice(lo, hi - lo).cast(pa.large_string() if pa.types.is_large_binary(lines.type) else pa.string())
            continue
        except pa.ArrowInvalid:
            pass
        if hi - lo == 1:
            out.append(lo)
        else:
            mid = (lo + hi) // 2
            stack += [(mid, hi), (lo, mid)]
    return out


class _Reader:
    """pyarrow.json.read_json over the candidate records, finding the ones that fail (read_all).

    pyarrow stops at the first bad row and has no mode that skips it and goes on, so bad records are found by
    hand. A parse from record `start` that fails naming row r marks record start+r; the next parse starts after
    it. That mark is right unless a record before it held two values (two rows). Where no row is named (more
    rows than records, or a number an integer field cannot hold: pyarrow converts numbers after parsing), a
    parse with a marker object before each record tells which records hold two values or such a number
    (diagnose), and what it cannot explain is bisected: halves parsed again, recursively, down to single
    records, which get the error."""

    def __init__(self, values: pa.Array, candidate: np.ndarray, schema: ValueSchema, lines: pa.Array | None = None):
        self.values = values
        self.candidate = candidate
        self.fields = schema.fields
        self.schema = pa.schema([pa.field(f.name, _read_type(f.type)) for f in schema.fields])
        relaxed = pa.schema([pa.field(f.name, _read_type(f.type, relaxed=True)) for f in schema.fields])
        self.relaxed = relaxed if relaxed != self.schema else None
        self.found: dict[int, str] = {}  # bad records and their messages
        self.parts: list[pa.Table] = []  # rows read, in record order (careful scans; a whole quick parse)
        lines = _placeholders(values, candidate) if lines is None else lines
        self.offsets = _offsets(lines)  # of the candidates joined with newlines, '{}' in place of the others
        self.pristine = lines.buffers()[2]
        self.buffer = self.pristine  # the same, but the records blanked out
        self.data: np.ndarray | None = None  # its bytes, once one is

    def blank(self, records: Iterable[int]) -> None:
        """Writes '{}' and blanks over each record, its length kept (no offset moves): a row of nulls from now on.
        (pyarrow copies what it reads, so the tables read before keep their values.)"""
        if self.data is None:
            self.data = np.frombuffer(self.pristine, dtype=np.uint8)[: int(self.offsets[-1])].copy()
            self.buffer = pa.py_buffer(self.data)
        for i in records:
            start, stop = int(self.offsets[i]), int(self.offsets[i + 1]) - 1  # a candidate: '{' ... '}', 2+ bytes
            self.data[start:stop] = ord(" ")
            self.data[start : start + 2] = (ord("{"), ord("}"))

    def read(self, lo: int, hi: int) -> pa.Table:
        """Records lo..hi-1 read as one block; raises pa.ArrowInvalid as pyarrow does. Each buffer starts with a
        record whose first non-blank byte is '{': pyarrow 26 crashes (SIGSEGV) when the first value of a block
        is a top-level null. One block also makes the row an error names count from the buffer's start."""
        start, stop = int(self.offsets[lo]), int(self.offsets[hi])
        return _read_json(self.buffer.slice(start, stop - start), self.schema)

    def first_error(self, lo: int, hi: int) -> tuple[int, str, pa.Table | None]:
        """Records lo..hi-1 parsed: (hi, "", table) if they parse, a row each; (lo + r, error, None) if the error
        names row r (the last record if r is past it: rows before it held two values, so the bad record is the
        last or before); (-1, error, None) otherwise (for more rows than records, the _TOO_MANY message)."""
        try:
            table = self.read(lo, hi)
        except pa.ArrowInvalid as e:
            m = _ROW_RE.search(str(e))
            if m:
                return lo + min(int(m.group(1)), hi - lo - 1), str(e), None
            return -1, str(e), None
        if table.num_rows == hi - lo:
            return hi, "", table
        return -1, _TOO_MANY.format(table.num_rows if hi - lo == 1 else "too many"), None

    def read_all(self) -> tuple[pa.Table, dict[int, str]]:
        """A row per record (nulls for the bad ones), and the bad records' messages. A quick scan trusts every
        mark; one parse of the unmarked records then checks them all: a row each proves every unmarked record
        good, so every mark right (a misplaced mark leaves the bad record before it unmarked). If the check
        fails, a careful scan proves each mark as it makes it."""
        n = len(self.values)
        first = self.first_error(0, n)
        if first[0] == n:  # all good: the common case
            assert first[2] is not None
            return first[2], self.found
        if self.scan(0, n, careful=False, first=first, whole=True) and self.parts:
            return self.parts.pop(), self.found  # marked only by diagnose(), then parsed whole
        self.blank(self.found)
        start, error, table = self.first_error(0, n)
        if start < 0 and error.startswith(_DIAGNOSED) and self.diagnose(0, n):
            start, error, table = self.first_error(0, n)  # what the quick scan passed over: see scan()
        if start == n:
            assert table is not None
            return table, self.found
        self.found = {}
        self.buffer, self.data = self.pristine, None
        self.scan(0, n, careful=True)
        table = pa.concat_tables(self.parts)
        assert table.num_rows == n, (table.num_rows, n)
        return table, self.found

    def scan(
        self,
        lo: int,
        hi: int,
        *,
        careful: bool,
        depth: int = 0,
        first: tuple[int, str, pa.Table | None] | None = None,
        whole: bool = False,
    ) -> bool:
        """Marks the bad records among lo..hi-1, by parses from `start` on (see the class docstring). A number an
        integer field cannot hold is passed over when a later error in the same parse is named first. Careful,
        a mark at start+r is proven by scanning records start..start+r-1 first: if they parse in one go it is
        right, else the scan goes on from start+r unmarked; the rows go to `parts`. True if lo..hi-1 parsed in
        one go (or, with `whole`, after diagnose() only: then the rows go to `parts`). `first` is the result of
        first_error(lo, hi), if the caller has it."""
        start = lo
        while start < hi:
            stop, error, table = first if first is not None and start == lo else self.first_error(start, hi)
            first = None
            if stop == hi:
                if careful or (whole and start == lo):
                    self.parts.append(table)
                return start == lo
            if stop >= 0:
                if careful and stop > start:
                    if depth >= _MAX_DEPTH:
                        self.bisect(start, stop + 1)
                        start = stop + 1
                        continue
                    if not self.scan(start, stop, careful=True, depth=depth + 1):
                        start = stop  # records before it held what the mark did not count: parse again from it
                        continue
                self.found[stop] = _json_message(error)
                if careful:
                    self.parts.append(self.nulls(1))
                start = stop + 1
                continue
            if error.startswith(_DIAGNOSED) and self.diagnose(start, hi):
                continue
            if careful:
                self.bisect(start, hi)
                return False
            start = hi  # the quick scan leaves it to read_all's check
        return False

    def diagnose(self, lo: int, hi: int) -> bool:
        """Marks the records among lo..hi-1 (but those marked) that hold more than one JSON value, or an integer
        with a fraction or beyond 64 bits: one parse of them with integers read as doubles (which take any
        number) and a marker object before each record, so that the rows between two markers are one record's.
        Nothing when that parse fails, or a record's object holds the marker's key (more markers than
        records). True if it marked any."""
        schema = self.relaxed or self.schema
        if _MARKER in schema.names:
            return False
        candidate = self.candidate[lo:hi].copy()
        candidate[[i - lo for i in self.found if lo <= i < hi]] = False
        values = _placeholders(self.values.slice(lo, hi - lo), candidate, joined=False)
        marker = pa.scalar(b'{"\\u0001%s":true}' % _MARKER[1:].encode(), values.type)
        marked = pc.binary_join_element_wise(marker, values, pa.scalar(b"", values.type), pa.scalar(b"\n", values.type))
        offsets = _offsets(marked)
        try:
            table = _read_json(
                marked.buffers()[2].slice(int(offsets[0]), int(offsets[-1] - offsets[0])),
                schema.append(pa.field(_MARKER, pa.bool_())),
            )
        except pa.ArrowInvalid:
            return False
        markers = np.flatnonzero(table.column(_MARKER).is_valid().to_numpy(zero_copy_only=False))
        if len(markers) != hi - lo:
            return False
        counts = np.diff(np.append(markers, table.num_rows)) - 1
        found = {lo + int(i): _TOO_MANY.format(int(counts[i])) for i in np.flatnonzero(counts != 1)}
        if self.relaxed is not None:
            single = np.flatnonzero(counts == 1)
            rows = pa.array(markers[single] + 1)
            for field, column in zip(self.fields, table.columns, strict=False):
                pos, msgs = _non_integers(field.type, column.take(rows).combine_chunks(), field.name)
                for p, m in zip(pos.tolist(), msgs, strict=True):
                    found.setdefault(lo + int(single[p]), m)
        found = {i: m for i, m in found.items() if i not in self.found}
        if found:  # each call that returns True marks more records: scans that go on after it end
            self.found.update(found)
            self.blank(found)
        return bool(found)

    def bisect(self, lo: int, hi: int) -> None:
        """Marks the bad records among lo..hi-1 by parsing halves, down to single records; their rows go to
        `parts`. A range whose error names a row is split just before that row instead of in halves."""
        # Hand-written: pyarrow's JSON reader has no per-row error mode (it raises at the first bad row).
        done = lo  # records covered by parts
        stack = [(lo, hi)]
        while stack:
            a, b = stack.pop()
            stop, error, table = self.first_error(a, b)
            if stop == b:
                if a > done:
                    self.parts.append(self.nulls(a - done))
                self.parts.append(table)
                done = b
                continue
            if b - a == 1:
                self.found[a] = _json_message(error)
                continue
            if stop > a:
                pieces = [(a, stop), (stop, stop + 1), (stop + 1, b)]
            elif stop == a:
                pieces = [(a, a + 1), (a + 1, b)]
            else:
                pieces = [(a, (a + b) // 2), ((a + b) // 2, b)]
            stack += reversed([(x, y) for x, y in pieces if x < y])
        if hi > done:
            self.parts.append(self.nulls(hi - done))

    def nulls(self, n: int) -> pa.Table:
        return pa.table([pa.nulls(n, f.type) for f in self.schema], schema=self.schema)


def _read_json(buffer: pa.Buffer, schema: pa.Schema) -> pa.Table:
    """One pyarrow.json.read_json of a whole buffer as a single block, fields not in `schema` ignored."""
    return pa_json.read_json(
        pa.BufferReader(buffer),
        read_options=pa_json.ReadOptions(use_threads=False, block_size=buffer.size + 64),
        parse_options=pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
    )


# ---------------------------------------------------------------- read types and conversions


def _needs_exact_check(fields: tuple[Field, ...]) -> bool:
    """Whether a DECIMAL field (at any depth) has more than 18 digits before the point (see _huge_decimals)."""
    for f in fields:
        t = f.type
        while isinstance(t, ArrayType):
            t = t.element
        if isinstance(t, DecimalType) and t.precision - t.scale > _EXACT_CHECK_DIGITS:
            return True
        if isinstance(t, StructType) and _needs_exact_check(t.fields):
            return True
    return False


def _huge_decimals(values: pa.Array, rows: np.ndarray, fields: tuple[Field, ...]) -> dict[int, str]:
    """The records among `rows` with a DECIMAL value too large for its type, read exactly by Python's json.

    pyarrow 26 rescales a JSON decimal to its read type without checking for overflow: a value beyond about
    5.8e39 (40 digits before the point, or a large exponent) can come out as a wrong value, not an error. Such a
    value is out of every DECIMAL's range, so a wrong value is caught as out of range unless it happens to land in
    range: about 10**-22 likely for 18 digits before the point, so for wider types, the records whose text holds
    40 digits in a row or a positive exponent are read again here. One Python's json cannot read (RapidJSON's
    Inf, say) is left as pyarrow read it."""
    if not len(rows):
        return {}
    subset = values.take(pa.array(rows))
    suspect = pc.match_substring_regex(subset, _HUGE_RE).fill_null(False).to_numpy(zero_copy_only=False)
    out: dict[int, str] = {}
    for i in rows[suspect].tolist():
        try:
            obj = json.loads(values[i].as_py(), parse_float=Decimal, parse_int=Decimal)
        except (ValueError, RecursionError):
            continue
        for path, t, d in _decimal_values(StructType(fields), obj, ""):
            if d.copy_abs() >= Decimal(10) ** (t.precision - t.scale):
                out[i] = (
                    f"field {path}: {_snippet(str(d))} has more than {t.precision - t.scale} digits before the point, "
                    f"too many for {t.simple_string().upper()}"
                )
                break
    return out


def _decimal_values(t: ValueType, v: object, path: str) -> Iterator[tuple[str, DecimalType, Decimal]]:
    """The DECIMAL values in `v` (as Python's json read it, numbers as Decimal) where t has them."""
    if isinstance(t, DecimalType):
        if isinstance(v, Decimal) and v.is_finite():
            yield path, t, v
        elif isinstance(v, str) and _DECIMAL_STRING_RE.fullmatch(v):
            yield path, t, Decimal(v)
    elif isinstance(t, ArrayType) and isinstance(v, list):
        for x in v:
            yield from _decimal_values(t.element, x, f"{path}[]")
    elif isinstance(t, StructType) and isinstance(v, dict):
        for f in t.fields:
            yield from _decimal_values(f.type, v.get(f.name), f"{path}.{f.name}" if path else f.name)


def _read_type(t: ValueType, *, relaxed: bool = False) -> pa.DataType:
    """The Arrow type the JSON reader produces for `t`: wide ints (ranges are checked after), strings for dates and
    timestamps (parsed after, value by value), decimals with room to round to the scale. Relaxed, every integer
    is read as a double, which takes any JSON number."""
    if isinstance(t, PrimitiveType):
        if t.name in _INT_RANGES or t.name == "bigint":
            return pa.float64() if relaxed else pa.int64()
        if t.name in ("date", "timestamp", "timestamp_ntz"):
            return pa.string()
        return t.to_arrow()
    if isinstance(t, DecimalType):
        return pa.decimal256(76, max(_DECIMAL_READ_SCALE, t.scale))
    if isinstance(t, CharType):
        return pa.string()
    if isinstance(t, ArrayType):
        return pa.list_(_read_type(t.element, relaxed=relaxed))
    return pa.struct([pa.field(f.name, _read_type(f.type, relaxed=relaxed)) for f in t.fields])


def _non_integers(t: ValueType, arr: pa.Array, path: str) -> tuple[np.ndarray, list[str]]:
    """Positions in `arr` (of the relaxed read type of t) whose integers, read as doubles, have a fraction or are
    beyond 64 bits, with a message each. A double that is whole and in range may still have been written with a
    fraction or exponent (1.0, 1e2): those are left to bisection."""
    if isinstance(t, PrimitiveType) and pa.types.is_floating(arr.type) and t.name != "double" and t.name != "float":
        x = arr.fill_null(0).to_numpy(zero_copy_only=False)
        with np.errstate(invalid="ignore"):
            bad = (x != np.floor(x)) | (x > 2.0**63) | (x < -(2.0**63))  # NaN: not whole; Infinity: too far
        pos = np.flatnonzero(bad)
        return pos, [f"field {path}: {float(x[p])!r} is not a 64-bit integer" for p in pos.tolist()]
    if isinstance(t, ArrayType):
        assert isinstance(arr, pa.ListArray)
        lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False)
        pos, msgs = _non_integers(t.element, arr.flatten(), f"{path}[]")
        return (np.repeat(np.arange(len(arr), dtype=np.int64), lengths)[pos] if len(pos) else pos), msgs
    if isinstance(t, StructType):
        assert isinstance(arr, pa.StructArray)
        children = zip(t.fields, arr.flatten(), strict=True)
        found = [_non_integers(f.type, child, f"{path}.{f.name}") for f, child in children]
        return np.concatenate([p for p, _ in found]).astype(np.int64), [m for _, ms in found for m in ms]
    return _NO_POS, []


def _converts(t: ValueType) -> bool:
    """Whether _convert has anything to do for `t`: a type read as another, or a NOT NULL field in a STRUCT."""
    if isinstance(t, ArrayType):
        return _converts(t.element)
    if isinstance(t, StructType):
        return any(not f.nullable or _converts(f.type) for f in t.fields)
    return isinstance(t, DecimalType) or _read_type(t) != t.to_arrow()  # (pyarrow checks no decimal precision)


def _convert(t: ValueType, arr: pa.Array, path: str) -> tuple[pa.Array, np.ndarray, list[str]]:
    """`arr` (of _read_type(t)) as t's Arrow type, and the positions of the values that break t's rules, with
    a message each."""
    if isinstance(t, PrimitiveType):
        if t.name in _INT_RANGES:
            return _int_range(t.name, arr, path)
        if t.name == "date":
            return _strings_to(arr, pa.date32(), path, "a date yyyy-MM-dd", _DATE_RE)
        if t.name in ("timestamp", "timestamp_ntz"):
            return _timestamps(arr, t, path)
        return arr, _NO_POS, []
    if isinstance(t, DecimalType):
        return _decimals(t, arr, path)
    if isinstance(t, CharType):
        return arr, _NO_POS, []
    if isinstance(t, ArrayType):
        assert isinstance(arr, pa.ListArray)
        lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False)
        child, pos, msgs = _convert(t.element, arr.flatten(), f"{path}[]")
        if len(pos):  # an element's position to its list's
            pos = np.repeat(np.arange(len(arr), dtype=np.int64), lengths)[pos]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        mask = arr.is_null() if arr.null_count else None
        out = pa.ListArray.from_arrays(pa.array(offsets), child, type=t.to_arrow(), mask=mask)
        return out, pos, msgs
    assert isinstance(arr, pa.StructArray)
    children, all_pos, all_msgs = [], [], []
    valid = arr.is_valid().to_numpy(zero_copy_only=False)
    for f, child in zip(t.fields, arr.flatten(), strict=True):
        name = f"{path}.{f.name}"
        converted, pos, msgs = _convert(f.type, child, name)
        if not f.nullable:
            missing = np.flatnonzero(valid & ~converted.is_valid().to_numpy(zero_copy_only=False))
            pos = np.concatenate([pos, missing])
            msgs = msgs + [f"field {name}: missing or null, but it is NOT NULL"] * len(missing)
        children.append(converted)
        all_pos.append(pos)
        all_msgs += msgs
    mask = arr.is_null() if arr.null_count else None
    out = pa.StructArray.from_arrays(children, fields=list(t.to_arrow()), mask=mask)
    return out, np.concatenate(all_pos).astype(np.int64) if all_pos else _NO_POS, all_msgs


def _int_range(name: str, arr: pa.Array, path: str) -> tuple[pa.Array, np.ndarray, list[str]]:
    lo, hi = _INT_RANGES[name]
    bounds = pc.min_max(arr)
    if bounds["min"].as_py() is None or (lo <= bounds["min"].as_py() and bounds["max"].as_py() <= hi):
        return arr.cast(pa.int32()), _NO_POS, []
    bad = pc.or_(pc.less(arr, lo), pc.greater(arr, hi)).fill_null(False)
    pos = np.flatnonzero(bad.to_numpy(zero_copy_only=False))
    msgs = [f"field {path}: {v} is out of range for {name.upper()} ({lo} to {hi})" for v in arr.take(pos).to_pylist()]
    return pc.if_else(bad, pa.scalar(None, pa.int64()), arr).cast(pa.int32()), pos, msgs


def _decimals(t: DecimalType, arr: pa.Array, path: str) -> tuple[pa.Array, np.ndarray, list[str]]:
    if arr.type.scale != t.scale:
        arr = pc.round(arr, ndigits=t.scale, round_mode="half_towards_infinity")
    largest = Decimal(("9" * (t.precision - t.scale) or "0") + ("." + "9" * t.scale if t.scale else ""))
    bad = pc.greater(pc.abs(arr), pa.scalar(largest, arr.type)).fill_null(False)
    pos = np.flatnonzero(bad.to_numpy(zero_copy_only=False))
    if not len(pos):
        return arr.cast(t.to_arrow()), _NO_POS, []
    msgs = [
        f"field {path}: {v.normalize(_EXACT):f} has more than {t.precision - t.scale} digits before the point, "
        f"too many for {t.simple_string().upper()}"
        for v in arr.take(pos).to_pylist()
    ]
    return pc.if_else(bad, pa.scalar(None, arr.type), arr).cast(t.to_arrow()), pos, msgs


def _timestamps(arr: pa.Array, t: PrimitiveType, path: str) -> tuple[pa.Array, np.ndarray, list[str]]:
    target = t.to_arrow()
    naive = pa.timestamp("us")
    # the common cases first: every value zoned (TIMESTAMP only), or every value without a zone
    for steps in ([target], [naive, target]) if t.name == "timestamp" else ([naive],):
        try:
            out = arr
            for step in steps:
                out = out.cast(step)
            return out, _NO_POS, []
        except pa.ArrowInvalid:
            pass
    arr = pc.replace_substring_regex(arr, pattern=_FRACTION_RE, replacement=r"\1")
    zoned = pc.match_substring_regex(arr, _ZONE_RE).fill_null(False)
    none = pa.scalar(None, arr.type)
    what = "an ISO 8601 timestamp"
    if t.name == "timestamp_ntz":
        out, pos, msgs = _strings_to(pc.if_else(zoned, none, arr), naive, path, what, _NAIVE_RE)
        zpos = np.flatnonzero(zoned.to_numpy(zero_copy_only=False))
        zmsgs = [f"field {path}: {_snippet(v)} has a zone, TIMESTAMP_NTZ none" for v in arr.take(zpos).to_pylist()]
        return out, np.concatenate([pos, zpos]), msgs + zmsgs
    out_z, pos_z, msgs_z = _strings_to(pc.if_else(zoned, arr, none), target, path, what)
    out_n, pos_n, msgs_n = _strings_to(pc.if_else(zoned, none, arr), naive, path, what, _NAIVE_RE)
    return pc.if_else(zoned, out_z, out_n.cast(target)), np.concatenate([pos_z, pos_n]), msgs_z + msgs_n


def _strings_to(
    arr: pa.Array, target: pa.DataType, path: str, what: str, form: str | None = None
) -> tuple[pa.Array, np.ndarray, list[str]]:
    """Strings cast to `target`; a value that does not cast is null, its position reported. Values not of the
    regular expression `form` are out at once; the cast fails as a whole, so where it does, halves are cast
    again down to single values (a real day and time, which a pattern does not check)."""
    pieces: list[pa.Array] = []
    bad: list[int] = []
    unformed = np.zeros(0, dtype=np.int64)
    if form is not None:
        formed = pc.match_substring_regex(arr, form)
        unformed = np.flatnonzero(~formed.fill_null(True).to_numpy(zero_copy_only=False))
        if len(unformed):
            original, arr = arr, pc.if_else(formed, arr, pa.scalar(None, arr.type))
    stack = [(0, len(arr))]
    while stack:
        lo, hi = stack.pop()
        part = arr.slice(lo, hi - lo)
        try:
            pieces.append(part.cast(target))
            continue
        except pa.ArrowInvalid:
            pass
        if hi - lo == 1:
            bad.append(lo)
            pieces.append(pa.nulls(1, target))
        else:
            mid = (lo + hi) // 2
            stack += [(mid, hi), (lo, mid)]
    out = pieces[0] if len(pieces) == 1 else pa.concat_arrays(pieces)
    if len(unformed):
        arr = original
    pos = np.sort(np.concatenate([unformed, np.array(bad, dtype=np.int64)]))
    msgs = [f"field {path}: {_snippet(arr[i].as_py())} is not {what}" for i in pos.tolist()]
    return out, pos, msgs


# ---------------------------------------------------------------- messages


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3] + "..."


def _snippet(value: object, limit: int = 40) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _shape_message(data: np.ndarray, start: int, stop: int, first: int, end: int) -> str:
    if start == stop:
        return "empty value: not a JSON object"
    if first == end:
        return "blank value: not a JSON object"
    if data[first] != ord("{"):
        return f"not a JSON object: the value starts {_snippet(data[first : min(end, first + 20)].tobytes())}"
    return f"not one JSON object: the value ends {_snippet(data[max(first, end - 20) : end].tobytes())}"


def _utf8_message(value: bytes) -> str:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not UTF-8: byte {e.start} ({e.reason})"
    return "not UTF-8"


_COLUMN_RE = re.compile(r"Column\(([^)]*)\) changed from (\w+) to (\w+)")
_TWICE_RE = re.compile(r"Column\(([^)]*)\) was specified twice")
_CONVERT_RE = re.compile(r"Failed to convert JSON to (\w+), couldn't parse:(.*)")


def _json_path(pointer: str) -> str:
    """pyarrow's column path (/a/[]/b) as a field path (a[].b)."""
    return ".".join(p for p in pointer.strip("/").split("/")).replace(".[]", "[]") or "the value"


def _json_message(error: str) -> str:
    """pyarrow's message for one record, worded for the errors table (its row number dropped)."""
    error = _ROW_RE.sub("", error.strip())
    if m := _COLUMN_RE.search(error):
        path = _json_path(m.group(1))
        want = m.group(2).replace("_or_", " or ")
        where = f"field {path}" if path != "the value" else "the value"
        return f"{where}: expected a JSON {want}, found {'an' if m.group(3)[0] in 'aeiou' else 'a'} {m.group(3)}"
    if m := _TWICE_RE.search(error):
        return f"field {_json_path(m.group(1))} appears twice in one object"
    if error.startswith("JSON parse error: "):
        return "invalid JSON: " + error.removeprefix("JSON parse error: ")
    if m := _CONVERT_RE.match(error):
        if m.group(1) == "int64":
            return f"an integer field holds {m.group(2)}, not a 64-bit integer"
        return f"a {m.group(1)} field holds {m.group(2)}"
    if "decimal" in error:
        return f"a decimal field: {error}"
    return error
