"""Real Kafka's jars, resolved once with Maven into a cache outside the repository.

Two kinds of classpath: the Kafka broker with its tools and clients (kafka-pom.xml), one per Kafka version the
tests run (KAFKA_VERSIONS: the newest 4.x and the last 3.x line), and Spark's Kafka connector for the installed
pyspark (spark-kafka-pom.xml). The cache is `$KAFKALOG_JARS_DIR`, else
`$XDG_CACHE_HOME/kafkalog-ds/jars`, else `~/.cache/kafkalog-ds/jars`; a directory is only used once a
`.complete` file says Maven finished filling it, so an interrupted resolution is redone.

    python tools/realkafka/jars.py     resolve them all (what .ci/run does), print the directories
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
KAFKA_POM = HERE / "kafka-pom.xml"
CONNECTOR_POM = HERE / "spark-kafka-pom.xml"
# Maven Central serves Spark's artifacts up to 4.2.0: a newer pyspark gets the newest connector served
# (tests/spark/test_kafka_connector_side_by_side.py runs it there and docs/spark.md says how that was checked).
NEWEST_CONNECTOR = "4.2.0"
# The brokers the tests run, newest first: every `kafka_broker` test runs on each (tests/conftest.py). The newest
# is the default everywhere a version is not named (benchmarks, the docs' Kafka installation, the connector tests).
KAFKA_VERSIONS = ("4.4.0", "3.9.1")
NEWEST_KAFKA = KAFKA_VERSIONS[0]
NEEDS = (
    "the real-Kafka tests need Java 17 and Maven (`java`, `mvn` on PATH) to fetch Kafka "
    f"{' and '.join(KAFKA_VERSIONS)} and Spark's Kafka connector from Maven Central"
)


class Unavailable(RuntimeError):
    """Java or Maven is missing, or Maven could not resolve the jars."""


def cache_dir() -> Path:
    if os.environ.get("KAFKALOG_JARS_DIR"):
        return Path(os.environ["KAFKALOG_JARS_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kafkalog-ds" / "jars"


def missing_tools() -> list[str]:
    return [tool for tool in ("java", "javac", "mvn") if shutil.which(tool) is None]


def _resolve(pom: Path, name: str, properties: dict[str, str]) -> Path:
    """Copy the pom's runtime dependencies into cache/name-<hash of the pom and properties>/."""
    key = hashlib.sha256(pom.read_bytes() + repr(sorted(properties.items())).encode()).hexdigest()[:12]
    out = cache_dir() / f"{name}-{key}"
    if (out / ".complete").exists():
        return out
    if missing_tools():
        raise Unavailable(f"{NEEDS}; missing: {', '.join(missing_tools())}")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = [
        "mvn",
        "-B",
        "-q",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={out}",
        *(f"-D{k}={v}" for k, v in properties.items()),
    ]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        shutil.rmtree(out, ignore_errors=True)
        tail = "\n".join(done.stdout.splitlines()[-15:])
        raise Unavailable(f"Maven could not resolve {pom.name} ({properties}):\n{tail}")
    (out / ".complete").write_text(" ".join(cmd) + "\n")
    return out


def kafka_dir(version: str = NEWEST_KAFKA) -> Path:
    """The directory of a Kafka version's classpath: kafka_2.13, kafka-tools, kafka-clients and their dependencies."""
    return _resolve(KAFKA_POM, f"kafka-{version}", {"kafka.version": version})


def kafka_classpath(version: str = NEWEST_KAFKA) -> str:
    return str(kafka_dir(version) / "*")


def connector_version(pyspark_version: str) -> str:
    """The connector for this pyspark: its own version where Maven Central serves it, else the newest served."""
    major_minor = tuple(int(p) for p in pyspark_version.split(".")[:2])
    newest = tuple(int(p) for p in NEWEST_CONNECTOR.split(".")[:2])
    return NEWEST_CONNECTOR if major_minor > newest else pyspark_version.split("+")[0]


def connector_jars(pyspark_version: str | None = None) -> list[str]:
    """spark-sql-kafka-0-10 and what it needs beyond Spark itself, for `spark.jars`."""
    if pyspark_version is None:
        import pyspark

        pyspark_version = pyspark.__version__
    out = _resolve(CONNECTOR_POM, "spark-kafka", {"spark.version": connector_version(pyspark_version)})
    return sorted(str(p) for p in out.glob("*.jar"))


def main() -> int:
    try:
        for version in KAFKA_VERSIONS:
            print(f"kafka {version}:", kafka_dir(version))
        print("spark-kafka:", ",".join(connector_jars()))
    except Unavailable as e:
        print(f"realkafka: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
