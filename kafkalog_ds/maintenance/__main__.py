"""`python -m kafkalog_ds.maintenance ROOT [options]`: `kafkalog maintain ROOT --once [options]`, parsed by
the `kafkalog maintain` parser (spark-submit this file for a pass as a Spark job on a cluster)."""

from __future__ import annotations

import sys

from kafkalog_ds.cli import main as kafkalog


def main(argv: list[str] | None = None) -> int:
    return kafkalog(["maintain", *(sys.argv[1:] if argv is None else argv), "--once"])


if __name__ == "__main__":
    sys.exit(main())
