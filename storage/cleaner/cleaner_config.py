"""CleanerConfig: the broker-level log.cleaner.* settings the cleaner runs with (Kafka's CleanerConfig).

Each setting has its Kafka name, its ConfigDef type and its bounds in SETTINGS; the one option parser
(log_config.parse_option) checks them whether the config is built from strings (from_dict, the CLI) or
directly with typed values. The dedupe buffer must fit one SkimpyOffsetMap table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..errors import InvalidConfigError
from ..log_config import parse_option
from .offset_map import DEFAULT_DEDUPE_BUFFER_SIZE, DEFAULT_LOAD_FACTOR, SkimpyOffsetMap
from .throttler import UNLIMITED


@dataclass(frozen=True)
class CleanerConfig:
    """The broker-level log.cleaner.* settings the cleaner uses, checked by SETTINGS (also when built
    directly, with typed values)."""

    dedupe_buffer_size: int = DEFAULT_DEDUPE_BUFFER_SIZE  # log.cleaner.dedupe.buffer.size
    io_buffer_load_factor: float = DEFAULT_LOAD_FACTOR  # log.cleaner.io.buffer.load.factor
    io_max_bytes_per_second: float = UNLIMITED  # log.cleaner.io.max.bytes.per.second
    lock_timeout_ms: int = 30_000  # wait for the partition lock at swap time, then give up (retried next run)
    # object stores only (ours, not Kafka's): segments younger than this are not merged or cleaned
    # (segment_swap.settled_bound), and the maintenance lease's TTL (maintenance_lease.py)
    merge_min_age_ms: int = 60_000
    lease_ttl_ms: int = 600_000

    # the settings from_dict takes, by Kafka name: (attribute, ConfigDef type, bounds)
    SETTINGS: ClassVar[dict[str, tuple[str, str, dict]]] = {
        "log.cleaner.dedupe.buffer.size": ("dedupe_buffer_size", "long", {}),
        "log.cleaner.io.buffer.load.factor": ("io_buffer_load_factor", "double", {"above": 0, "at_most": 1}),
        "log.cleaner.io.max.bytes.per.second": ("io_max_bytes_per_second", "double", {"above": 0}),
        "kafkalog.segment.merge.min.age.ms": ("merge_min_age_ms", "long", {"at_least": 0}),
        "kafkalog.maintenance.lease.ttl.ms": ("lease_ttl_ms", "long", {"at_least": 1000}),
    }

    def __post_init__(self):
        for name, (attr, type_, bounds) in self.SETTINGS.items():
            object.__setattr__(self, attr, parse_option(name, getattr(self, attr), type_, **bounds))
        object.__setattr__(
            self, "lock_timeout_ms", parse_option("lock_timeout_ms", self.lock_timeout_ms, "long", at_least=0)
        )
        SkimpyOffsetMap.check_memory(self.dedupe_buffer_size)

    @classmethod
    def from_dict(cls, settings: dict) -> CleanerConfig:
        """From Kafka names (log.cleaner.dedupe.buffer.size, ...); values may be strings."""
        unknown = [name for name in settings if name not in cls.SETTINGS]
        if unknown:
            raise InvalidConfigError(f"unknown cleaner setting {unknown[0]!r}; known: {', '.join(cls.SETTINGS)}")
        return cls(**{cls.SETTINGS[name][0]: value for name, value in settings.items()})
