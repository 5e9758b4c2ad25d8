"""Shared fixtures: a fresh log dir on local disk and in fsspec's memory store, the S3 server, the Kafka broker.

tests/ is a package (tests/__init__.py), so pytest puts the repository root on sys.path and test modules
import what they share as `tests.helpers...` and `tools.realkafka...`.
"""

import logging
import os
import sys
import uuid

# Spark's Python workers must run this interpreter (with this package installed), and pytest-spark
# starts the JVM in pytest_configure, so this happens at import time.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

import pytest  # noqa: E402

from tools.realkafka import jars  # noqa: E402
from tools.s3_server import ACCESS_KEY, BUCKET, REGION, SECRET_KEY, S3Server  # noqa: E402


@pytest.fixture(autouse=True)
def _memory_store_emptied_of_what_each_test_wrote():
    """fsspec's memory store is one dict per process, and its exists() scans every key: left to grow over
    the suite, it made the crash-matrix tests 2-3x slower than alone. Each test's new files go after it."""
    from fsspec.implementations.memory import MemoryFileSystem

    files, dirs = set(MemoryFileSystem.store), set(MemoryFileSystem.pseudo_dirs)
    yield
    for k in set(MemoryFileSystem.store) - files:
        MemoryFileSystem.store.pop(k, None)
    MemoryFileSystem.pseudo_dirs[:] = [d for d in MemoryFileSystem.pseudo_dirs if d in dirs]


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "logs")


@pytest.fixture(params=["local", "memory"])
def any_root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "logs")
    return f"memory://kl-{uuid.uuid4().hex}"


@pytest.fixture(scope="session")
def s3_server():
    """A running S3Server for the whole session, with dummy AWS credentials in the environment."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_CONFIG_FILE": os.devnull,
        }.items():
            mp.setenv(k, v)
        mp.delenv("AWS_SESSION_TOKEN", raising=False)
        mp.delenv("AWS_PROFILE", raising=False)
        server = S3Server().start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def s3_root(s3_server):
    """(url, storage_options) of a fresh prefix in the test bucket: tests never see each other's keys."""
    return f"s3://{BUCKET}/t-{uuid.uuid4().hex[:12]}", s3_server.storage_options


@pytest.fixture
def s3_faults(s3_server):
    """The session's S3Server, with every fault a test added removed (and held requests released) after it."""
    try:
        yield s3_server
    finally:
        s3_server.clear_faults()


def pytest_addoption(parser):
    parser.addoption(
        "--soak",
        type=float,
        default=float(os.environ.get("KAFKALOG_SOAK_SECONDS", "0")),
        metavar="SECONDS",
        help="run the soak tests for this long (tests/spark/test_soak.py; also KAFKALOG_SOAK_SECONDS)",
    )
    parser.addoption(
        "--kill-rounds",
        type=int,
        default=0,
        metavar="N",
        help="driver kills in tests/spark/test_spark_kill.py (default 3; the acceptance run is 20; also "
        "KAFKALOG_KILL_ROUNDS); set, it also runs the driver kill on a cluster (tests/spark/test_spark_cluster.py)",
    )
    parser.addoption(
        "--table-kills",
        type=int,
        default=0,
        metavar="N",
        help="materialization passes SIGKILLed in tests/storage/tables/test_table_kill.py (default 6) and, set, "
        "Spark executors killed in tests/storage/tables/test_table_spark_kill.py (a cluster run, not in the default "
        "suite); the acceptance run is 20; also KAFKALOG_TABLE_KILLS",
    )
    parser.addoption(
        "--benchmarks",
        action="store_true",
        default=False,
        help="run every script in benchmarks/ at its smallest settings (tests/test_benchmarks.py; also "
        "KAFKALOG_BENCHMARKS=1; .ci/run does)",
    )
    parser.addoption(
        "--long",
        action="store_true",
        default=False,
        help="also run the tests marked `long` (kill/restart loops, a Spark cluster, whole example programs: "
        "minutes each), which the default suite skips; also KAFKALOG_LONG=1; .ci/run runs them as a step",
    )
    parser.addoption(
        "--fuzz-long",
        action="store_true",
        default=False,
        help="run the long mutation fuzzer (tests/storage/test_fuzz.py; also KAFKALOG_FUZZ_LONG=1)",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "fuzz_long: the long mutation-fuzzer run (--fuzz-long or KAFKALOG_FUZZ_LONG=1)")


def _kafka_required() -> bool:
    """On CI (.ci/run sets KAFKALOG_REQUIRE_KAFKA=1) the real-Kafka tests must run: missing tools are an error."""
    return os.environ.get("KAFKALOG_REQUIRE_KAFKA") == "1"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """`long` tests are skipped unless asked for; selected `kafka` tests get the jars (resolved once with Maven)
    and the connector in `spark.jars`.

    Last of the hooks, so `items` is what `-m` and `-k` kept: a run that selects no `kafka` test (the
    iceberg_spark run on pyspark 4.1 in .ci/run) resolves no connector. This runs before any SparkSession
    starts, so the shared session carries Spark's Kafka connector when, and only when, a test that needs
    it was selected.
    """
    if not (config.getoption("--long") or os.environ.get("KAFKALOG_LONG") == "1"):
        skip_long = pytest.mark.skip(reason="a long run (minutes): pass --long or set KAFKALOG_LONG=1 (.ci/run does)")
        for item in items:
            if item.get_closest_marker("long"):
                item.add_marker(skip_long)
    selected = [item for item in items if item.get_closest_marker("kafka") and not item.get_closest_marker("skip")]
    if not selected:
        return
    try:
        jars.kafka_dir()
        connector = jars.connector_jars()
    except jars.Unavailable as e:
        if _kafka_required():
            raise pytest.UsageError(f"real-Kafka tests cannot run: {e}") from None
        skip = pytest.mark.skip(reason=jars.NEEDS)
        for item in selected:
            item.add_marker(skip)
        return
    from pytest_spark.config import SparkConfigBuilder

    SparkConfigBuilder.get().set("spark.jars", ",".join(connector))


_BROKER = []  # the session's broker, once a test asked for it (its log is quoted when such a test fails)


@pytest.fixture(scope="session")
def kafka_broker_session(tmp_path_factory):
    """The session's KRaft broker, shared by every kafka test. Tests may stop it, so it is not always running:
    use `kafka_broker`, or `.ensure_running()` in a module-scoped fixture."""
    from tools.realkafka.broker import KafkaBroker, tool_classes

    tool_classes()
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka-broker"))
    _BROKER.append(broker)
    yield broker
    broker.stop()


@pytest.fixture
def kafka_broker(kafka_broker_session):
    """The session's KRaft broker, running (started again if a test stopped it)."""
    return kafka_broker_session.ensure_running()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that used the broker quotes the end of the broker's log."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and _BROKER and "kafka_broker_session" in getattr(item, "fixturenames", ()):
        report.sections.append(("kafka broker log", _BROKER[0].log_tail(60)))
