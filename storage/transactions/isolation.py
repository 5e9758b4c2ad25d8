"""Isolation levels a reader asks for (Kafka's IsolationLevel and the consumer's `isolation.level`).

read_uncommitted returns every data record, aborted ones and those of open transactions included;
read_committed stops at the last stable offset and drops the batches of aborted transactions. Control
records are returned at neither level.
"""

from __future__ import annotations

from ..errors import InvalidConfigError

READ_UNCOMMITTED = "read_uncommitted"
READ_COMMITTED = "read_committed"
ISOLATION_LEVELS = (READ_UNCOMMITTED, READ_COMMITTED)


def parse_isolation_level(value, option_name: str) -> str:
    """The isolation level `value` names, checked as Kafka's ConsumerConfig does: exactly one of the lowercase
    names (its validator is ConfigDef.in, which is case-sensitive). Anything else raises InvalidConfigError
    naming the option and the accepted values."""
    if isinstance(value, str) and value in ISOLATION_LEVELS:
        return value
    raise InvalidConfigError(
        f"invalid value {value!r} for {option_name}: expected one of {', '.join(ISOLATION_LEVELS)}"
    )
