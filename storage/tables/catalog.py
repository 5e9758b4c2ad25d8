"""The pyiceberg catalog a topic's table lives in, and the FileIO properties its data files are written with.

table.catalog empty (the default): pyiceberg's SQL catalog on SQLite, kept inside ROOT with its warehouse
(`ROOT/.kafkalog-tables/catalog.db`, `ROOT/.kafkalog-tables/warehouse/`); it needs a ROOT on local disk,
where SQLite can lock its file. A name: the pyiceberg catalog of that name, configured as pyiceberg configures
catalogs (`~/.pyiceberg.yaml`, or `PYICEBERG_CATALOG__<NAME>__<KEY>` variables; read anew on each open), so
REST, Hive, Glue or SQL on a database server are all one setting. The log's fsspec storage options become
the FileIO's S3 properties unless the catalog's configuration sets them itself.
"""

from __future__ import annotations

from typing import Any

from ..errors import TableCatalogError, TableError
from .table_config import TableConfig, require_pyiceberg
from .table_state import TABLES_DIR

DEFAULT_CATALOG_NAME = "kafkalog"  # the SQLite catalog's name (its rows' catalog_name; Spark's JDBC catalog needs it)
CATALOG_FILE = "catalog.db"
WAREHOUSE_DIR = "warehouse"


def io_properties(storage_options: dict | None) -> dict[str, str]:
    """pyiceberg FileIO properties for the log's fsspec (s3fs) storage options."""
    so = storage_options or {}
    ck: dict = so["client_kwargs"] if isinstance(so.get("client_kwargs"), dict) else {}
    pairs = {
        "s3.endpoint": so.get("endpoint_url") or ck.get("endpoint_url"),
        "s3.access-key-id": so.get("key") or ck.get("aws_access_key_id"),
        "s3.secret-access-key": so.get("secret") or ck.get("aws_secret_access_key"),
        "s3.session-token": so.get("token") or ck.get("aws_session_token"),
        "s3.region": ck.get("region_name") or so.get("region_name"),
    }
    if pairs["s3.endpoint"] and not pairs["s3.region"]:
        # no region with an endpoint of its own (MinIO, moto...): pyiceberg would ask AWS for the bucket's region,
        # a request to the internet that takes seconds where there is none
        pairs["s3.region"] = "us-east-1"
    return {k: str(v) for k, v in pairs.items() if v}


def default_catalog_paths(lm) -> tuple[str, str]:
    """(SQLite file path, warehouse URL) of ROOT's own catalog; TableError where ROOT is not on local disk."""
    if lm.fs.protocol != "file":
        raise TableError(
            f"{lm.url()} is not on local disk, so it has no catalog of its own (SQLite needs a local file): set "
            f"table.catalog to a pyiceberg catalog (docs/tables.md, 'Catalogs')"
        )
    base = lm.fs.join(lm.root, TABLES_DIR)
    return lm.fs.join(base, CATALOG_FILE), "file://" + lm.fs.join(base, WAREHOUSE_DIR)


def catalog_properties(lm, cfg: TableConfig, storage_options: dict | None = None) -> tuple[str, dict[str, Any]]:
    """(catalog name, the properties pyiceberg's load_catalog gets) for a topic's table config."""
    if not cfg.catalog:
        db, warehouse = default_catalog_paths(lm)
        lm.fs.mkdirs(lm.fs.dirname(db))
        return DEFAULT_CATALOG_NAME, {"type": "sql", "uri": f"sqlite:///{db}", "warehouse": warehouse}
    from pyiceberg.utils.config import Config

    conf = Config().get_catalog_config(cfg.catalog)  # read now: the environment may have changed since import
    if not conf:
        raise TableError(
            f"topic '{cfg.topic}': table.catalog={cfg.catalog} names no pyiceberg catalog: configure it in "
            f"~/.pyiceberg.yaml (catalog: {cfg.catalog}: ...) or with PYICEBERG_CATALOG__{cfg.catalog.upper()}__URI"
        )
    return cfg.catalog, {**io_properties(storage_options), **conf}


def describe_catalog(name: str, props: dict) -> str:
    """The catalog as shown in messages: its name and URI, never a credential."""
    uri = str(props.get("uri", ""))
    if "@" in uri:
        uri = uri.split("://", 1)[0] + "://***@" + uri.rsplit("@", 1)[1]
    return f"catalog '{name}'" + (f" ({uri})" if uri else "")


def open_catalog(lm, cfg: TableConfig, storage_options: dict | None = None):
    """The topic's catalog, loaded; TableCatalogError in one line when it cannot be reached."""
    require_pyiceberg(cfg.topic)
    name, props = catalog_properties(lm, cfg, storage_options)
    from pyiceberg.catalog import load_catalog

    try:
        return load_catalog(name, **props)
    except TableError:
        raise
    except Exception as e:  # noqa: BLE001 - any driver's failure to connect: one line naming the catalog
        # a missing driver or bad properties is not a network failure: say which
        verb = "cannot be opened" if type(e).__name__ in ("NotInstalledError", "ValueError") else "cannot be reached"
        raise TableCatalogError(
            f"topic '{cfg.topic}': {describe_catalog(name, props)} {verb}: {type(e).__name__}: {_first_line(e)}"
        ) from e


def _first_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:300] + ("..." if len(text) > 300 else "")
