"""Iceberg's jars, resolved once with Maven into the cache tools/realkafka/jars.py uses (outside the repository).

Two classpaths: Iceberg's REST catalog server (rest-catalog-pom.xml; tools/iceberg/rest_catalog.py starts it),
and Iceberg's Spark runtime with a SQLite JDBC driver for `spark.jars` (spark-iceberg-pom.xml). The cache and
its `.complete` rule are realkafka's: see tools/realkafka/jars.py.

    python tools/iceberg/jars.py     resolve both (what .ci/run does), print the directories
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `tools` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tools.realkafka.jars import Unavailable, _resolve, cache_dir, missing_tools

__all__ = [
    "NEEDS",
    "SPARK_MINOR",
    "Unavailable",
    "cache_dir",
    "missing_tools",
    "rest_catalog_classpath",
    "rest_catalog_dir",
    "spark_runtime_jars",
]

HERE = Path(__file__).resolve().parent
REST_POM = HERE / "rest-catalog-pom.xml"
SPARK_POM = HERE / "spark-iceberg-pom.xml"
ICEBERG_SPARK_VERSION = "1.12.0"
# Maven Central serves iceberg-spark-runtime 1.12.0 for Spark 4.1 only (4.0's stopped at 1.11.0, no 4.2 or 4.3
# yet); on pyspark 4.3 the 4.1 runtime fails at the first read (IncompatibleClassChangeError: CatalogManager).
SPARK_MINOR = "4.1"
NEEDS = (
    "the Iceberg tests need Java 17 and Maven (`java`, `javac`, `mvn` on PATH) to fetch Iceberg's REST catalog "
    "server and Spark runtime from Maven Central"
)


def _resolve_here(pom: Path, name: str, properties: dict[str, str]) -> Path:
    """realkafka's _resolve, with this module's reason when Java or Maven is missing."""
    try:
        return _resolve(pom, name, properties)
    except Unavailable:
        if missing_tools():
            raise Unavailable(f"{NEEDS}; missing: {', '.join(missing_tools())}") from None
        raise


def rest_catalog_dir() -> Path:
    """The directory of RESTCatalogServer's classpath (iceberg-open-api 1.11.0 test fixtures, Jetty 12, SQLite)."""
    return _resolve_here(REST_POM, "iceberg-rest", {})


def rest_catalog_classpath() -> str:
    return str(rest_catalog_dir() / "*")


def spark_runtime_jars(pyspark_version: str | None = None) -> list[str]:
    """iceberg-spark-runtime-4.1_2.13 and the SQLite JDBC driver, for `spark.jars`; Spark 4.1 only."""
    if pyspark_version is None:
        import pyspark

        pyspark_version = pyspark.__version__
    minor = ".".join(pyspark_version.split("+")[0].split(".")[:2])
    if minor != SPARK_MINOR:
        raise Unavailable(
            f"Iceberg {ICEBERG_SPARK_VERSION}'s Spark runtime is built for Spark {SPARK_MINOR} only "
            f"(iceberg-spark-runtime-{SPARK_MINOR}_2.13); pyspark here is {pyspark_version}"
        )
    out = _resolve_here(SPARK_POM, "iceberg-spark", {"spark.minor": SPARK_MINOR})
    return sorted(str(p) for p in out.glob("*.jar"))


def main() -> int:
    try:
        print("iceberg-rest:", rest_catalog_dir())
        # resolved for Spark 4.1 whatever pyspark this interpreter has: the Spark tests run in a 4.1 environment
        print("iceberg-spark:", ",".join(spark_runtime_jars(SPARK_MINOR + ".0")))
    except Unavailable as e:
        print(f"iceberg: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
