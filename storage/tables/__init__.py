"""Topics as Apache Iceberg tables (docs/tables.md): the maintenance job keeps a topic's committed records
in a table any Iceberg engine scans.

- table_config.py   the topic's `table.*` configs as one object: mode, catalog, identifier, partitioning
- value_schema.py   Spark DDL strings (`table.value.schema`) parsed into Arrow types, without Spark
- json_values.py    JSON values parsed into those columns; a record that does not parse is an error row
- table_state.py    ROOT's own record of each table (`.kafkalog-tables/<topic>.json`): what retention waits for
- catalog.py        the pyiceberg catalog a topic's table lives in (ROOT's SQLite one by default), its FileIO
- table_schema.py   the Iceberg schema, partition spec and sort order of a topic's table and its errors table
- table_offsets.py  the next offset per partition, kept in the snapshot summary of the commit that wrote the rows
- data_files.py     decoded records to table rows, written as Parquet data files of the table
- upsert.py         upsert tables: the latest record per key, by copy-on-write of the files it replaces
- materializer.py   one pass over one topic: read_committed records since the table's offsets, one commit
- table_report.py   what a pass did (no Iceberg import: the maintenance job reports a missing extra with it)
- readers.py        reading a table outside Spark: DuckDB with its extension from the wheel, pyiceberg

Only the modules that touch Iceberg import pyiceberg, and only callers that found a table config import them:
without the `tables` extra, a table config fails with one line naming it (catalog.require_pyiceberg).
"""
