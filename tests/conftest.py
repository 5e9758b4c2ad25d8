"""Shared fixtures: a fresh log dir on local disk and in fsspec's memory store."""

import os
import sys
import uuid

# Spark's Python workers must run this interpreter (with this package installed), and pytest-spark
# starts the JVM in pytest_configure, so this happens at import time.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

import pytest  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))  # tests/kafka_reference.py, tests/realkafka/

from realkafka import jars  # noqa: E402


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "logs")


@pytest.fixture(params=["local", "memory"])
def any_root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "logs")
    return f"memory://kl-{uuid.uuid4().hex}"


def pytest_addoption(parser):
    parser.addoption(
        "--soak",
        type=float,
        default=float(os.environ.get("KAFKALOG_SOAK_SECONDS", "0")),
        metavar="SECONDS",
        help="run the soak tests for this long (tests/test_soak.py; also KAFKALOG_SOAK_SECONDS)",
    )
    parser.addoption(
        "--kill-rounds",
        type=int,
        default=0,
        metavar="N",
        help="driver kills in tests/test_spark_kill.py (default 6; the acceptance run is 20; also "
        "KAFKALOG_KILL_ROUNDS)",
    )
    parser.addoption(
        "--fuzz-long",
        action="store_true",
        default=False,
        help="run the long mutation fuzzer (tests/test_fuzz.py; also KAFKALOG_FUZZ_LONG=1)",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "fuzz_long: the long mutation-fuzzer run (--fuzz-long or KAFKALOG_FUZZ_LONG=1)")


def _kafka_required() -> bool:
    """On CI (.ci/run sets KAFKALOG_REQUIRE_KAFKA=1) the real-Kafka tests must run: missing tools are an error."""
    return os.environ.get("KAFKALOG_REQUIRE_KAFKA") == "1"


def pytest_collection_modifyitems(config, items):
    """Selected `kafka` tests get the jars (resolved once with Maven) and the connector in `spark.jars`.

    This runs before any SparkSession starts, so the shared session carries Spark's Kafka connector
    when, and only when, a test that needs it was selected.
    """
    selected = [item for item in items if item.get_closest_marker("kafka")]
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
    from realkafka.broker import KafkaBroker, tool_classes

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
