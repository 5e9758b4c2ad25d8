"""JSON values parsed into the columns of a value schema (storage/tables/json_values.py), against a brute-force
model built on Python's json module: random mixes of good and bad records, every good record's values checked
and exactly the bad ones errors; the row alignment cases one by one (raw newlines, blank values, two objects
in one value...); the bad-record search's paths and its cost in parses; and, in the Spark section at the end,
Spark itself: its parse of the same DDL strings, and its from_json on good values."""

from __future__ import annotations

import datetime as dt
import json
import math
import random
import re
from decimal import ROUND_HALF_UP, Context, Decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import storage.tables.json_values as jv
from storage.tables.json_values import MAX_MESSAGE_CHARS, parse_json_values
from storage.tables.value_schema import (
    ArrayType,
    CharType,
    DecimalType,
    PrimitiveType,
    StructType,
    ValueSchema,
    ValueType,
    parse_value_schema,
)

WIDE = (
    "b BOOLEAN, i8 TINYINT, i16 SMALLINT, i32 INT NOT NULL, i64 BIGINT, f FLOAT, d DOUBLE, dec DECIMAL(9,3), "
    "s STRING, v VARCHAR(4), day DATE, ts TIMESTAMP, ntz TIMESTAMP_NTZ, arr ARRAY<INT>, "
    "st STRUCT<x: SMALLINT NOT NULL, y: ARRAY<STRUCT<z: DATE>>, w: DECIMAL(38,0)>"
)
ERROR = "error"

# ---------------------------------------------------------------- the model


class Obj(list):
    """A JSON object as its (key, value) pairs, duplicates kept."""


class Num:
    """A JSON number (or NaN / Infinity / -Infinity) as written."""

    def __init__(self, text: str):
        self.text = text
        self.integer = re.fullmatch(r"-?[0-9]+", text) is not None
        self.constant = text in ("NaN", "Infinity", "-Infinity")


class Bad(Exception):
    pass


_DEC_STRING = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_TS = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})"
    r"(?:[T ]([0-9]{2})(?::([0-9]{2})(?::([0-9]{2})(?:\.([0-9]+))?)?)?(Z|[+-][0-9]{2}(?::?[0-9]{2})?)?)?"
)
_EXACT = Context(prec=100)  # decimal's default 28 digits would round DECIMAL(38, s) values
_RANGES = {"tinyint": 2**7, "smallint": 2**15, "int": 2**31, "bigint": 2**63}


def _walk_strings(v):
    if isinstance(v, str):
        yield v
    elif isinstance(v, Obj):
        for k, x in v:
            yield k
            yield from _walk_strings(x)
    elif isinstance(v, list):
        for x in v:
            yield from _walk_strings(x)


def _walk_numbers(v):
    if isinstance(v, Num):
        yield v
    elif isinstance(v, Obj):
        for _, x in v:
            yield from _walk_numbers(x)
    elif isinstance(v, list):
        for x in v:
            yield from _walk_numbers(x)


_F32_MAX = np.finfo(np.float32).max
_F32_LIMIT = Decimal(2**128 - 2**103)  # the float32 maximum plus half its last place: from there on, infinity
_WIDE_CONTEXT = Context(prec=2000)


def _float32(text: str) -> float:
    """The float32 nearest to the number written (ties to even), rounded once, as pyarrow and Spark do."""
    x = float(text)
    if math.isnan(x) or math.isinf(x):
        return float(np.float32(x))
    d = Decimal(text)
    if d.copy_abs() >= _F32_LIMIT:
        return math.copysign(math.inf, x)
    f = np.float32(min(max(x, -_F32_MAX), _F32_MAX))
    near = [f, np.nextafter(f, np.float32(np.inf)), np.nextafter(f, np.float32(-np.inf))]

    def distance(c):
        return (_WIDE_CONTEXT.subtract(Decimal(float(c)), d).copy_abs(), int(np.array(c).view(np.uint32)) & 1)

    return float(min((c for c in near if np.isfinite(c)), key=distance))


def _timestamp(text: str, ntz: bool) -> dt.datetime:
    m = _TS.fullmatch(text)
    if not m:
        raise Bad
    y, mo, d, h, mi, s, frac, zone = m.groups()
    try:
        at = dt.datetime(
            int(y), int(mo), int(d), int(h or 0), int(mi or 0), int(s or 0), int((frac or "0")[:6].ljust(6, "0"))
        )
    except ValueError:
        raise Bad from None
    if zone is None:
        return at if ntz else at.replace(tzinfo=dt.timezone.utc)
    if ntz:
        raise Bad
    if zone != "Z":
        digits = zone[1:].replace(":", "")
        offset = dt.timedelta(hours=int(digits[:2]), minutes=int(digits[2:] or 0))
        at -= offset if zone[0] == "+" else -offset
    return at.replace(tzinfo=dt.timezone.utc)


def _decimal(t: DecimalType, v) -> Decimal:
    if isinstance(v, Num) and not v.constant:
        d = Decimal(v.text)
    elif isinstance(v, str) and _DEC_STRING.fullmatch(v):
        d = Decimal(v)
    else:
        raise Bad
    read_scale = max(37, t.scale)  # json_values reads decimal256(76, 37): room to round
    _, digits, exp = d.as_tuple()
    written = len(digits) + exp if exp >= 0 else max(len(digits), -exp)  # digits as pyarrow counts them
    if written > 76 or max(0, -d.normalize(_EXACT).as_tuple().exponent) > read_scale:
        raise Bad
    q = d.quantize(Decimal(1).scaleb(-t.scale), rounding=ROUND_HALF_UP, context=_EXACT)
    if q.copy_abs() >= Decimal(10) ** (t.precision - t.scale):
        raise Bad
    return q


def _value(t: ValueType, v):
    """`v` (as json.loads gave it) in type t, as to_pylist gives it; Bad if it breaks t's rules."""
    if v is None:
        return None
    if isinstance(t, PrimitiveType):
        name = t.name
        if name == "boolean" and isinstance(v, bool):
            return v
        if name in _RANGES and isinstance(v, Num) and v.integer:
            if -_RANGES[name] <= int(v.text) < _RANGES[name]:
                return int(v.text)
        if name in ("float", "double") and isinstance(v, Num):
            return _float32(v.text) if name == "float" else float(v.text)
        if name == "string" and isinstance(v, str):
            return v
        if name == "date" and isinstance(v, str) and re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", v):
            try:
                return dt.date(int(v[:4]), int(v[5:7]), int(v[8:]))
            except ValueError:
                raise Bad from None
        if name in ("timestamp", "timestamp_ntz") and isinstance(v, str):
            return _timestamp(v, name == "timestamp_ntz")
        raise Bad
    if isinstance(t, CharType):
        if isinstance(v, str):
            return v
        raise Bad
    if isinstance(t, DecimalType):
        return _decimal(t, v)
    if isinstance(t, ArrayType):
        if isinstance(v, list) and not isinstance(v, Obj):
            return [_value(t.element, x) for x in v]
        raise Bad
    if isinstance(v, Obj):
        return _struct(t.fields, v)
    raise Bad


def _struct(fields, pairs: Obj) -> dict:
    names = {f.name for f in fields}
    seen = [k for k, _ in pairs if k in names]
    if len(seen) != len(set(seen)):
        raise Bad  # a schema key twice
    given_ = dict(pairs)
    out = {}
    for f in fields:
        out[f.name] = _value(f.type, given_.get(f.name))
        if out[f.name] is None and not f.nullable:
            raise Bad
    return out


def model(value: bytes | None, schema: ValueSchema):
    """None for a tombstone, ERROR, or the row: the rules of json_values.py's docstring, by Python's json."""
    if value is None:
        return None
    try:
        text = value.decode("utf-8")
        obj = json.loads(text, object_pairs_hook=Obj, parse_int=Num, parse_float=Num, parse_constant=Num)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return ERROR
    if not isinstance(obj, Obj):
        return ERROR
    for s in _walk_strings(obj):
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            return ERROR  # a lone surrogate escape: RapidJSON refuses it, wherever it is
    for n in _walk_numbers(obj):
        m = re.fullmatch(r"-?[0-9]+(?:\.([0-9]+))?[eE]([+-]?[0-9]+)", n.text)
        if m and int(m.group(2)) - len(m.group(1) or "") > 308:
            return ERROR  # RapidJSON's "Number too big", wherever it is (a larger number without one is inf)
    try:
        return _struct(schema.fields, obj)
    except Bad:
        return ERROR


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def check(values: list[bytes | None], schema: ValueSchema, **kwargs):
    """parse_json_values against the model, record by record; the result."""
    arr = pa.array(values, kwargs.pop("type", pa.binary()))
    out = parse_json_values(arr, schema)
    assert out.schema == schema.arrow_schema()
    assert [c.type for c in out.columns] == list(out.schema.types)
    assert all(len(c) == len(values) for c in out.columns)
    assert out.error_rows.dtype == np.int64 and list(out.error_rows) == sorted(set(out.error_rows.tolist()))
    assert len(out.error_messages) == len(out.error_rows)
    for m in out.error_messages:
        assert "\n" not in m and 0 < len(m) <= MAX_MESSAGE_CHARS
    rows = out.table().to_pylist()
    errors = set(out.error_rows.tolist())
    nulls = {f.name: None for f in schema.fields}
    for i, v in enumerate(values):
        want = model(v, schema)
        if want == ERROR:
            assert i in errors, (i, v)
            assert rows[i] == nulls, (i, v, rows[i])
        else:
            assert i not in errors, (i, v, out.error_messages[list(out.error_rows).index(i)])
            assert same(rows[i], want if want is not None else nulls), (i, v, rows[i], want)
    return out


# ---------------------------------------------------------------- the row alignment, case by case


def test_each_record_is_one_row_or_an_error_whatever_its_shape():
    """Values that could shift rows if records were split at newlines or blank lines were skipped."""
    schema = parse_value_schema("a BIGINT, s STRING")
    cases = [
        (b'{"a":0}', {"a": 0, "s": None}),
        (b"", ERROR),  # pyarrow skips blank lines: would lose a row
        (b'{"a":1}', {"a": 1, "s": None}),
        (b"  \n\t\r\n ", ERROR),
        (b'{"a":\n2,\r\n"s":\n"x"\n}', {"a": 2, "s": "x"}),  # newlines between tokens are blanks
        (b'{"a":3}{"a":4}', ERROR),  # two objects: would add a row
        (b'{"a":5} {"a":6}', ERROR),
        (b'{"a":7}\n{"a":8}', ERROR),
        (b'{"a":9} null', ERROR),
        (b'{"a":10}\nnull\n{"a":11}', ERROR),
        (b"null", ERROR),  # first in a buffer, pyarrow 26 crashes on it: it never gets there
        (b'[{"a":12}]', ERROR),
        (b'"{}"', ERROR),
        (b"12", ERROR),
        (b"true", ERROR),
        (b'{"a":13', ERROR),  # unclosed: would swallow the next record
        (b'{"a":14}', {"a": 14, "s": None}),
        (b'{"s":"', ERROR),  # an open string, closed by the next record's quote?
        (b'"}', ERROR),
        (b'{"s":"x\ny"}', ERROR),  # a raw newline inside a string is not JSON
        (b'{"s":"x\ty"}', ERROR),
        (b'{"a":15}  \n\n\t\r\n        \n    ', {"a": 15, "s": None}),  # long blank runs on both sides
        (b'\n\n\n\n\n\n\n\n\n\n\n{"a":16}', {"a": 16, "s": None}),
        (b'\r\n{"a":17}\r\n', {"a": 17, "s": None}),
        (b'\xef\xbb\xbf{"a":18}', ERROR),  # a BOM is not JSON (Python's json refuses it too)
        (b'{"a":19}\x00', ERROR),
        (b'{"a":20}\x0b', ERROR),
        (b'{"a":21} x', ERROR),
        (b'{"a":22},', ERROR),
        (b'{"a":23}}', ERROR),
        (b'{{"a":24}', ERROR),
        (b'{"a":25, "s":"}\\n{"}', {"a": 25, "s": "}\n{"}),  # braces and an escaped newline inside a string
        (None, None),
        (b'{"a":26}', {"a": 26, "s": None}),
        (b"{}", {"a": None, "s": None}),
        (b'{"s":"\xff"}', ERROR),
        (b'{"x":"\xc0\xaf", "a":27}', ERROR),  # invalid UTF-8 in a field the schema ignores is still an error
        (b'{"a":28}', {"a": 28, "s": None}),
    ]
    values = [v for v, _ in cases]
    out = check(values, schema)
    rows = out.table().to_pylist()
    for i, (v, want) in enumerate(cases):
        if want == ERROR:
            assert i in out.error_rows, v
        else:
            assert rows[i] == (want or {"a": None, "s": None}), v
    assert len(out.error_rows) == sum(w == ERROR for _, w in cases)


def test_a_value_that_does_not_start_with_a_brace_never_starts_a_buffer():
    """pyarrow 26 crashes the process (SIGSEGV) when the first value of a buffer is a top-level null: a value
    that ends with '}' but does not start with '{' must not reach the bulk parse (if this test crashes, it has)."""
    schema = parse_value_schema("a INT")
    for first in (b'null {"a":1}', b' null\n{"a":1}', b'[] {"a":1}', b"1 {}", b'"x" {}'):
        out = check([first, b'{"a":2}', first], schema)
        assert list(out.error_rows) == [0, 2]


def test_bad_records_of_every_kind_at_every_place():
    """Every bad record alone, first, last, between good ones and next to each other; each good one still parses."""
    schema = parse_value_schema("a INT NOT NULL, t TIMESTAMP")
    bad = [b'{"a":1}{"a":2}', b'{"a":1.5}', b'{"a":"x"}', b'{"a":', b"", b"[]", b'{"a":3000000000}', b"{}"]
    bad += [
        b'{"a":1,"a":2}',
        b'{"a":1,"t":"soon"}',
        b'{"a":1e400}',
        b'{"a":1} {"a":2}',
        b'{"a":10000000000000000000000}',
    ]
    good = [b'{"a":%d,"t":"2024-01-15T10:00:00Z"}' % i for i in range(6)]
    for b in bad:
        for layout in ([b], [b] + good, good + [b], good[:3] + [b] + good[3:], good[:2] + [b, b, b] + good[2:]):
            check(layout, schema)
    rng = random.Random(7)
    mixed = [rng.choice(bad) if rng.random() < 0.3 else rng.choice(good) for _ in range(400)]
    check(mixed, schema)


def test_tombstones_are_rows_of_nulls_not_errors():
    schema = parse_value_schema("a INT NOT NULL, b STRING")
    out = check([None, b'{"a":1}', None, None], schema)
    assert len(out.error_rows) == 0
    assert out.table().to_pylist()[0] == {"a": None, "b": None}
    out = check([None] * 5, schema)
    assert len(out.error_rows) == 0 and out.columns[0].null_count == 5


def test_inputs_empty_large_sliced_and_chunked():
    schema = parse_value_schema("a INT, s ARRAY<STRING>")
    out = parse_json_values(pa.array([], pa.binary()), schema)
    assert [len(c) for c in out.columns] == [0, 0] and len(out.error_rows) == 0
    values = [b'{"a":1}', b"x", None, b'{"a":2,"s":["p"]}', b'{"a":"3"}', b'{"a":4}']
    check(values, schema, type=pa.large_binary())
    whole = pa.array([b"junk"] * 3 + values + [b"junk"], pa.binary())
    sliced = parse_json_values(whole.slice(3, len(values)), schema)
    direct = parse_json_values(pa.array(values, pa.binary()), schema)
    assert sliced.table().equals(direct.table()) and list(sliced.error_rows) == list(direct.error_rows)
    chunked = parse_json_values(pa.chunked_array([values[:2], values[2:]], pa.binary()), schema)
    assert chunked.table().equals(direct.table()) and chunked.error_messages == direct.error_messages
    with pytest.raises(TypeError, match="binary"):
        parse_json_values(pa.array(["{}"]), schema)


def test_an_input_over_the_chunk_size_is_parsed_in_parts_with_the_same_result(monkeypatch):
    schema = parse_value_schema(WIDE)
    rng = random.Random(3)
    values = [_render(_good_record(rng, schema), rng) if rng.random() < 0.9 else b'{"i32":"x"}' for _ in range(300)]
    whole = parse_json_values(pa.array(values, pa.binary()), schema)
    monkeypatch.setattr(jv, "CHUNK_BYTES", 997)
    parts = parse_json_values(pa.array(values, pa.binary()), schema)
    assert same(parts.table().to_pylist(), whole.table().to_pylist())  # (NaN != NaN for Table.equals)
    assert parts.table().schema == whole.table().schema
    assert list(parts.error_rows) == list(whole.error_rows) and parts.error_messages == whole.error_messages


# ---------------------------------------------------------------- the rules, type by type

_T = [
    ("BOOLEAN", "true", True),
    ("BOOLEAN", "false", False),
    ("BOOLEAN", '"true"', ERROR),
    ("BOOLEAN", "1", ERROR),
    ("TINYINT", "-128", -128),
    ("TINYINT", "127", 127),
    ("TINYINT", "128", ERROR),
    ("TINYINT", "-129", ERROR),
    ("SMALLINT", "32767", 32767),
    ("SMALLINT", "-32769", ERROR),
    ("INT", "2147483647", 2147483647),
    ("INT", "2147483648", ERROR),
    ("INT", "-0", 0),
    ("INT", "1.0", ERROR),
    ("INT", "1e2", ERROR),
    ("INT", "1.5", ERROR),
    ("INT", '"5"', ERROR),
    ("INT", "NaN", ERROR),
    ("BIGINT", "-9223372036854775808", -(2**63)),
    ("BIGINT", "9223372036854775807", 2**63 - 1),
    ("BIGINT", "9223372036854775808", ERROR),
    ("FLOAT", "0.1", float(np.float32(0.1))),
    ("FLOAT", "16777217", 16777216.0),
    ("FLOAT", "1.00000005960464477550", 1.0000001192092896),  # rounded once, from the text (as Spark)
    ("FLOAT", "1e300", math.inf),
    ("DOUBLE", "1e300", 1e300),
    ("DOUBLE", "1e400", ERROR),  # RapidJSON: an exponent, less the digits after the point, above 308
    ("DOUBLE", "1.5e309", math.inf),  # (Spark: Infinity for both)
    ("DOUBLE", "1" + "0" * 400, math.inf),
    ("DOUBLE", "NaN", math.nan),
    ("DOUBLE", "-Infinity", -math.inf),
    ("DOUBLE", "Inf", math.inf),  # RapidJSON's spelling too (Spark's Jackson does not take it)
    ("DOUBLE", "-NaN", math.nan),
    ("DOUBLE", '"NaN"', ERROR),
    ("DOUBLE", "123456789012345678901234567890", 1.2345678901234568e29),
    ("DECIMAL(5,2)", "1.25", Decimal("1.25")),
    ("DECIMAL(5,2)", "1.255", Decimal("1.26")),  # half away from zero, as Spark
    ("DECIMAL(5,2)", "-1.255", Decimal("-1.26")),
    ("DECIMAL(5,2)", "999.994", Decimal("999.99")),
    ("DECIMAL(5,2)", "999.995", ERROR),  # rounds to 1000.00: too many digits
    ("DECIMAL(5,2)", "1234.5", ERROR),
    ("DECIMAL(5,2)", '"1.25"', Decimal("1.25")),
    ("DECIMAL(5,2)", '"+.5"', Decimal("0.50")),
    ("DECIMAL(5,2)", '"1e2"', Decimal("100.00")),
    ("DECIMAL(5,2)", '" 1.25"', ERROR),
    ("DECIMAL(5,2)", '"1,000"', ERROR),
    ("DECIMAL(5,2)", "true", ERROR),
    ("DECIMAL(38,0)", "99999999999999999999999999999999999999", Decimal("9" * 38)),
    ("DECIMAL(38,0)", "1e38", ERROR),
    ("DECIMAL(38,0)", "1.5", Decimal(2)),
    ("DECIMAL(38,0)", '"-99999999999999999999999999999999999999.4"', Decimal("-" + "9" * 38)),
    ("DECIMAL(38,0)", '"1e80"', ERROR),
    ("DECIMAL(38,2)", "1e45", ERROR),  # (pyarrow alone reads some such values as wrong ones: see _huge_decimals)
    ("DECIMAL(38,2)", "1" + "0" * 45, ERROR),
    ("DECIMAL(10,2)", "1e30", ERROR),
    ("DECIMAL(38,0)", "9e52", ERROR),  # pyarrow alone: 1885647734150083024582422851188720854.6..., in range
    ("DECIMAL(38,0)", '"12345e42"', ERROR),
    ("DECIMAL(10,2)", "0." + "0" * 37 + "1", ERROR),  # beyond the 37 digits of room to round
    ("DECIMAL(10,2)", "0." + "0" * 36 + "5", Decimal("0.00")),
    ("DECIMAL(38,38)", "0.5", Decimal("0.5")),
    ("DECIMAL(38,38)", "1", ERROR),
    ("STRING", '"h\\u00e9\\ud83d\\ude00\\n"', "hé😀\n"),
    ("STRING", '"\\ud800"', ERROR),  # a lone surrogate
    ("STRING", "5", ERROR),  # Spark's from_json would give "5"
    ("STRING", "{}", ERROR),
    ("VARCHAR(2)", '"longer than two"', "longer than two"),
    ("DATE", '"2024-02-29"', dt.date(2024, 2, 29)),
    ("DATE", '"2023-02-29"', ERROR),
    ("DATE", '"2024-1-5"', ERROR),
    ("DATE", '"2024-01-15T00:00:00"', ERROR),
    ("DATE", "19000", ERROR),
    ("TIMESTAMP", '"2024-01-15T10:11:12Z"', dt.datetime(2024, 1, 15, 10, 11, 12, tzinfo=dt.timezone.utc)),
    ("TIMESTAMP", '"2024-01-15 10:11:12.5"', dt.datetime(2024, 1, 15, 10, 11, 12, 500000, tzinfo=dt.timezone.utc)),
    ("TIMESTAMP", '"2024-01-15T10:11:12+02:00"', dt.datetime(2024, 1, 15, 8, 11, 12, tzinfo=dt.timezone.utc)),
    ("TIMESTAMP", '"2024-01-15T10:11:12-0130"', dt.datetime(2024, 1, 15, 11, 41, 12, tzinfo=dt.timezone.utc)),
    (
        "TIMESTAMP",
        '"2024-01-15T10:11:12.123456789Z"',
        dt.datetime(2024, 1, 15, 10, 11, 12, 123456, tzinfo=dt.timezone.utc),
    ),
    ("TIMESTAMP", '"2024-01-15"', dt.datetime(2024, 1, 15, tzinfo=dt.timezone.utc)),
    ("TIMESTAMP", '"2024-01-15T10"', dt.datetime(2024, 1, 15, 10, tzinfo=dt.timezone.utc)),
    ("TIMESTAMP", '"2024-01-15t10:11:12"', ERROR),
    ("TIMESTAMP", '"2024-02-30T00:00:00"', ERROR),
    ("TIMESTAMP", '"2024-01-15T24:00:00"', ERROR),
    ("TIMESTAMP", '"yesterday"', ERROR),
    ("TIMESTAMP", "1700000000", ERROR),  # Spark's from_json takes epoch seconds
    ("TIMESTAMP_NTZ", '"2024-01-15T10:11:12.000001"', dt.datetime(2024, 1, 15, 10, 11, 12, 1)),
    ("TIMESTAMP_NTZ", '"2024-01-15T10:11:12Z"', ERROR),
    ("TIMESTAMP_NTZ", '"2024-01-15T10:11:12+02:00"', ERROR),
    ("ARRAY<TINYINT>", "[1, null, -3]", [1, None, -3]),
    ("ARRAY<TINYINT>", "[1, 300]", ERROR),
    ("ARRAY<TINYINT>", "[]", []),
    ("ARRAY<TINYINT>", "1", ERROR),
    ("ARRAY<ARRAY<DATE>>", '[["2024-01-01"], null, []]', [[dt.date(2024, 1, 1)], None, []]),
    ("ARRAY<ARRAY<DATE>>", '[["2024-01-01", "x"]]', ERROR),
    ("STRUCT<x: INT NOT NULL, y: STRING>", '{"x": 1, "zz": [1, {"x": "ignored"}]}', {"x": 1, "y": None}),
    ("STRUCT<x: INT NOT NULL, y: STRING>", '{"y": "no x"}', ERROR),
    ("STRUCT<x: INT NOT NULL, y: STRING>", '{"x": 1, "x": 2}', ERROR),
    ("STRUCT<x: INT NOT NULL, y: STRING>", '{"X": 1}', ERROR),  # names match case-sensitively
    ("STRUCT<x: INT NOT NULL, y: STRING>", "[]", ERROR),
]


@pytest.mark.parametrize("type_, text, want", _T)
def test_each_type_takes_its_json_values(type_, text, want):
    schema = parse_value_schema(f"v {type_}")
    values = [b'{"v": %s}' % text.encode(), b'{"other": %s, "v": null}' % text.encode(), b"{}"]
    if text in ("Inf", "-NaN"):  # RapidJSON's spellings, which Python's json (the model) refuses
        out = parse_json_values(pa.array(values, pa.binary()), schema)
        assert len(out.error_rows) == 0
    else:
        out = check(values, schema)
    got = out.table().to_pylist()
    if want == ERROR:  # (row 1, the value under a key the schema ignores, is checked by the model)
        assert 0 in out.error_rows
    else:
        assert 0 not in out.error_rows and same(got[0]["v"], want)
    assert got[1]["v"] is None and got[2]["v"] is None


def test_messages_say_what_and_where():
    schema = parse_value_schema(
        "id INT NOT NULL, small TINYINT, at TIMESTAMP_NTZ, day DATE, money DECIMAL(4,2), s STRUCT<x: INT NOT NULL>"
    )
    values = [
        b'{"id": 1, "small": 300}',
        b'{"small": 1}',
        b'{"id": 1, "at": "2024-01-15T10:00:00Z"}',
        b'{"id": 1, "day": "2024-13-01"}',
        b'{"id": 1, "money": 123.4}',
        b'{"id": 1, "s": {}}',
        b'{"id": "one"}',
        b'{"id": 1, "id": 2}',
        b'{"id": 1.5}',
        b"",
        b"[1]",
        b'{"id": 1}{"id": 2}',
        b'{"id": 1, "x": "\xff"}',
        b'{"id": 1, "s": {"x": "' + b"y" * 1000 + b'"}}',
    ]
    out = check(values, schema)
    msgs = dict(zip(out.error_rows.tolist(), out.error_messages, strict=True))
    assert "field small" in msgs[0] and "300" in msgs[0] and "TINYINT" in msgs[0]
    assert "field id" in msgs[1] and "NOT NULL" in msgs[1]
    assert "field at" in msgs[2] and "zone" in msgs[2]
    assert "field day" in msgs[3] and "2024-13-01" in msgs[3]
    assert "field money" in msgs[4] and "123.4" in msgs[4]
    assert "field s.x" in msgs[5] and "NOT NULL" in msgs[5]
    assert "field id" in msgs[6] and "number" in msgs[6] and "string" in msgs[6]
    assert "field id" in msgs[7] and "twice" in msgs[7]
    assert "1.5" in msgs[8] and "integer" in msgs[8]
    assert "empty" in msgs[9]
    assert "not a JSON object" in msgs[10]
    assert "2 JSON values" in msgs[11]
    assert "UTF-8" in msgs[12]
    assert len(msgs[13]) <= MAX_MESSAGE_CHARS and "field s.x" in msgs[13]


# ---------------------------------------------------------------- how bad records are found


def _count_parses(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = jv._read_json

    def counted(buffer, schema):
        calls.append(buffer.size)
        return real(buffer, schema)

    monkeypatch.setattr(jv, "_read_json", counted)
    return calls


@pytest.mark.parametrize(
    "bad, most",
    [
        (b'{"a":"x"}', 25),  # pyarrow names the row: one parse per bad record, and the check
        (b'{"a":', 25),
        (b'{"a":1.5}', 4),  # no row named: one parse with markers finds all of them
        (b'{"a":1}{"a":2}', 4),
    ],
)
def test_good_records_parse_in_bulk_and_each_bad_one_costs_a_parse_or_less(monkeypatch, bad, most):
    schema = parse_value_schema("a BIGINT, b STRING")
    values = [b'{"a":%d,"b":"x"}' % i for i in range(5000)]
    for i in range(100, 5000, 250):  # 20 bad records
        values[i] = bad
    calls = _count_parses(monkeypatch)
    out = check(values, schema)
    assert len(out.error_rows) == 20
    assert len(calls) <= most, len(calls)


def test_the_checked_paths_agree_with_the_model_when_forced(monkeypatch):
    """A record with two values before a named row misplaces the quick scan's mark: the check catches it and
    the careful scan is right; with diagnose() disabled and nesting capped, bisection alone is right too."""
    schema = parse_value_schema("a INT NOT NULL, t DATE")
    rng = random.Random(11)
    kinds = [b'{"a":1}{"a":2}', b'{"a":"x"}', b'{"a":1.5}', b'{"a":', b'{"a":1,"t":"x"}', b'{"a":1} null']
    values = [rng.choice(kinds) if rng.random() < 0.05 else b'{"a":%d}' % i for i in range(3000)]
    values[10:13] = [b'{"a":1}{"a":2}', b'{"a":11}', b'{"a":"x"}']
    check(values, schema)
    monkeypatch.setattr(jv._Reader, "diagnose", lambda self, lo, hi: False)
    check(values, schema)
    monkeypatch.setattr(jv, "_MAX_DEPTH", 0)
    check(values, schema)
    monkeypatch.setattr(jv._Reader, "scan", lambda self, lo, hi, **_: self.bisect(lo, hi))
    check(values, schema)


# ---------------------------------------------------------------- random records against the model

_BLANKS = st.sampled_from(["", "", "", " ", "\n", "\t", "\r\n", "  \n  "])


def _json_text(v, rng: random.Random) -> str:
    """`v` written as JSON (Obj, list, str, Num, bool, None) with random blanks and escapes."""

    def blank() -> str:
        return rng.choice(["", "", "", " ", "\n", "\t", "\r\n", "  \n  "])

    if isinstance(v, Obj):
        inner = ",".join(f"{blank()}{_json_text(k, rng)}{blank()}:{blank()}{_json_text(x, rng)}{blank()}" for k, x in v)
        return "{" + inner + blank() + "}"
    if isinstance(v, list):
        return "[" + ",".join(blank() + _json_text(x, rng) + blank() for x in v) + "]"
    if isinstance(v, str):
        lone = any(0xD800 <= ord(c) < 0xE000 for c in v)  # a lone surrogate can only be written escaped
        return json.dumps(v, ensure_ascii=lone or rng.random() < 0.3)
    if isinstance(v, Num):
        return v.text
    return json.dumps(v)


def _render(obj: Obj, rng: random.Random) -> bytes:
    return (rng.choice(["", "", " ", "\n"]) + _json_text(obj, rng) + rng.choice(["", "", " ", "\r\n"])).encode()


def _junk(rng: random.Random, depth: int = 0):
    """Any JSON value, for keys the schema does not name."""
    kinds = ["num", "str", "bool", "null"] + (["obj", "arr"] if depth < 2 else [])
    k = rng.choice(kinds)
    if k == "num":
        return Num(rng.choice(["0", "-12", "3.5e-3", "1E10", "NaN", "Infinity", "123456789012345678901234567890"]))
    if k == "str":
        return rng.choice(["", "}{", '"quoted"', "new\nline", "ü", "\u2028", "\\"])
    if k == "bool":
        return rng.random() < 0.5
    if k == "null":
        return None
    if k == "obj":
        return Obj((rng.choice(["x", "y", "i32", ""]), _junk(rng, depth + 1)) for _ in range(rng.randint(0, 3)))
    return [_junk(rng, depth + 1) for _ in range(rng.randint(0, 3))]


def _good(t: ValueType, rng: random.Random):
    """A JSON value (as the model reads it) that t takes."""
    if isinstance(t, PrimitiveType):
        name = t.name
        if name == "boolean":
            return rng.random() < 0.5
        if name in _RANGES:
            r = _RANGES[name]
            return Num(str(rng.choice([-r, r - 1, 0, -1, rng.randrange(-r, r)])))
        if name == "float":
            x = float(np.float32(rng.uniform(-1e6, 1e6)))
            return Num(rng.choice([repr(x), str(rng.randint(-(2**24), 2**24)), "NaN", "-Infinity", "1e-50"]))
        if name == "double":
            return Num(rng.choice([repr(rng.uniform(-1e300, 1e300)), repr(rng.random()), "-0.0", "Infinity", "5"]))
        if name == "string":
            return rng.choice(["", "plain", "üñí©ødé 😀", 'quote"and\\back', "ctl\x01\x1f", "}{\n[]"])
        if name == "date":
            return dt.date(rng.randint(1, 9999), rng.randint(1, 12), rng.randint(1, 28)).isoformat()
        return _good_timestamp(rng, ntz=name == "timestamp_ntz")
    if isinstance(t, CharType):
        return rng.choice(["", "abc", "longer than the length"])
    if isinstance(t, DecimalType):
        whole = rng.randrange(10 ** (t.precision - t.scale))
        frac = "".join(rng.choice("0123456789") for _ in range(rng.randint(0, t.scale + 2)))
        text = f"{rng.choice(['', '-'])}{whole}" + (f".{frac}" if frac else "")
        rounded = Decimal(text).quantize(Decimal(1).scaleb(-t.scale), ROUND_HALF_UP, _EXACT)
        if rounded.copy_abs() >= 10 ** (t.precision - t.scale):
            text = "0"
        return text if rng.random() < 0.2 else Num(text)
    if isinstance(t, ArrayType):
        return [None if rng.random() < 0.1 else _good(t.element, rng) for _ in range(rng.randint(0, 3))]
    return _good_record(rng, ValueSchema(t.fields))


def _good_timestamp(rng: random.Random, *, ntz: bool) -> str:
    day = dt.date(rng.randint(1900, 2200), rng.randint(1, 12), rng.randint(1, 28)).isoformat()
    sep = rng.choice(["T", " "])
    time = rng.choice(["", f"{sep}{rng.randint(0, 23):02d}", f"{sep}{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"])
    if rng.random() < 0.6:
        time = f"{sep}{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
        if rng.random() < 0.5:
            time += "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 9)))
    if time and not ntz and rng.random() < 0.7:
        time += rng.choice(["Z", "+00:00", "-05:30", "+0545", "+01"])
    return day + time


def _good_record(rng: random.Random, schema: ValueSchema) -> Obj:
    pairs = []
    for f in schema.fields:
        r = rng.random()
        if not f.nullable or r < 0.7:
            pairs.append((f.name, _good(f.type, rng)))
        elif r < 0.85:
            pairs.append((f.name, None))
    for _ in range(rng.randint(0, 2)):
        pairs.append((rng.choice(["extra", "I32", "x y", "é"]), _junk(rng)))
    rng.shuffle(pairs)
    return Obj(pairs)


_WRONG = [
    Num("1"),
    Num("1.5"),
    Num("1e2"),
    Num("-0"),
    "text",
    "2024-13-45",
    True,
    [],
    [Num("1")],
    Obj(),
    Obj([("z", None)]),
]
_EDGES = [Num("128"), Num("-32769"), Num("2147483648"), Num("9223372036854775808"), Num("1e400"), "2024-02-30"]
_EDGES += ["2024-01-15T10:00:00Z", "2024-01-15T25:00:00", Num("1234567.5"), "\ud800", "1.0005"]


def _bad(rng: random.Random, schema: ValueSchema) -> bytes:
    """Mostly not a good record: one of many mutations of a good one (the model decides what it is)."""
    obj = _good_record(rng, schema)
    k = rng.randrange(12)
    if k < 4 and obj:  # a wrong or edge value, possibly nested
        i = rng.randrange(len(obj))
        value = rng.choice(_WRONG + _EDGES)
        if isinstance(obj[i][1], Obj) and obj[i][1] and rng.random() < 0.5:
            inner = obj[i][1]
            j = rng.randrange(len(inner))
            inner[j] = (inner[j][0], value)
        else:
            obj[i] = (obj[i][0], value)
        return _render(obj, rng)
    if k == 4:  # a NOT NULL field gone or null, a schema key twice
        names = [f.name for f in schema.fields]
        choice = rng.random()
        if choice < 0.5:
            obj = Obj((n, v) for n, v in obj if n != "i32")
        else:
            obj.append((rng.choice(names), None if choice < 0.75 else _good(schema.fields[0].type, rng)))
        return _render(obj, rng)
    text = _render(obj, rng)
    if k == 5:  # cut short
        return text[: rng.randrange(len(text))]
    if k == 6:  # two values, or garbage after one
        return text + rng.choice([b"", b" ", b"\n"]) + rng.choice([text, b"null", b"1", b"x", b"}", b","])
    if k == 7:  # not an object
        return rng.choice([b"", b"  ", b"\n", b"null", b"[]", b"[" + text + b"]", b'"s"', b"0", b"true", b"x"])
    if k == 8:  # bytes that are not UTF-8, a raw control character in a string, a BOM
        at = text.find(b'"', 1)
        at = at if at > 0 else len(text) // 2
        return text[:at] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b'"\n"', b"\xef\xbb\xbf"]) + text[at:]
    if k == 9:  # a byte dropped or doubled
        at = rng.randrange(len(text))
        return text[:at] + text[at + 1 :] if rng.random() < 0.5 else text[:at] + text[at : at + 1] * 2 + text[at + 1 :]
    return text  # good after all


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 80), bad_share=st.sampled_from([0.0, 0.02, 0.2, 0.6, 1.0]))
def test_random_mixes_of_good_and_bad_records_match_the_model(seed, n, bad_share):
    schema = parse_value_schema(WIDE)
    rng = random.Random(seed)
    values: list[bytes | None] = []
    for _ in range(n):
        r = rng.random()
        if r < 0.05:
            values.append(None)
        elif r < 0.05 + bad_share:
            values.append(_bad(rng, schema))
        else:
            values.append(_render(_good_record(rng, schema), rng))
    check(values, schema)


def test_a_large_random_batch_matches_the_model():
    schema = parse_value_schema(WIDE)
    rng = random.Random(20240115)
    values = [
        _bad(rng, schema) if rng.random() < 0.03 else _render(_good_record(rng, schema), rng) for _ in range(4000)
    ]
    out = check(values, schema)
    assert 0 < len(out.error_rows) < 400


def test_the_model_is_not_trivial():
    """The model must tell good from bad the way the docstring says, or the random tests prove little."""
    schema = parse_value_schema("a INT NOT NULL, d DECIMAL(5,2), t TIMESTAMP")
    assert model(b'{"a": 1, "d": "1.255", "t": "2024-01-15T10:00:00+01:00"}', schema) == {
        "a": 1,
        "d": Decimal("1.26"),
        "t": dt.datetime(2024, 1, 15, 9, tzinfo=dt.timezone.utc),
    }
    for bad in [b'{"a": 1.0}', b'{"d": 1}', b'{"a": 1, "a": 1}', b'{"a": 1} {}', b'{"a": 1, "x": "\\udc00"}']:
        assert model(bad, schema) == ERROR, bad
    assert model(None, schema) is None
    rng = random.Random(5)
    outcomes = [model(_bad(rng, parse_value_schema(WIDE)), parse_value_schema(WIDE)) == ERROR for _ in range(300)]
    assert 0.6 < sum(outcomes) / len(outcomes) < 1.0


# ---------------------------------------------------------------- Spark as the reference


def _spark_arrow(t) -> pa.DataType:
    """A pyspark type as an Arrow type, by value_schema's rule."""
    from pyspark.sql import types as T

    simple = {
        T.BooleanType: pa.bool_(),
        T.ByteType: pa.int32(),
        T.ShortType: pa.int32(),
        T.IntegerType: pa.int32(),
        T.LongType: pa.int64(),
        T.FloatType: pa.float32(),
        T.DoubleType: pa.float64(),
        T.StringType: pa.string(),
        T.CharType: pa.string(),
        T.VarcharType: pa.string(),
        T.DateType: pa.date32(),
        T.TimestampType: pa.timestamp("us", tz="UTC"),
        T.TimestampNTZType: pa.timestamp("us"),
    }
    if type(t) in simple:
        return simple[type(t)]
    if isinstance(t, T.DecimalType):
        return pa.decimal128(t.precision, t.scale)
    if isinstance(t, T.ArrayType):
        return pa.list_(_spark_arrow(t.elementType))
    assert isinstance(t, T.StructType), t
    return pa.struct([_spark_field(f) for f in t.fields])


def _spark_field(f, *, top: bool = False) -> pa.Field:
    comment = f.metadata.get("comment")
    return pa.field(
        f.name,
        _spark_arrow(f.dataType),
        nullable=True if top else f.nullable,
        metadata={"comment": comment} if comment is not None else None,
    )


def _spark_ddl(spark, ddl: str):
    from pyspark.sql.types import StructType as SparkStruct

    return SparkStruct.fromJson(json.loads(spark._jvm.org.apache.spark.sql.types.StructType.fromDDL(ddl).json()))


SPARK_DDLS = [
    WIDE,
    "a BYTE, b SHORT, c INTEGER, d LONG, e REAL, f DEC, g NUMERIC(7), h CHARACTER(3), i TIMESTAMP_LTZ",
    "`a``b` INT NOT NULL COMMENT 'it\\'s \\101 \\% \\u0041', `x.y` STRING COMMENT \"dq\", c INT COMMENT R'raw\\n'",
    "s STRUCT<a: INT NOT NULL COMMENT 'x', b STRUCT<c ARRAY<DECIMAL(38,38)>>>, l ARRAY<STRUCT<`é`: DATE>>",
    "  a   INT -- comment\n , /* block /* nested */ */ b\u00a0STRING  ",
    "not INT, comment STRING COMMENT 'c', struct STRUCT<struct: INT>, 1a INT, _ BOOLEAN",
]
SPARK_REFUSES = ["a: INT", "a INT,", "123 INT", "a INT NOT NULL NOT NULL", "a ARRAY<INT NOT NULL>", "a VARCHAR"]
SPARK_REFUSES += ["a DECIMAL(39)", "a DECIMAL(5,6)", "a INT COMMENT 'x' NOT NULL", "a FOO", "é INT", "a-b INT", ""]
# Spark takes these; we refuse them on purpose (value_schema.py's docstring says why)
WE_REFUSE = ["a BINARY", "a MAP<STRING,INT>", "a INTERVAL DAY", "a VARIANT", "a VOID", "a TIME", "a STRUCT<>"]
WE_REFUSE += ["a STRING COLLATE UTF8_LCASE", "a INT, A INT", "s STRUCT<b INT, b INT>", "`` INT", "a DECIMAL(0,0)"]
WE_REFUSE += ["key INT", "Timestamp STRING"]

SPARK_SCHEMA = (
    "b BOOLEAN, i8 TINYINT, i16 SMALLINT, i32 INT, i64 BIGINT, f FLOAT, d DOUBLE, dec DECIMAL(9,3), s STRING, "
    "day DATE, ts TIMESTAMP, ntz TIMESTAMP_NTZ, arr ARRAY<INT>, st STRUCT<x: SMALLINT, y: ARRAY<STRUCT<z: DATE>>>"
)
SPARK_GOOD = [
    '{"b": true, "i8": -128, "i16": 32767, "i32": -2147483648, "i64": 9223372036854775807, "f": 1.5, "d": 0.1}',
    '{"f": 1.00000005960464477550, "d": 1e300, "dec": 1.255, "s": "h\\u00e9\\ud83d\\ude00\\n\\"", "day": "2024-02-29"}',
    '{"dec": "-123.4567", "ts": "2024-01-15T10:11:12Z", "ntz": "2024-01-15 10:11:12.123456", "arr": [1, null, 3]}',
    '{"ts": "2024-01-15T10:11:12.5+02:00", "ntz": "2024-01-15T10:11:12", "st": {"x": 7, "y": [{"z": "0001-01-01"}]}}',
    ' {"ts": "2024-01-15T10:11:12.123456789Z", "unknown": {"nested": [1, {}]}, "st": {"y": null}}\n',
    '{"d": NaN, "f": -Infinity, "arr": [], "st": {}}',
    '{"i64": -0, "d": -0.0, "ts": "2024-01-15 10:11:12", "dec": 999999.9994}',
    "{}",
]
# Where we differ from Spark on purpose: a record Spark's from_json (PERMISSIVE) reads partly, or reads by laxer
# rules, is an error row here, so that the table never holds a guess and the errors table says why.
SPARK_DIFFERS = [
    '{"s": 5}',  # Spark: the number's text "5" (any JSON value becomes a string); here: a wrong type
    '{"i32": "4"}',  # Spark: i32 null, the row kept; here: an error (also for 4.0)
    '{"i32": 4.0}',
    '{"i8": 300}',  # Spark: null, the row kept
    '{"dec": 1234567.5}',  # Spark: null (too many digits), the row kept
    '{"s": "x", "s": "y"}',  # Spark: the last one, "y"
    '{"s": "x"}{"s": "y"}',  # Spark: the first object, the rest ignored
    '{"s": "x"} junk',
    '[{"s": "in an array"}]',  # Spark: a row of nulls
    "null",  # Spark: a row of nulls
    '{"s": "\\ud800"}',  # Spark: "?" for the lone surrogate
    '{"day": "2024-1-5"}',  # Spark: 2024-01-05 (its lenient fallback also takes "2024" and a full timestamp)
    '{"day": "2024-01-15T10:00:00"}',
    '{"ts": 1700000000}',  # Spark: epoch seconds
    '{"ntz": "2024-01-15T10:11:12+02:00"}',  # Spark: null, the row kept
    '{"d": "NaN"}',  # Spark: NaN from the string
    '{"arr": [1, "x"]}',  # Spark: a null array, the row kept
]


@pytest.mark.spark
def test_our_ddl_parse_gives_sparks_types(spark_session):
    """Spark's own StructType.fromDDL of the same strings, mapped to Arrow by the same rule: the same names,
    types, nullability (nested; top-level Arrow fields are always nullable) and comments."""
    for ddl in SPARK_DDLS:
        spark = _spark_ddl(spark_session, ddl)
        want = pa.schema([_spark_field(f, top=True) for f in spark.fields])
        ours = parse_value_schema(ddl)
        assert ours.arrow_schema().equals(want, check_metadata=True), ddl
        assert [f.nullable for f in ours.fields] == [f.nullable for f in spark.fields], ddl
    for ddl in SPARK_REFUSES:
        with pytest.raises(Exception):  # noqa: B017 (py4j's error type)
            _spark_ddl(spark_session, ddl)
        with pytest.raises(ValueError, match="table.value.schema"):
            parse_value_schema(ddl)
    for ddl in WE_REFUSE:
        _spark_ddl(spark_session, ddl)
        with pytest.raises(ValueError, match="table.value.schema"):
            parse_value_schema(ddl)


@pytest.mark.spark
def test_good_values_parse_as_sparks_from_json_and_the_differences_are_on_purpose(spark_session):
    """On good values our columns equal from_json(value, ddl)'s (session time zone UTC; Spark's TINYINT and
    SMALLINT, int8 and int16 in Arrow, cast to int32). On the SPARK_DIFFERS values Spark reads a row where we
    have an error row: see the comments there."""
    from pyspark.sql import functions as F

    schema = parse_value_schema(SPARK_SCHEMA)
    corpus = SPARK_GOOD + SPARK_DIFFERS
    frame = spark_session.createDataFrame([(i, v) for i, v in enumerate(corpus)], "i INT, value STRING")
    spark = frame.select("i", F.from_json("value", SPARK_SCHEMA).alias("j")).orderBy("i").toArrow()
    spark_rows = [None if row is None else _cast_spark_row(row, schema) for row in spark.column("j").to_pylist()]
    ours = parse_json_values(pa.array([v.encode() for v in corpus], pa.binary()), schema)
    rows = ours.table().to_pylist()
    errors = set(ours.error_rows.tolist())
    for i, value in enumerate(SPARK_GOOD):
        assert i not in errors, (value, ours.error_messages)
        assert same(rows[i], spark_rows[i]), (value, rows[i], spark_rows[i])
    for i, value in enumerate(SPARK_DIFFERS, start=len(SPARK_GOOD)):
        assert i in errors, value
        assert spark_rows[i] is not None, value  # Spark reads a row


def _cast_spark_row(row: dict, schema: ValueSchema) -> dict:
    """Spark's Arrow row (int8/int16 for TINYINT/SMALLINT, naive UTC timestamps) as ours."""
    out = {}
    for f in schema.fields:
        v = row[f.name]
        out[f.name] = _cast_spark_value(v, f.type)
    return out


def _cast_spark_value(v, t: ValueType):
    if v is None:
        return None
    if isinstance(t, PrimitiveType) and t.name == "timestamp" and v.tzinfo is None:
        return v.replace(tzinfo=dt.timezone.utc)
    if isinstance(t, PrimitiveType) and t.name == "timestamp":
        return v.astimezone(dt.timezone.utc)
    if isinstance(t, ArrayType):
        return [_cast_spark_value(x, t.element) for x in v]
    if isinstance(t, StructType):
        return {f.name: _cast_spark_value(v[f.name], f.type) for f in t.fields}
    if isinstance(t, DecimalType):
        return Decimal(v)
    return v
