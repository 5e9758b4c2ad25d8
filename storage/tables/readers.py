"""Reading a topic's table outside Spark (docs/tables.md, "Readers"): DuckDB, and pyiceberg into Arrow, pandas
and Polars. Each returns the rows `spark.read.format("kafkalog")` returns at read_committed for the table's
range (tests/storage/tables/test_table_readers.py holds them to it), given these helpers:

- duckdb_connection(): a DuckDB connection that loads the iceberg extension from the `duckdb-ext-iceberg`
  wheel in site-packages, with automatic installs off, so nothing is downloaded at run time;
- static_table(metadata_location): the table as of one metadata file (a pass's TableReport.metadata_location),
  read with no catalog; topic_table(root, topic): the table as its catalog has it now;
- restore_null_headers(rows): pyiceberg 0.12 reads a null list of structs as an empty list
  (apache/iceberg-python#3833), so a record without headers comes back with `headers == []` where Spark's
  Kafka source, Iceberg's Spark runtime and DuckDB give null. A Kafka record has no empty headers distinct
  from none, so every `[]` there was null: this puts the nulls back, on the Arrow rows before pandas or
  Polars sees them.

    con = duckdb_connection()
    con.sql(f"SELECT * FROM iceberg_scan('{metadata_location}')")

    rows = restore_null_headers(static_table(metadata_location).scan().to_arrow())
    rows.to_pandas(); polars.from_arrow(rows)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from ..errors import TableError
from .catalog import io_properties
from .table_config import TABLES_EXTRA

EXTENSIONS_PACKAGE = "duckdb_ext"  # the namespace package the duckdb-ext-* wheels install into


def _extension_directory() -> str | None:
    """site-packages/duckdb_ext/extensions when the duckdb-ext-iceberg wheel put its extension there."""
    spec = importlib.util.find_spec(EXTENSIONS_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        extensions = Path(location) / "extensions"
        if any(extensions.glob("*/*/iceberg.duckdb_extension")):
            return str(extensions)
    return None


def duckdb_connection(database: str = ":memory:"):
    """A DuckDB connection with the iceberg extension loaded from site-packages (iceberg_scan, iceberg_metadata,
    ...); automatic installs are off. TableError in one line when DuckDB or the extension wheels are missing."""
    if importlib.util.find_spec("duckdb") is None:
        raise TableError(f"reading tables with DuckDB needs duckdb: pip install '{TABLES_EXTRA}'")
    directory = _extension_directory()
    if directory is None:
        raise TableError(
            f"DuckDB's iceberg extension is not installed (the duckdb-ext-iceberg wheel): pip install '{TABLES_EXTRA}'"
        )
    import duckdb

    con = duckdb.connect(database, config={"extension_directory": directory, "autoinstall_known_extensions": False})
    try:
        con.execute("LOAD iceberg")  # loads avro too, from the same directory
    except duckdb.Error as e:
        con.close()
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TableError(
            f"duckdb {duckdb.__version__} cannot load the iceberg extension from {directory} ({first}); the "
            f"extension wheels are built for one DuckDB version: pip install '{TABLES_EXTRA}'"
        ) from None
    return con


def static_table(metadata_location: str, storage_options: dict | None = None):
    """The table as of one metadata file, read with no catalog (pyiceberg's StaticTable); `storage_options`:
    the log's fsspec options, for a table on S3."""
    if importlib.util.find_spec("pyiceberg") is None:
        raise TableError(f"reading a table with pyiceberg needs pyiceberg: pip install '{TABLES_EXTRA}'")
    from pyiceberg.table import StaticTable

    return StaticTable.from_metadata(metadata_location, properties=io_properties(storage_options))


def topic_table(root: str, topic: str, *, errors: bool = False, storage_options: dict | None = None):
    """A topic's table (its errors table with `errors`) as its catalog has it now, loaded as a materialization
    pass loads it: from the topic's table.* configs (TableError when the topic has none)."""
    from ..log_manager import LogManager
    from .catalog import open_catalog
    from .table_config import TableConfig

    lm = LogManager(root, storage_options)
    cfg = TableConfig.of(topic, lm.topic(topic).config)
    if cfg is None:
        raise TableError(f"topic '{topic}' has no table (table.mode is off)")
    identifier = cfg.errors_identifier if errors else cfg.identifier
    if identifier is None:
        raise TableError(f"topic '{topic}' has no errors table: it has one only with table.value.format=json")
    return open_catalog(lm, cfg, storage_options).load_table(identifier)


def restore_null_headers(rows: Any) -> Any:
    """`rows` (a pyarrow Table or RecordBatch of a table's columns) with every empty `headers` list as null,
    as Spark's Kafka source gives a record without headers (see the module doc); rows without that column
    are returned as they are."""
    import pyarrow as pa
    import pyarrow.compute as pc

    i = rows.schema.get_field_index("headers")
    if i < 0:
        return rows
    headers = rows.column(i)
    empty = pc.equal(pc.list_value_length(headers), 0)
    return rows.set_column(i, rows.schema.field(i), pc.if_else(empty, pa.scalar(None, headers.type), headers))


__all__ = ["duckdb_connection", "restore_null_headers", "static_table", "topic_table"]
