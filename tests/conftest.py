"""Shared fixtures: a fresh log dir on local disk and in fsspec's memory store."""

import os
import sys
import uuid

# Spark's Python workers must run this interpreter (with this package installed), and pytest-spark
# starts the JVM in pytest_configure, so this happens at import time.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

import pytest  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))  # tests/kafka_reference.py


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "logs")


@pytest.fixture(params=["local", "memory"])
def any_root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "logs")
    return f"memory://kl-{uuid.uuid4().hex}"


def pytest_addoption(parser):
    parser.addoption("--soak", type=float, default=float(os.environ.get("KAFKALOG_SOAK_SECONDS", "0")),
                     metavar="SECONDS", help="run the soak tests for this long (tests/test_soak.py; also "
                     "KAFKALOG_SOAK_SECONDS)")
    parser.addoption("--fuzz-long", action="store_true", default=False,
                     help="run the long mutation fuzzer (tests/test_fuzz.py; also KAFKALOG_FUZZ_LONG=1)")


def pytest_configure(config):
    config.addinivalue_line("markers", "fuzz_long: the long mutation-fuzzer run (--fuzz-long or KAFKALOG_FUZZ_LONG=1)")
