"""TableConfig: a topic's `table.*` configs (storage/log_config.py validates each) read as one object.

Invariants: `mode` is append or upsert (a topic with table.mode=off has no TableConfig); `identifier` is
(namespace parts..., name) with the name defaulting to the topic's with '.' as '_' (Kafka refuses two topics
that differ only in '.' and '_', so two topics never default to one name); the errors table, kept only with
table.value.format=json, is `<name>__errors` in the same namespace. `shape()` is what the table was made
from: it is stored on the table and in ROOT's table state, and a change to it is refused (check_change).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass

from ..errors import InvalidConfigError, TableError
from ..log_config import LogConfig

#: The extra that brings pyiceberg and DuckDB (pyproject.toml).
TABLES_EXTRA = "kafkalog-ds[tables]"
ERRORS_TABLE_SUFFIX = "__errors"


def require_pyiceberg(topic: str) -> None:
    """Raise the one-line error naming the extra when pyiceberg is not installed."""
    if importlib.util.find_spec("pyiceberg") is None:
        raise TableError(
            f"topic '{topic}' has a table config (table.mode), which needs pyiceberg: pip install '{TABLES_EXTRA}'"
        )


@dataclass(frozen=True)
class TableConfig:
    topic: str
    mode: str  # append | upsert
    catalog: str  # "" : ROOT's own SQLite catalog
    namespace: tuple[str, ...]
    name: str
    partition_by: str  # hour | day | month | year | none
    value_format: str  # none | json
    value_schema: str  # a Spark DDL string, with json

    @classmethod
    def of(cls, topic: str, config: LogConfig) -> TableConfig | None:
        """The topic's table config, or None when table.mode is off."""
        if config.table_mode == "off":
            return None
        return cls(
            topic,
            config.table_mode,
            config.table_catalog,
            tuple(config.table_namespace.split(".")),
            config.table_name or topic.replace(".", "_"),
            config.table_partition_by,
            config.table_value_format,
            config.table_value_schema,
        )

    @property
    def identifier(self) -> tuple[str, ...]:
        return (*self.namespace, self.name)

    @property
    def errors_identifier(self) -> tuple[str, ...] | None:
        """The errors table of a JSON value format; None without one."""
        return (*self.namespace, self.name + ERRORS_TABLE_SUFFIX) if self.value_format == "json" else None

    @property
    def display_name(self) -> str:
        return ".".join(self.identifier)

    @property
    def catalog_display(self) -> str:
        return f"catalog '{self.catalog}'" if self.catalog else "ROOT's own catalog"

    def shape(self) -> dict[str, str]:
        """What the table was made from, as table.* config strings (stored on the table and in ROOT)."""
        return {
            "table.mode": self.mode,
            "table.catalog": self.catalog,
            "table.namespace": ".".join(self.namespace),
            "table.name": self.name,
            "table.partition.by": self.partition_by,
            "table.value.format": self.value_format,
            "table.value.schema": self.value_schema,
        }

    def shape_json(self) -> str:
        return json.dumps(self.shape(), sort_keys=True, separators=(",", ":"))

    def differences(self, shape: dict) -> list[str]:
        """Keys whose value differs from a stored shape, as 'key: stored -> now'."""
        mine = self.shape()
        return [f"{k}: {shape.get(k)!r} -> {v!r}" for k, v in sorted(mine.items()) if shape.get(k) != v]


def check_change(topic: str, new: LogConfig, table_shape: dict | None) -> None:
    """Refuse a table.* change on a topic that has a table (`table_shape`: its stored shape, None when it
    has none). Allowed: table.mode to off (a pause) and back to the table's own mode (a resume)."""
    if table_shape is None:
        return
    if new.table_mode not in ("off", table_shape.get("table.mode")):
        changed = [f"table.mode: {table_shape.get('table.mode')!r} -> {new.table_mode!r}"]
    else:  # the other keys as they would be with the table's own mode
        keys = {k: v for k, v in new.overrides.items() if k != "table.mode"}
        keys["table.mode"] = table_shape.get("table.mode", "append")
        if "compact" not in new.cleanup_policy and keys["table.mode"] == "upsert":
            keys["cleanup.policy"] = "compact"  # judged on the table keys alone
        was = TableConfig.of(topic, LogConfig.from_dict(keys))
        changed = was.differences(table_shape) if was is not None else []
    if changed:
        name = ".".join([table_shape.get("table.namespace", ""), table_shape.get("table.name", "")])
        raise InvalidConfigError(
            f"topic '{topic}' already has the table {name}: its table configs cannot change "
            f"({'; '.join(changed)}); set table.mode=off to stop it, or `kafkalog table ROOT --topic {topic} "
            f"--forget` and a new table.name (or drop the old table) to start a new one"
        )
