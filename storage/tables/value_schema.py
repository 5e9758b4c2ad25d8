"""Spark DDL strings (`table.value.schema`) parsed into a small type tree and its Arrow types, without Spark.

Format: what Spark's `StructType.fromDDL` accepts (its `singleTableSchema` rule), a comma-separated list of

    name TYPE [NOT NULL] [COMMENT 'text']

A name is unquoted (ASCII letters, digits and '_', not a number) or backtick-quoted (`` `a``b` `` is a`b);
keywords are names too, as in Spark's default (non-ANSI) mode. Type names are case-insensitive. Inside
STRUCT<...> fields take the same form, with an optional ':' after the name. A COMMENT is '...' or "..." with
Spark's backslash escapes, or raw R'...'. SQL comments (`-- ...`, `/* ... */`) count as blanks.

Types, with the Arrow type each becomes (Iceberg has no 8- or 16-bit ints: TINYINT and SMALLINT are int32 here,
and json_values.py checks their values' range):

    BOOLEAN                                 bool
    TINYINT/BYTE, SMALLINT/SHORT, INT/INTEGER  int32
    BIGINT/LONG                             int64
    FLOAT/REAL, DOUBLE                      float32, float64
    DECIMAL/DEC/NUMERIC [(p[,s])]           decimal128(p, s); (10,0) by default, 1 <= p <= 38, 0 <= s <= p
    STRING, VARCHAR(n), CHAR(n)             string (the length is not enforced, as in Spark's from_json)
    DATE                                    date32
    TIMESTAMP, TIMESTAMP_LTZ                timestamp('us', tz='UTC')
    TIMESTAMP_NTZ                           timestamp('us')
    ARRAY<T>                                list<T>
    STRUCT<name[:] T [NOT NULL] [COMMENT '...'], ...>   struct

Refused, though Spark has them, each with the reason in its message: BINARY, MAP, INTERVAL ..., VARIANT,
VOID, TIME, STRING COLLATE, and an empty STRUCT<>.

This module imports pyarrow only when an Arrow type is asked for: log_config checks the config without it.

Invariants of a ValueSchema: at least one field; names non-empty and unique case-insensitively at every level
(Spark resolves names case-insensitively by default, so two such fields would be ambiguous); no top-level name
is one of the Kafka columns the topic's table already has (KAFKA_COLUMNS). Every error is an InvalidConfigError
whose message starts "Invalid value '<ddl>' for configuration table.value.schema: " (the DDL quoted as
log_config quotes a value, cut to MAX_SHOWN_CHARS) and says what and where: a field's path (a.b, a[] for an
ARRAY's element) or a position, counted in characters from 0 as in Spark's messages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from ..errors import InvalidConfigError

if TYPE_CHECKING:
    import pyarrow as pa

CONFIG_KEY = "table.value.schema"
#: The columns a topic's table has before any value field (compared case-insensitively).
KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers")
#: How much of a DDL string an error message quotes.
MAX_SHOWN_CHARS = 100

# ---------------------------------------------------------------- the type tree


def _primitive_arrow(name: str) -> pa.DataType:
    import pyarrow as pa

    return {
        "boolean": pa.bool_(),
        "tinyint": pa.int32(),
        "smallint": pa.int32(),
        "int": pa.int32(),
        "bigint": pa.int64(),
        "float": pa.float32(),
        "double": pa.float64(),
        "string": pa.string(),
        "date": pa.date32(),
        "timestamp": pa.timestamp("us", tz="UTC"),
        "timestamp_ntz": pa.timestamp("us"),
    }[name]


@dataclass(frozen=True)
class PrimitiveType:
    """A type without parameters, named by Spark's simple string (TIMESTAMP_LTZ is "timestamp", BYTE "tinyint")."""

    name: str

    def to_arrow(self) -> pa.DataType:
        return _primitive_arrow(self.name)

    def simple_string(self) -> str:
        return self.name


@dataclass(frozen=True)
class CharType:
    """CHAR(n) or VARCHAR(n): a string whose declared length is kept for reference, not enforced."""

    name: str  # "char" | "varchar"
    length: int

    def to_arrow(self) -> pa.DataType:
        import pyarrow as pa

        return pa.string()

    def simple_string(self) -> str:
        return f"{self.name}({self.length})"


@dataclass(frozen=True)
class DecimalType:
    """DECIMAL(precision, scale), 1 <= precision <= 38, 0 <= scale <= precision."""

    precision: int
    scale: int

    def to_arrow(self) -> pa.DataType:
        import pyarrow as pa

        return pa.decimal128(self.precision, self.scale)

    def simple_string(self) -> str:
        return f"decimal({self.precision},{self.scale})"


@dataclass(frozen=True)
class ArrayType:
    """ARRAY<element>; its elements may be null (Spark's DDL has no NOT NULL for them)."""

    element: ValueType

    def to_arrow(self) -> pa.DataType:
        import pyarrow as pa

        return pa.list_(self.element.to_arrow())

    def simple_string(self) -> str:
        return f"array<{self.element.simple_string()}>"


@dataclass(frozen=True)
class Field:
    """A named field of the schema or of a STRUCT; `comment` is the unescaped COMMENT text."""

    name: str
    type: ValueType
    nullable: bool = True
    comment: str | None = None

    def to_arrow(self, *, nullable: bool | None = None) -> pa.Field:
        import pyarrow as pa

        metadata = {"comment": self.comment} if self.comment is not None else None
        return pa.field(
            self.name, self.type.to_arrow(), nullable=self.nullable if nullable is None else nullable, metadata=metadata
        )


@dataclass(frozen=True)
class StructType:
    """STRUCT<...> of one or more fields."""

    fields: tuple[Field, ...]

    def to_arrow(self) -> pa.DataType:
        import pyarrow as pa

        return pa.struct([f.to_arrow() for f in self.fields])

    def simple_string(self) -> str:
        return "struct<" + ",".join(f"{f.name}:{f.type.simple_string()}" for f in self.fields) + ">"


ValueType = PrimitiveType | CharType | DecimalType | ArrayType | StructType


@dataclass(frozen=True)
class ValueSchema:
    """The parsed `table.value.schema`: its top-level fields in order, and the DDL string they came from."""

    fields: tuple[Field, ...]
    ddl: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def arrow_schema(self) -> pa.Schema:
        """The columns' Arrow schema. Top-level fields are nullable even when NOT NULL: a tombstone's row and an
        error row have no value (nested fields keep their declared nullability)."""
        import pyarrow as pa

        return pa.schema([f.to_arrow(nullable=True) for f in self.fields])

    def simple_string(self) -> str:
        return StructType(self.fields).simple_string()


# ---------------------------------------------------------------- errors


def _shown(ddl: str) -> str:
    return ddl if len(ddl) <= MAX_SHOWN_CHARS else ddl[: MAX_SHOWN_CHARS - 3] + "..."


def schema_error(ddl: str, detail: str) -> InvalidConfigError:
    """The InvalidConfigError for `ddl`, worded as log_config words a bad value."""
    return InvalidConfigError(f"Invalid value {_shown(ddl)!r} for configuration {CONFIG_KEY}: {detail}")


# ---------------------------------------------------------------- tokens

# Spark's lexer: its WS set, SQL comments, backquoted names, string literals, and words (names, keywords, numbers)
_BLANKS = frozenset(" \t\n\f\r\v\u00a0\u1680\u2028\u202f\u205f\u3000" + "".join(map(chr, range(0x2000, 0x200B))))
_WORD_RE = re.compile(r"\w+")
_ASCII_NAME_RE = re.compile(r"[A-Za-z0-9_]+")
# what Spark lexes as a number, not a name: 123, 1e5, 10L, 5S, 2Y, 1D, 1F, 3BD
_NUMBER_RE = re.compile(r"[0-9]+(?:e[0-9]+)?(?:l|s|y|d|f|bd)?", re.IGNORECASE)
_ESCAPES = {"0": "\0", "b": "\b", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a", "%": "\\%", "_": "\\_"}


@dataclass(frozen=True)
class _Token:
    kind: str  # word | name (backquoted) | string | punct | end
    text: str  # the source text, or the value of a name or string
    pos: int

    def shown(self) -> str:
        if self.kind == "end":
            return "the end"
        return repr(self.text if len(self.text) <= 20 else self.text[:17] + "...")


def _unescape(body: str) -> str:
    """Spark's unescapeSQLString for the inside of a quoted literal."""
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\" or i + 1 == len(body):
            out.append(c)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt == "u" and re.fullmatch(r"[0-9A-Fa-f]{4}", body[i + 2 : i + 6]):
            out.append(chr(int(body[i + 2 : i + 6], 16)))
            i += 6
        elif nxt == "U" and re.fullmatch(r"0010[0-9A-Fa-f]{4}|000[0-9A-Fa-f]{5}", body[i + 2 : i + 10]):
            out.append(chr(int(body[i + 2 : i + 10], 16)))
            i += 10
        elif re.fullmatch(r"[0-3][0-7][0-7]", body[i + 1 : i + 4]):
            out.append(chr(int(body[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
    return "".join(out)


def _tokens(ddl: str) -> list[_Token]:
    fail = _Failer(ddl)
    out: list[_Token] = []
    i, n = 0, len(ddl)
    while i < n:
        c = ddl[i]
        if c in _BLANKS:
            i += 1
        elif ddl.startswith("--", i):
            end = ddl.find("\n", i)
            i = n if end < 0 else end + 1
        elif ddl.startswith("/*", i):
            depth, j = 1, i + 2
            while depth and j < n:
                if ddl.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif ddl.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            if depth:
                fail(f"a /* comment at position {i} is not closed")
            i = j
        elif c == "`":
            j, parts = i + 1, []
            while True:
                k = ddl.find("`", j)
                if k < 0:
                    fail(f"a `quoted name` at position {i} is not closed")
                parts.append(ddl[j:k])
                if ddl.startswith("``", k):
                    parts.append("`")
                    j = k + 2
                else:
                    break
            out.append(_Token("name", "".join(parts), i))
            i = k + 1
        elif c in "'\"" or (c in "rR" and ddl[i + 1 : i + 2] in ("'", '"')):
            raw = c in "rR"
            quote = ddl[i + 1] if raw else c
            j = i + (2 if raw else 1)
            while j < n and ddl[j] != quote:
                j += 1 if raw or ddl[j] != "\\" else 2
            if j >= n:
                fail(f"a string at position {i} is not closed")
            body = ddl[i + (2 if raw else 1) : j]
            out.append(_Token("string", body if raw else _unescape(body), i))
            i = j + 1
        elif c in "<>(),:":
            out.append(_Token("punct", c, i))
            i += 1
        else:
            m = _WORD_RE.match(ddl, i)
            if m is None:
                fail(f"unexpected character {c!r} at position {i}")
            out.append(_Token("word", m.group(), i))
            i = m.end()
    out.append(_Token("end", "", n))
    return out


class _Failer:
    """Raises the schema error for one DDL string."""

    def __init__(self, ddl: str):
        self.ddl = ddl

    def __call__(self, detail: str) -> NoReturn:
        raise schema_error(self.ddl, detail)


# ---------------------------------------------------------------- the parser

_PRIMITIVE_NAMES = {
    "boolean": "boolean",
    "tinyint": "tinyint",
    "byte": "tinyint",
    "smallint": "smallint",
    "short": "smallint",
    "int": "int",
    "integer": "int",
    "bigint": "bigint",
    "long": "bigint",
    "float": "float",
    "real": "float",
    "double": "double",
    "string": "string",
    "date": "date",
    "timestamp": "timestamp",
    "timestamp_ltz": "timestamp",
    "timestamp_ntz": "timestamp_ntz",
}
_CHAR_NAMES = {"char": "char", "character": "char", "varchar": "varchar"}
_DECIMAL_NAMES = ("decimal", "dec", "numeric")
_REFUSED = {
    "binary": "JSON has no bytes (send them base64-encoded in a STRING)",
    "map": "pyarrow's JSON reader has no map type (a STRUCT<...> of the known keys reads the same JSON)",
    "interval": "interval types have no Iceberg type and no JSON form",
    "variant": "VARIANT has no Arrow type the JSON reader produces",
    "void": "VOID holds no value",
    "time": "TIME has no JSON form the JSON reader parses",
}
_SUPPORTED = "BOOLEAN, TINYINT, SMALLINT, INT, BIGINT, FLOAT, DOUBLE, DECIMAL, STRING, VARCHAR, CHAR, DATE, " + (
    "TIMESTAMP, TIMESTAMP_LTZ, TIMESTAMP_NTZ, ARRAY<...>, STRUCT<...>"
)


class _Parser:
    """Recursive descent over the tokens of one DDL string; every method consumes what it parses."""

    def __init__(self, ddl: str):
        self.fail = _Failer(ddl)
        self.toks = _tokens(ddl)
        self.i = 0

    @property
    def tok(self) -> _Token:
        return self.toks[self.i]

    def take(self) -> _Token:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def at_punct(self, text: str) -> bool:
        return self.tok.kind == "punct" and self.tok.text == text

    def at_word(self, word: str) -> bool:
        return self.tok.kind == "word" and self.tok.text.lower() == word

    def expect_punct(self, text: str, what: str) -> _Token:
        if not self.at_punct(text):
            self.fail(f"expected '{text}' {what} at position {self.tok.pos}, found {self.tok.shown()}")
        return self.take()

    def schema(self) -> tuple[Field, ...]:
        if self.tok.kind == "end":
            self.fail("the schema is empty: give at least one field, as 'name TYPE, ...'")
        fields = [self.field("", top=True)]
        while self.at_punct(","):
            self.take()
            fields.append(self.field("", top=True))
        if self.tok.kind != "end":
            self.fail(f"expected ',' or the end at position {self.tok.pos}, found {self.tok.shown()}")
        return self.unique(fields, "")

    def name(self, parent: str) -> str:
        tok = self.take()
        where = f"at position {tok.pos}" + (f" in {parent}" if parent else "")
        if tok.kind == "name":
            if not tok.text:
                self.fail(f"an empty name {where}")
            return tok.text
        if tok.kind != "word":
            self.fail(f"expected a field name {where}, found {tok.shown()}")
        if _NUMBER_RE.fullmatch(tok.text):
            self.fail(f"{tok.text!r} {where} is a number, not a name: quote it as `{tok.text}`")
        if not _ASCII_NAME_RE.fullmatch(tok.text):
            self.fail(
                f"{tok.text!r} {where}: unquoted names are ASCII letters, digits and '_'; quote it as `{tok.text}`"
            )
        return tok.text

    def field(self, parent: str, *, top: bool) -> Field:
        name = self.name(parent)
        path = f"{parent}.{name}" if parent else name
        if self.at_punct(":"):
            if top:
                self.fail(
                    f"':' after the top-level name {name!r} at position {self.tok.pos}: ':' is for fields inside "
                    f"STRUCT<...>; write '{name} TYPE'"
                )
            self.take()
        type_ = self.type(path)
        nullable, comment = True, None
        if self.at_word("not"):
            self.take()
            if not self.at_word("null"):
                self.fail(f"expected NULL after NOT at position {self.tok.pos} (field {path}), not {self.tok.shown()}")
            self.take()
            nullable = False
        if self.at_word("comment"):
            self.take()
            if self.tok.kind != "string":
                self.fail(
                    f"expected a quoted string after COMMENT at position {self.tok.pos} (field {path}), "
                    f"found {self.tok.shown()}"
                )
            comment = self.take().text
        return Field(name, type_, nullable, comment)

    def params(self) -> list[int]:
        if not self.at_punct("("):
            return []
        self.take()
        out = []
        while True:
            tok = self.take()
            if tok.kind != "word" or not tok.text.isdigit() or not tok.text.isascii():
                self.fail(f"expected a whole number at position {tok.pos}, found {tok.shown()}")
            out.append(int(tok.text))
            if self.at_punct(")"):
                self.take()
                return out
            self.expect_punct(",", "or ')' in a type's parameters")

    def type(self, path: str) -> ValueType:
        tok = self.tok
        if tok.kind != "word":
            self.fail(f"expected a type for field {path} at position {tok.pos}, found {tok.shown()}")
        word = tok.text.lower()
        self.take()
        where = f"(field {path}, position {tok.pos})"
        if word in _REFUSED:
            self.fail(f"{word.upper()} {where} is not supported: {_REFUSED[word]}")
        if word == "array":
            self.expect_punct("<", f"after ARRAY {where}")
            element = self.type(f"{path}[]")
            self.expect_punct(">", f"to close ARRAY<...> {where}")
            return ArrayType(element)
        if word == "struct":
            self.expect_punct("<", f"after STRUCT {where}")
            if self.at_punct(">"):
                self.fail(f"STRUCT<> {where} has no fields: Parquet cannot store an empty struct")
            fields = [self.field(path, top=False)]
            while self.at_punct(","):
                self.take()
                fields.append(self.field(path, top=False))
            self.expect_punct(">", f"or ',' in STRUCT<...> {where}")
            return StructType(self.unique(fields, path))
        if word not in _PRIMITIVE_NAMES and word not in _CHAR_NAMES and word not in _DECIMAL_NAMES:
            self.fail(f"unknown type {tok.text!r} {where}; the supported types are {_SUPPORTED}")
        params = self.params()
        if word in _DECIMAL_NAMES:
            if len(params) > 2:
                self.fail(f"DECIMAL {where} takes (precision[, scale]), not {len(params)} numbers")
            precision = params[0] if params else 10
            scale = params[1] if len(params) == 2 else 0
            if not 1 <= precision <= 38:
                self.fail(f"DECIMAL precision {precision} {where} is out of range: it must be 1 to 38")
            if scale > precision:
                self.fail(f"DECIMAL scale {scale} {where} is greater than its precision {precision}")
            return DecimalType(precision, scale)
        if word in _CHAR_NAMES:
            if len(params) != 1:
                self.fail(f"{word.upper()} {where} needs one length, as {word.upper()}(n)")
            return CharType(_CHAR_NAMES[word], params[0])
        if params:
            self.fail(f"{word.upper()} {where} takes no parameters")
        if word == "string" and self.at_word("collate"):
            self.fail(f"COLLATE {where} is not supported: Iceberg strings have no collation")
        return PrimitiveType(_PRIMITIVE_NAMES[word])

    def unique(self, fields: list[Field], parent: str) -> tuple[Field, ...]:
        seen: dict[str, str] = {}
        where = f" in {parent}" if parent else ""
        for f in fields:
            key = f.name.lower()
            if key in seen:
                self.fail(f"field {f.name!r}{where} repeats {seen[key]!r} (names are case-insensitive, as in Spark)")
            seen[key] = f.name
        return tuple(fields)


def parse_value_schema(ddl: str) -> ValueSchema:
    """The ValueSchema of a Spark DDL string; InvalidConfigError (naming what and where) if it is not one."""
    if not isinstance(ddl, str):
        raise schema_error(str(ddl), "expected a string of Spark DDL, as 'name TYPE, ...'")
    fields = _Parser(ddl).schema()
    kafka = {c.lower(): c for c in KAFKA_COLUMNS}
    for f in fields:
        if f.name.lower() in kafka:
            raise schema_error(
                ddl,
                f"field {f.name!r} would collide with a Kafka column of the table ({', '.join(KAFKA_COLUMNS)}; "
                "names compare case-insensitively)",
            )
    return ValueSchema(fields, ddl)
