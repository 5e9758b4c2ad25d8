"""The Spark DDL parser of `table.value.schema` (storage/tables/value_schema.py): every type and alias to its
Arrow type, names, STRUCT fields, NOT NULL and COMMENT; a random round trip (a schema tree written as DDL in
random case, spacing and quoting parses back to the same tree); and every refusal, worded as log_config words
an invalid value. That Spark itself parses the same strings to the same types is checked in
test_json_values.py's Spark section."""

from __future__ import annotations

import re
import subprocess
import sys

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.errors import InvalidConfigError
from storage.tables.value_schema import (
    KAFKA_COLUMNS,
    ArrayType,
    CharType,
    DecimalType,
    Field,
    PrimitiveType,
    StructType,
    ValueType,
    parse_value_schema,
)

PREFIX = "Invalid value {!r} for configuration table.value.schema: "


def arrow(ddl: str) -> pa.Schema:
    return parse_value_schema(ddl).arrow_schema()


def refused(ddl: str) -> str:
    with pytest.raises(InvalidConfigError) as e:
        parse_value_schema(ddl)
    msg = str(e.value)
    shown = ddl if len(ddl) <= 100 else ddl[:97] + "..."
    assert msg.startswith(PREFIX.format(shown)), msg
    assert "\n" not in msg
    return msg[len(PREFIX.format(shown)) :]


# ---------------------------------------------------------------- types


@pytest.mark.parametrize(
    "name, want",
    [
        ("boolean", pa.bool_()),
        ("tinyint", pa.int32()),
        ("byte", pa.int32()),
        ("smallint", pa.int32()),
        ("short", pa.int32()),
        ("int", pa.int32()),
        ("integer", pa.int32()),
        ("bigint", pa.int64()),
        ("long", pa.int64()),
        ("float", pa.float32()),
        ("real", pa.float32()),
        ("double", pa.float64()),
        ("decimal", pa.decimal128(10, 0)),
        ("dec(7)", pa.decimal128(7, 0)),
        ("numeric(38,38)", pa.decimal128(38, 38)),
        ("decimal(1, 0)", pa.decimal128(1, 0)),
        ("string", pa.string()),
        ("varchar(5)", pa.string()),
        ("char(0)", pa.string()),
        ("character(3)", pa.string()),
        ("date", pa.date32()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestamp_ltz", pa.timestamp("us", tz="UTC")),
        ("timestamp_ntz", pa.timestamp("us")),
        ("array<int>", pa.list_(pa.int32())),
        ("array<array<string>>", pa.list_(pa.list_(pa.string()))),
        ("struct<x: int, y string>", pa.struct([("x", pa.int32()), ("y", pa.string())])),
    ],
)
def test_each_type_and_alias_has_its_arrow_type(name, want):
    spellings = (name,) if "struct" in name else (name, name.upper(), name.title())  # field names keep case
    for spelled in spellings:
        assert arrow(f"v {spelled}").field("v").type == want


def test_the_tree_keeps_spark_names_and_parameters():
    s = parse_value_schema("a BYTE, b Long, c REAL, d dec, e varchar(9), f CHARACTER(2), g TIMESTAMP_LTZ")
    assert [f.type for f in s.fields] == [
        PrimitiveType("tinyint"),
        PrimitiveType("bigint"),
        PrimitiveType("float"),
        DecimalType(10, 0),
        CharType("varchar", 9),
        CharType("char", 2),
        PrimitiveType("timestamp"),
    ]
    assert s.simple_string() == (
        "struct<a:tinyint,b:bigint,c:float,d:decimal(10,0),e:varchar(9),f:char(2),g:timestamp>"
    )


def test_struct_fields_take_an_optional_colon_not_null_and_comment():
    s = parse_value_schema(
        "id BIGINT NOT NULL COMMENT 'the key', "
        '`user` STRUCT<name: STRING NOT NULL, `e-mail` STRING COMMENT "where", tags ARRAY<STRUCT<k STRING>>>'
    )
    assert s.fields[0] == Field("id", PrimitiveType("bigint"), nullable=False, comment="the key")
    user = s.fields[1]
    assert user.nullable and user.comment is None
    assert isinstance(user.type, StructType)
    assert user.type.fields == (
        Field("name", PrimitiveType("string"), nullable=False),
        Field("e-mail", PrimitiveType("string"), comment="where"),
        Field("tags", ArrayType(StructType((Field("k", PrimitiveType("string")),)))),
    )
    schema = s.arrow_schema()
    # top-level fields are nullable (tombstones and error rows); nested ones keep NOT NULL; comments are metadata
    assert schema.field("id").nullable and schema.field("id").metadata == {b"comment": b"the key"}
    assert not schema.field("user").type.field("name").nullable
    assert schema.field("user").type.field("e-mail").metadata == {b"comment": b"where"}


def test_names_backquotes_keywords_and_digits():
    s = parse_value_schema("`a``b` INT, `a.b c` INT, `é` INT, not INT, comment STRING COMMENT 'c', 1a INT, _ INT")
    assert s.names == ("a`b", "a.b c", "é", "not", "comment", "1a", "_")
    nested = parse_value_schema("struct STRUCT<struct INT, `array` ARRAY<INT>>")
    assert nested.simple_string() == "struct<struct:struct<struct:int,array:array<int>>>"


def test_comments_unescape_as_spark_does_and_sql_comments_are_blanks():
    s = parse_value_schema(
        "a INT COMMENT 'it\\'s \\101\\u0042 \\% \\Z \\n', b INT COMMENT R'raw\\n', c INT COMMENT \"dq \\\"x\\\"\""
    )
    assert [f.comment for f in s.fields] == ["it's AB \\% \x1a \n", "raw\\n", 'dq "x"']
    s = parse_value_schema("-- leading\n a /* x /* nested */ */ INT -- trailing\n,\u00a0b\tSTRING\r\n")
    assert s.names == ("a", "b")


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "ddl, words",
    [
        ("", ["empty"]),
        ("  -- only a comment", ["empty"]),
        ("a", ["expected a type for field a", "position 1"]),
        ("a INT,", ["expected a field name", "position 6"]),
        ("a INT b INT", ["expected ',' or the end", "position 6", "'b'"]),
        ("a: INT", ["':' after the top-level name 'a'", "STRUCT"]),
        ("a INT NOT", ["expected NULL after NOT", "field a"]),
        ("a INT COMMENT 'x' NOT NULL", ["expected ',' or the end", "position 18"]),
        ("a INT COMMENT 5", ["quoted string after COMMENT", "field a"]),
        ("a FOO", ["unknown type 'FOO'", "field a", "position 2", "supported"]),
        ("a STRUCT<b: BLOB>", ["unknown type 'BLOB'", "field a.b"]),
        ("a ARRAY<STRUCT<c: XML>>", ["field a[].c"]),
        ("a BINARY", ["BINARY", "not supported", "JSON has no bytes"]),
        ("a MAP<STRING, INT>", ["MAP", "field a", "no map type"]),
        ("a ARRAY<MAP<STRING, INT>>", ["MAP", "field a[]"]),
        ("a INTERVAL YEAR TO MONTH", ["INTERVAL", "not supported"]),
        ("a INTERVAL DAY", ["INTERVAL"]),
        ("a VARIANT", ["VARIANT"]),
        ("a VOID", ["VOID"]),
        ("a TIME", ["TIME"]),
        ("a STRING COLLATE UTF8_LCASE", ["COLLATE", "field a"]),
        ("a STRUCT<>", ["STRUCT<>", "no fields"]),
        ("a STRUCT", ["expected '<' after STRUCT"]),
        ("a ARRAY<INT", ["'>'", "ARRAY"]),
        ("a ARRAY<INT NOT NULL>", ["expected '>'"]),
        ("a DECIMAL(39)", ["precision 39", "1 to 38"]),
        ("a DECIMAL(0)", ["precision 0", "1 to 38"]),
        ("a DECIMAL(5,6)", ["scale 6", "greater than its precision 5"]),
        ("a DECIMAL(5,2,1)", ["(precision[, scale])"]),
        ("a DECIMAL(x)", ["expected a whole number"]),
        ("a DECIMAL(-1)", ["unexpected character '-'"]),
        ("a VARCHAR", ["VARCHAR", "needs one length"]),
        ("a CHAR(1,2)", ["CHAR", "needs one length"]),
        ("a INT(3)", ["INT", "takes no parameters"]),
        ("a int, A string", ["'A' repeats 'a'", "case-insensitive"]),
        ("s STRUCT<x INT, X INT>", ["'X' in s repeats 'x'"]),
        ("`` INT", ["an empty name", "position 0"]),
        ("123 INT", ["'123'", "is a number", "`123`"]),
        ("1e5 INT", ["is a number"]),
        ("10L INT", ["is a number"]),
        ("é INT", ["unquoted names are ASCII", "`é`"]),
        ("a-b INT", ["unexpected character '-'"]),
        ("a INT /* open", ["comment", "not closed"]),
        ("`a INT", ["quoted name", "not closed"]),
        ("a INT COMMENT 'x", ["string", "not closed"]),
        ("a INT; b INT", ["unexpected character ';'"]),
    ],
)
def test_a_schema_spark_or_we_refuse_is_an_invalid_config_saying_what_and_where(ddl, words):
    detail = refused(ddl)
    for w in words:
        assert w in detail, (w, detail)


@pytest.mark.parametrize("name", KAFKA_COLUMNS + ("KEY", "Offset", "timestamptype", "HEADERS"))
def test_a_top_level_name_of_a_kafka_column_is_refused(name):
    detail = refused(f"id INT, `{name}` STRING")
    assert repr(name) in detail and "Kafka column" in detail
    # nested, the same names are fine: they do not meet the table's columns
    assert parse_value_schema(f"v STRUCT<`{name}`: STRING>").fields[0].name == "v"


def test_a_long_schema_is_shortened_in_the_message():
    ddl = ", ".join(f"field_{i} INT" for i in range(40)) + ", bad FOO"
    detail = refused(ddl)
    assert "unknown type 'FOO'" in detail
    assert len(str(PREFIX.format(ddl[:97] + "..."))) < 160


def test_not_a_string_is_refused():
    with pytest.raises(InvalidConfigError, match="expected a string of Spark DDL"):
        parse_value_schema(None)  # type: ignore[arg-type]


def test_the_parser_does_not_import_pyarrow():
    """log_config checks table.value.schema when a topic's config is set, where nothing else needs Arrow."""
    code = (
        "import sys; from storage.tables.value_schema import parse_value_schema; "
        "parse_value_schema('a INT, b ARRAY<STRUCT<c: DECIMAL(5,2)>>'); print('pyarrow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------- random round trip

_NAMES = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True),
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=6),
)
_PRIMITIVES = {
    "boolean": ["boolean"],
    "tinyint": ["tinyint", "byte"],
    "smallint": ["smallint", "short"],
    "int": ["int", "integer"],
    "bigint": ["bigint", "long"],
    "float": ["float", "real"],
    "double": ["double"],
    "string": ["string"],
    "date": ["date"],
    "timestamp": ["timestamp", "timestamp_ltz"],
    "timestamp_ntz": ["timestamp_ntz"],
}


def _types(depth: int) -> st.SearchStrategy[ValueType]:
    leaves = st.one_of(
        st.sampled_from(sorted(_PRIMITIVES)).map(PrimitiveType),
        st.builds(CharType, st.sampled_from(["char", "varchar"]), st.integers(0, 300)),
        st.integers(1, 38).flatmap(lambda p: st.builds(DecimalType, st.just(p), st.integers(0, p))),
    )
    if depth == 0:
        return leaves
    return st.one_of(
        leaves,
        st.builds(ArrayType, _types(depth - 1)),
        _fields(depth - 1).map(StructType),
    )


def _fields(depth: int) -> st.SearchStrategy[tuple[Field, ...]]:
    field = st.builds(
        Field,
        _NAMES,
        _types(depth),
        st.booleans(),
        st.one_of(st.none(), st.text(max_size=8)),
    )
    return st.lists(field, min_size=1, max_size=4, unique_by=lambda f: f.name.lower()).map(tuple)


#: What Spark's lexer reads as a number literal, not a name: digits, an exponent, a type suffix (1L, 0D, 2e5BD)
_SPARK_NUMBER = re.compile(r"[0-9]+(?:e[0-9]+)?(?:l|s|y|d|f|bd)?", re.IGNORECASE)


def _quote(name: str, draw) -> str:
    plain = name.isascii() and name.replace("_", "a").isalnum() and not _SPARK_NUMBER.fullmatch(name)
    if plain and draw(st.booleans()):
        return name
    return "`" + name.replace("`", "``") + "`"


def _string(text: str, draw) -> str:
    if "'" not in text and "\\" not in text and draw(st.booleans()):
        return "R'" + text + "'" if draw(st.booleans()) else "'" + text + "'"
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
    return "'" + escaped + "'"


def _ddl(t: ValueType, draw) -> str:
    blank = draw(st.sampled_from(["", " ", "  ", "\n", " /* c */ "]))

    def case(word: str) -> str:
        return draw(st.sampled_from([word, word.upper(), word.title()]))

    if isinstance(t, PrimitiveType):
        return case(draw(st.sampled_from(_PRIMITIVES[t.name])))
    if isinstance(t, CharType):
        word = draw(st.sampled_from(["char", "character"])) if t.name == "char" else "varchar"
        return f"{case(word)}{blank}({blank}{t.length}{blank})"
    if isinstance(t, DecimalType):
        word = case(draw(st.sampled_from(["decimal", "dec", "numeric"])))
        if (t.precision, t.scale) == (10, 0) and draw(st.booleans()):
            return word
        if t.scale == 0 and draw(st.booleans()):
            return f"{word}({t.precision})"
        return f"{word}({t.precision},{blank}{t.scale})"
    if isinstance(t, ArrayType):
        return f"{case('array')}{blank}<{blank}{_ddl(t.element, draw)}{blank}>"
    inner = f",{blank}".join(_field_ddl(f, draw, nested=True) for f in t.fields)
    return f"{case('struct')}<{blank}{inner}{blank}>"


def _field_ddl(f: Field, draw, *, nested: bool) -> str:
    colon = draw(st.sampled_from([" ", ": ", ":", " : "])) if nested else " "
    out = _quote(f.name, draw) + colon + _ddl(f.type, draw)
    if not f.nullable:
        out += " " + draw(st.sampled_from(["NOT NULL", "not null", "Not  Null"]))
    if f.comment is not None:
        out += " " + draw(st.sampled_from(["COMMENT", "comment"])) + " " + _string(f.comment, draw)
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fields=_fields(2), data=st.data())
def test_a_schema_written_as_ddl_parses_back_to_itself(fields, data):
    """Any tree (with names that are not Kafka columns), written in random case, spacing, quoting and aliases."""
    fields = tuple(f for f in fields if f.name.lower() not in {c.lower() for c in KAFKA_COLUMNS})
    if not fields:
        return
    ddl = ("," + data.draw(st.sampled_from([" ", "", "\n  "]))).join(
        _field_ddl(f, data.draw, nested=False) for f in fields
    )
    parsed = parse_value_schema(ddl)
    assert parsed.fields == fields, ddl
    assert parsed.ddl == ddl
    assert parsed.arrow_schema().names == [f.name for f in fields]
