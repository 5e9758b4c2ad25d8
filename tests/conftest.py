"""Shared fixtures: a fresh log dir on local disk and in fsspec's memory store, the S3 server, the Kafka brokers.

tests/ is a package (tests/__init__.py), so pytest puts the repository root on sys.path and test modules
import what they share as `tests.helpers...` and `tools.realkafka...`.
"""

import itertools
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


# ---------------------------------------------------------------- the Kafka brokers, one per version
#
# Every test that uses `kafka_broker_session` or `kafka_broker` (itself or through its fixtures) runs once per
# Kafka version of jars.KAFKA_VERSIONS (4.4.0, the newest; 3.9.1, the last 3.x line), its id naming the broker:
# `test_x[4.4.0]`, `test_x[3.9.1]`. Each version has one broker for the whole session, started when a test first
# asks for it and stopped after the last selected test that uses it.
#
# The version is a module-scoped parameter, so a module's tests run on 4.4.0, then on 3.9.1, in their order, and a
# module fixture that does not use the broker (a Spark input, a source log) is made once for both. A fixture that
# uses the broker is made once per version; it must be module- (or function-) scoped, not session-scoped.
#
# The default run keeps its time budget: there, the older versions run only the tests marked `every_broker` (a
# cheap, telling subset); the rest of their items are deselected. A run whose marker expression names `kafka`
# (`-m kafka`; .ci/run runs `-m "kafka and not every_broker" -k 3.9.1` as a step), or that names tests by id
# (`path::test_x[3.9.1]`), runs every test on every version.
# A test pinned to some versions says so with `@pytest.mark.kafka_versions("4.4.0")`; NEWEST_BROKER_ONLY lists
# the modules that compare Spark's Kafka connector with kafkalog's (connectors, not brokers: the newest only).

# (tests/spark/test_spark_connector.py, the other connector comparison, uses no broker)
NEWEST_BROKER_ONLY = ("tests/spark/test_kafka_connector_side_by_side.py",)
_BROKERS: dict = {}  # version -> the session's KafkaBroker of that version, once a test asked for it
_LAST_USE: dict[str, str] = {}  # nodeid -> the version whose broker stops after that test (its last selected user)


def _broker_versions(metafunc) -> tuple[str, ...]:
    marker = metafunc.definition.get_closest_marker("kafka_versions")
    if marker is not None:
        unknown = [v for v in marker.args if v not in jars.KAFKA_VERSIONS]
        if unknown or not marker.args:
            raise pytest.UsageError(
                f"{metafunc.definition.nodeid}: kafka_versions{marker.args} names none or "
                f"unknown versions; the tests' versions are {jars.KAFKA_VERSIONS}"
            )
        return tuple(marker.args)
    module = metafunc.definition.path.relative_to(metafunc.config.rootpath).as_posix()
    return (jars.NEWEST_KAFKA,) if module in NEWEST_BROKER_ONLY else jars.KAFKA_VERSIONS


def pytest_generate_tests(metafunc):
    if "kafka_broker_session" not in metafunc.fixturenames:
        return
    if any("kafka_broker_session" in str(m.args[0]) for m in metafunc.definition.iter_markers("parametrize")):
        return  # the test parametrizes it itself (indirect)
    versions = _broker_versions(metafunc)
    metafunc.parametrize("kafka_broker_session", versions, ids=versions, indirect=True, scope="module")


def _broker_version(item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return None if callspec is None else callspec.params.get("kafka_broker_session")


def _one_version_after_another(items) -> list:
    """Within each module, its broker tests on one version and then on the next (newest first), each version's
    in pytest's order, in the places the module's broker tests had. pytest orders a module's items to switch its
    module-scoped parameters least often, which may go 4.4.0, 3.9.1, 3.9.1, 4.4.0 (tests/storage/
    test_kafka_broker_logs.py: live, then stopped), and a module fixture on the broker would be made twice for
    one version, on a broker that already holds what it made."""
    rank = {v: i for i, v in enumerate(jars.KAFKA_VERSIONS)}
    out = []
    for _, module in itertools.groupby(items, key=lambda item: item.path):
        group = list(module)
        slots = [i for i, item in enumerate(group) if _broker_version(item) is not None]
        ordered = sorted((group[i] for i in slots), key=lambda item: rank.get(_broker_version(item) or "", 0))
        for i, item in zip(slots, ordered, strict=True):
            group[i] = item
        out += group
    return out


def _every_broker(config) -> bool:
    """Every broker test on every version: the marker expression names `kafka` (`-m kafka`), or the command line
    names tests (`path::test_x`, `path::test_x[3.9.1]`)."""
    return "kafka" in (config.getoption("markexpr") or "") or any("::" in str(arg) for arg in config.args)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """`long` tests are skipped unless asked for; the older brokers' items not marked `every_broker` are
    deselected unless the run selects `-m kafka`; selected `kafka` tests get the jars (resolved once with
    Maven, for each version a selected test uses) and the connector in `spark.jars`.

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
    if not _every_broker(config):
        older = [
            item
            for item in items
            if _broker_version(item) not in (None, jars.NEWEST_KAFKA) and not item.get_closest_marker("every_broker")
        ]
        if older:
            config.hook.pytest_deselected(items=older)
            dropped = set(older)
            items[:] = [item for item in items if item not in dropped]
    items[:] = _one_version_after_another(items)
    last = {_broker_version(item): item.nodeid for item in items}  # each version's last item
    _LAST_USE.clear()
    _LAST_USE.update({nodeid: version for version, nodeid in last.items() if version is not None})
    selected = [item for item in items if item.get_closest_marker("kafka") and not item.get_closest_marker("skip")]
    if not selected:
        return
    try:
        for version in sorted({jars.NEWEST_KAFKA, *(_broker_version(item) or jars.NEWEST_KAFKA for item in selected)}):
            jars.kafka_dir(version)
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


@pytest.fixture(scope="session")
def _kafka_brokers():
    """The session's brokers by version; each stopped at the end if its last user did not stop it."""
    yield _BROKERS
    for broker in _BROKERS.values():
        broker.stop()


@pytest.fixture(scope="session")
def kafka_broker_session(request, _kafka_brokers, tmp_path_factory):
    """The session's KRaft broker of the test's Kafka version (its parameter: `test_x[3.9.1]`), shared by every
    kafka test on that version. Tests may stop it, so it is not always running: use `kafka_broker`, or
    `.ensure_running()` in a module-scoped fixture. Its `version` names the version."""
    from tools.realkafka.broker import KafkaBroker, tool_classes

    version = getattr(request, "param", jars.NEWEST_KAFKA)
    if version not in _kafka_brokers:
        tool_classes(version)
        _kafka_brokers[version] = KafkaBroker(tmp_path_factory.mktemp(f"kafka-{version}-broker"), version=version)
    return _kafka_brokers[version]


@pytest.fixture
def kafka_broker(kafka_broker_session):
    """The session's KRaft broker of the test's Kafka version, running (started again if a test stopped it)."""
    return kafka_broker_session.ensure_running()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """A broker stops after the last selected test that uses it (its module's fixtures are gone by then when the
    next test is in another module): the rest of the suite does not share the machine with an idle JVM."""
    yield
    version = _LAST_USE.get(item.nodeid)
    if version is not None and version in _BROKERS:
        _BROKERS[version].stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that used a broker quotes the end of that broker's log."""
    outcome = yield
    report = outcome.get_result()
    broker = _BROKERS.get(_broker_version(item) or "")
    if report.failed and broker is not None:
        report.sections.append((f"kafka broker log (Kafka {broker.version})", broker.log_tail(60)))
