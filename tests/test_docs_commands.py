"""Every command and snippet of README.md and docs/*.md works when pasted, in order, as a reader would.

A snippet is a ```bash or ```python block (untagged blocks are outputs, layouts or synopses). Each one
either runs here or is marked in its doc by an HTML comment on the line before it,
`<!-- not run: REASON -->`; the marked ones are exactly NOT_RUN below, and `test_every_snippet_*` keeps
every other snippet inside one of the runs:

- README.md, "The `kafkalog` command", docs/cli.md (the quick tour, then each subcommand's example) and
  docs/maintenance.md's bash blocks: each ```bash block run whole by bash with `set -e -o pipefail`, cwd
  a fresh temporary directory, `kafkalog` on PATH as this checkout's `python -m kafkalog_ds`, TMPDIR
  inside it. A line the docs mark as failing (`|| echo "exit code $?"`) must fail with exit code 1 (an
  error, as docs/cli.md's exit codes say); every other command must succeed (set -e).
- docs/maintenance.md: its first bash block (its `--spark` line starts a Spark of its own, about 27 s on a
  busy 2-core machine: marked `spark`), then its ```python block by python as a script, in the same
  directory; its S3 block alone, as pasted but for the port: it starts moto's S3 server itself (on a free
  port instead of 9000), creates its bucket with curl and stops the server;
- README.md, "From Python": its ```python block as a fresh script, then a maintenance pass that must keep
  its records;
- README.md, "Spark", and docs/spark.md: each doc's ```python blocks run in order in one namespace, as a
  reader pasting them one after the other into one Python session, in the tests' one SparkSession (the
  snippets' `SparkSession.builder.getOrCreate()` returns it). A streaming query a snippet starts runs until
  it has committed rows (what the next snippet, a read, waits for) and is then stopped. Marked `spark`.
- docs/tables.md: its ```bash and ```python blocks in order in one directory (a topic kept as a table, read
  back with DuckDB, pyiceberg, pandas and Polars);
- docs/kafka-broker.md: its ```bash blocks in order in one bash, in a directory laid out as Kafka's installation
  (tools/realkafka/kafka_home.py) whose broker runs before the first block; the doc's stated results are
  asserted. Marked `kafka`.

The reader's own paths are replaced in one place, `substitute`: `/data/` by a temporary directory, and
`s3://bucket/` with its endpoint `http://127.0.0.1:9000` by a fresh prefix of the tests' S3 server (moto);
docs/maintenance.md's S3 block, which starts a server of its own, only gets a free port (`maintenance_s3_block`);
docs/kafka-broker.md's broker places (its log dir, `localhost:9092`, the staging directory) in
`substitute_broker`.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid

import pyarrow as pa
import pytest

from storage.log_manager import LogManager
from storage.records.record_batch import CompressionType
from storage.staging.record_stager import RecordStager
from storage.staging.staged_commit import commit_staged
from storage.topic_partition import TopicPartition
from tests.helpers import REPO
from tools.realkafka.kafka_home import KafkaHome
from tools.s3_server import BUCKET

FAIL_MARK = '|| echo "exit code $?"'

# (doc, how the snippet's first line starts, reason): every snippet marked `<!-- not run: ... -->`, in order,
# and no other.
NOT_RUN = [
    (
        "README.md",
        "python -m pip install -U pip && python -m pip install -e '.[test]'",
        "installs into the current Python (pip) and runs the demo for minutes; "
        "tests/test_examples.py runs the demo (the long tier)",
    ),
    (
        "README.md",
        "python -m pytest tests/storage/test_fuzz.py --fuzz-long",
        "the test suite's own long runs (minutes to hours each)",
    ),
    (
        "docs/kafka-broker.md",
        "curl -O https://archive.apache.org/dist/kafka/",
        "downloads and starts a Kafka broker; the test runs the Procedure against one laid out from Kafka's Maven "
        "jars (tools/realkafka/kafka_home.py), formatted and started as these lines do",
    ),
    (
        "docs/tables.md",
        "spark = (",
        "Spark 4.1 with Iceberg's runtime jars at the reader's paths; tests/storage/tables/test_table_spark_iceberg.py "
        "reads these ways",
    ),
]

SNIPPET = re.compile(
    r"^(?:<!-- not run: (?P<reason>.+?) -->\n)?```(?P<lang>bash|python)\n(?P<body>.*?)^```", re.S | re.M
)


def read_doc(doc: str) -> str:
    with open(os.path.join(REPO, doc)) as f:
        return f.read()


def all_docs() -> list[str]:
    docs = sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "*.md")))
    return ["README.md", *docs]


def snippets(text: str) -> list[tuple[str, str, str | None]]:
    """(lang, body, not-run reason or None) of every ```bash / ```python block, in order."""
    return [(m["lang"], m["body"], m["reason"]) for m in SNIPPET.finditer(text)]


def bash_blocks(text: str) -> list[str]:
    return [body for lang, body, _ in snippets(text) if lang == "bash"]


def python_blocks(text: str) -> list[str]:
    return [body for lang, body, _ in snippets(text) if lang == "python"]


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    nxt = text.find("\n## ", start + len(heading))
    return text[start:] if nxt < 0 else text[start:nxt]


def readme_blocks() -> list[str]:
    return bash_blocks(section(read_doc("README.md"), "## The `kafkalog` command"))


CLI_SECTIONS = (
    "topics",
    "produce",
    "consume",
    "dump-log",
    "describe",
    "delete-records",
    "maintain",
    "table",
    "export-to-broker",
)


def cli_doc_blocks() -> dict[str, str]:
    """docs/cli.md's runnable blocks by where they are: the quick tour, then each subcommand's section."""
    text = read_doc("docs/cli.md")
    out = {"quick tour": bash_blocks(text[text.index("A quick tour") : text.index("\n## ")])[0]}
    for name in CLI_SECTIONS:
        blocks = bash_blocks(section(text, f"\n## {name}\n"))
        assert len(blocks) == 1, name
        out[name] = blocks[0]
    return out


def run_by_tests() -> dict[str, list[str]]:
    """The snippets the tests below run, by doc."""
    readme = read_doc("README.md")
    return {
        "README.md": readme_blocks()
        + python_blocks(section(readme, "## From Python"))
        + python_blocks(section(readme, "## Spark")),
        "docs/cli.md": list(cli_doc_blocks().values()),
        "docs/maintenance.md": [body for _, body, _ in snippets(read_doc("docs/maintenance.md"))],
        "docs/spark.md": python_blocks(read_doc("docs/spark.md")),
        "docs/kafka-broker.md": broker_doc_blocks(),
        "docs/tables.md": [body for _, body, reason in snippets(read_doc("docs/tables.md")) if reason is None],
    }


def substitute(text: str, tmp, s3=None) -> str:
    """The one substitution of the reader's places by the test's: `/data/` (Spark snippets) becomes a
    temporary directory; `s3://bucket/` and its endpoint a fresh prefix of the tests' S3 server."""
    out = text.replace("/data/", f"{tmp}/data/")
    if "s3://bucket/" in out:
        assert s3 is not None, "a snippet on s3://bucket/ needs the s3_server fixture"
        prefix = f"s3://{BUCKET}/docs-{uuid.uuid4().hex[:12]}/"
        out = out.replace("s3://bucket/", prefix).replace("http://127.0.0.1:9000", s3.endpoint_url)
    return out


def test_every_snippet_runs_here_or_is_marked_not_run_with_its_reason():
    ran = run_by_tests()
    marked, unrun = [], []
    for doc in all_docs():
        # a snippet spelled ```sh, ```console or ```py would slip past the runs
        langs = set(re.findall(r"^```(\w+)\n.*?^```", read_doc(doc), flags=re.S | re.M))
        assert langs <= {"bash", "python", "json"}, f"{doc}: fenced blocks in {langs}: use bash or python"
        for lang, body, reason in snippets(read_doc(doc)):
            if reason is not None:
                marked.append((doc, body.splitlines()[0], reason))
                assert body not in ran.get(doc, []), f"{doc}: a snippet marked not run is run: {body[:200]}"
            elif body not in ran.get(doc, []):
                unrun.append((doc, lang, body[:300]))
    assert not unrun, f"snippets neither run by a test nor marked <!-- not run: ... -->: {unrun}"
    assert len(marked) == len(NOT_RUN), f"marked not run: {marked}"
    for (doc, line, reason), (known_doc, start, known_reason) in zip(marked, NOT_RUN, strict=True):
        assert (doc, reason) == (known_doc, known_reason) and line.startswith(start), (doc, line, reason)


def run_block(block: str, cwd, path_dir) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PATH": str(path_dir) + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONPATH": REPO,
        "TMPDIR": str(cwd),
    }
    env.pop("PYTHONSTARTUP", None)
    return subprocess.run(
        ["bash", "-c", "set -e -o pipefail\n" + block], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture
def shell(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "kafkalog"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m kafkalog_ds "$@"\n')
    shim.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    return work, bin_dir


def check(block: str, p: subprocess.CompletedProcess, where: str) -> None:
    assert p.returncode == 0, (
        f"{where}: exit {p.returncode}\n{block}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
    )
    assert "Traceback" not in p.stderr, f"{where}: {p.stderr[-3000:]}"
    expected = block.count(FAIL_MARK)
    codes = re.findall(r"^exit code (\d+)$", p.stdout, flags=re.M)
    assert codes == ["1"] * expected, f"{where}: expected {expected} documented failure(s), got {codes}\n{p.stderr}"


def test_readme_kafkalog_commands_work_pasted_in_order(shell):
    work, bin_dir = shell
    (block,) = readme_blocks()
    p = run_block(block, work, bin_dir)
    check(block, p, "README.md")
    # the dump-log of events-0, a partition no record went to, prints an empty log
    assert "Dumping ./logs/events-0/00000000000000000000.log\nLog starting offset: 0\n" in p.stdout
    assert '"value": "hello"' in p.stdout and "maintenance pass: 3 partition(s), 0 failed" in p.stdout


@pytest.mark.parametrize("name", ["quick tour", *CLI_SECTIONS])
def test_cli_doc_commands_work_pasted_in_order(shell, name):
    work, bin_dir = shell
    block = cli_doc_blocks()[name]
    check(block, run_block(block, work, bin_dir), f"docs/cli.md {name}")


def maintenance_doc_blocks() -> tuple[str, str, str]:
    """docs/maintenance.md's blocks: the local bash block, the python block, the S3 bash block."""
    blocks = snippets(read_doc("docs/maintenance.md"))
    assert [lang for lang, _, _ in blocks] == ["bash", "python", "bash"]
    (_, bash, _), (_, python, _), (_, s3, _) = blocks
    return bash, python, s3


def maintenance_s3_block(port: int) -> str:
    """The S3 block with its server on `port` instead of 9000 (another may hold 9000), and every job it
    started (the server) stopped when the block fails before its last line, `kill %1`."""
    block = maintenance_doc_blocks()[2]
    out = block.replace("-p 9000 ", f"-p {port} ").replace("127.0.0.1:9000", f"127.0.0.1:{port}")
    assert "9000" not in out, out
    return "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.spark  # its bash block runs `python -m kafkalog_ds.maintenance ./logs --spark`
def test_maintenance_doc_snippets_run_as_pasted_in_order(shell):
    """The local bash block (and as a Spark job), then the python block as a script, in one directory."""
    work, bin_dir = shell
    bash, python, _ = maintenance_doc_blocks()
    p = run_block(substitute(bash, work), work, bin_dir)
    check(bash, p, "docs/maintenance.md bash block")
    assert p.stdout.count("maintenance pass: 1 partition(s), 0 failed") == 2, p.stdout
    env = {**os.environ, "PYTHONPATH": REPO, "TMPDIR": str(work)}
    env.pop("PYTHONSTARTUP", None)
    p = subprocess.run([sys.executable, "-c", python], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "Traceback" not in p.stderr, (
        f"docs/maintenance.md python block: exit {p.returncode}\n{python}\nstderr:\n{p.stderr[-3000:]}"
    )
    assert p.stdout.startswith("changelog-0: ok;"), p.stdout  # the pass ran over the topic it names


def test_maintenance_doc_s3_block_runs_as_pasted(shell):
    """docs/maintenance.md's S3 block needs nothing the reader lacks: it starts moto's S3 server, creates the
    bucket, runs the commands on it (a topic, two passes) and stops the server."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    if shutil.which("curl") is None:
        pytest.skip("docs/maintenance.md's S3 block creates its bucket with curl, which is not on PATH")
    work, bin_dir = shell
    block = maintenance_s3_block(free_port())
    p = run_block(block, work, bin_dir)
    check(block, p, "docs/maintenance.md S3 block")
    assert p.stdout.startswith("Created topic events.\n"), p.stdout
    assert p.stdout.count("maintenance pass: 1 partition(s), 0 failed") == 2, p.stdout


def test_tables_doc_snippets_run_as_pasted_in_order(shell):
    """docs/tables.md: its bash and python blocks in order in one directory, as a reader pastes them."""
    work, bin_dir = shell
    for lang, body, reason in snippets(read_doc("docs/tables.md")):
        if reason is not None:
            continue
        if lang == "bash":
            check(body, run_block(body, work, bin_dir), "docs/tables.md bash block")
            continue
        script = work / "snippet.py"
        script.write_text(body)
        env = {**os.environ, "PYTHONPATH": REPO}
        cmd = [sys.executable, str(script)]
        p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, f"docs/tables.md python block: exit {p.returncode}\n{body}\n{p.stderr[-3000:]}"


def test_readme_python_snippet_runs_as_pasted_and_its_records_survive_maintenance(tmp_path):
    """README "From Python": run as a fresh script; its records carry timestamps of now, so a maintenance pass
    under the default retention (7 days) keeps them."""
    (block,) = python_blocks(section(read_doc("README.md"), "## From Python"))
    env = {**os.environ, "PYTHONPATH": REPO, "TMPDIR": str(tmp_path)}
    env.pop("PYTHONSTARTUP", None)
    run = dict(cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    p = subprocess.run([sys.executable, "-c", block], **run)
    assert p.returncode == 0 and "Traceback" not in p.stderr, f"README python block: {p.stderr[-3000:]}"
    assert "'value': [b'v1', b'v2']" in p.stdout
    kafkalog = [sys.executable, "-m", "kafkalog_ds"]
    assert subprocess.run(kafkalog + ["maintain", "./logs", "--once"], **run).returncode == 0
    out = subprocess.run(kafkalog + ["consume", "./logs", "--topic", "events", "--offset", "earliest"], **run)
    assert len(out.stdout.splitlines()) == 2, out.stdout + out.stderr


def stop_once_rows_committed(query, limit_s: float = 300.0) -> None:
    """What a reader waits for before the next snippet: the query has committed a micro-batch with rows
    (Spark reports a batch's progress after its commit). Then it is stopped, as a reader would."""
    deadline = time.monotonic() + limit_s
    while not any(p["numInputRows"] for p in query.recentProgress):
        assert query.isActive, f"the query ended before committing rows: {query.exception()}"
        assert time.monotonic() < deadline, f"no rows committed in {limit_s} s: {query.lastProgress}"
        query.awaitTermination(0.5)  # returns at once if the query fails
    query.stop()


def run_python_in_order(doc: str, blocks: list[str], spark, tmp) -> dict:
    """Run a doc's python blocks in order in one namespace, with the substitution; return the namespace."""
    namespace: dict = {"__name__": "__main__"}
    for i, block in enumerate(blocks):
        before = {q.id for q in spark.streams.active}
        exec(compile(substitute(block, tmp), f"{doc} python block {i}", "exec"), namespace)
        for query in spark.streams.active:
            if query.id not in before:
                stop_once_rows_committed(query)
    return namespace


@pytest.mark.spark
def test_readme_spark_snippets_run_as_pasted_in_order(spark_session, tmp_path):
    blocks = python_blocks(section(read_doc("README.md"), "## Spark"))
    assert len(blocks) == 2
    namespace = run_python_in_order("README.md", blocks, spark_session, tmp_path)
    assert namespace["spark"] is spark_session
    assert namespace["df"].count() > 0  # the read found what the stream wrote
    assert (tmp_path / "data" / "logs" / "events-0").is_dir()  # where the substitution put /data/logs


@pytest.mark.spark
def test_spark_doc_snippets_run_as_pasted_in_order(spark_session, tmp_path):
    blocks = python_blocks(read_doc("docs/spark.md"))
    assert len(blocks) == 3
    namespace = run_python_in_order("docs/spark.md", blocks, spark_session, tmp_path)
    values = {bytes(r.value) for r in namespace["df"].collect()}  # the last snippet's read_committed read
    assert {b"hello", b"world"} <= values and len(values) > 2  # the batch write's rows and the stream's
    assert (tmp_path / "data" / "ckpt" / "events" / "commits").is_dir()


# ---- docs/kafka-broker.md: the hand-over to a real broker, in a directory laid out as Kafka's installation ----

BROKER_DOC = "docs/kafka-broker.md"
BROKER_DOC_TOPIC = "events"
BROKER_DOC_T0 = 1_699_999_850_000  # records 1 s apart from here: the doc's 1700000000000 falls inside
BLOCK_MARK = "@@ kafka-broker.md block "


def broker_doc_blocks() -> list[str]:
    """docs/kafka-broker.md's bash blocks but its Prerequisites (marked not run: a Kafka download)."""
    return [body for lang, body, reason in snippets(read_doc(BROKER_DOC)) if lang == "bash" and reason is None]


def substitute_broker(text: str, tmp, home) -> str:
    """docs/kafka-broker.md's places: `substitute`'s (ROOT=/data/logs), then the broker's log dir
    (LOGDIR=/var/lib/kafka/data), its address (BOOTSTRAP=localhost:9092, a free port) and the staging dir."""
    return (
        substitute(text, tmp)
        .replace("/var/lib/kafka/data", str(home.log_dir))
        .replace("localhost:9092", home.bootstrap)
        .replace("/tmp/events-export", f"{tmp}/events-export")
    )


def write_broker_doc_topic(root: str) -> dict[int, int]:
    """ROOT's topic `events`: 3 partitions, 300 records through `kafkalog produce` (keys, headers, timestamps
    around 1700000000000), then two transactions through the sink's commit path; returns the log end offsets."""
    LogManager(root).create_topic(BROKER_DOC_TOPIC, 3, {"retention.ms": "-1"})
    lines = [
        json.dumps(
            {
                "key": f"key-{i}",
                "value": f"value-{i}",
                "timestamp": BROKER_DOC_T0 + i * 1000,
                "partition": i % 3,
                "headers": [["n", str(i)]] if i % 7 == 0 else [],
            }
        )
        for i in range(300)
    ]
    env = {**os.environ, "PYTHONPATH": REPO}
    produce = [sys.executable, "-m", "kafkalog_ds", "produce", root, "--topic", BROKER_DOC_TOPIC, "--batch-size", "40"]
    done = subprocess.run(produce, input="\n".join(lines) + "\n", env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    writer = 4242
    for batch_id in range(2):  # each a transaction: data batches, then a COMMIT marker per partition
        lm = LogManager(root)
        stager = RecordStager(lm, writer, topic=BROKER_DOC_TOPIC, compression=CompressionType.NONE)
        n = 30
        stager.add(
            pa.table(
                {
                    "key": pa.array([f"txn-{batch_id}-{i}".encode() for i in range(n)], pa.binary()),
                    "value": pa.array([f"value-txn-{batch_id}-{i}".encode() for i in range(n)], pa.binary()),
                    "timestamp": pa.array(
                        [BROKER_DOC_T0 + 400_000 + batch_id * 60_000 + i for i in range(n)], pa.timestamp("ms", "UTC")
                    ),
                    "partition": pa.array([i % 3 for i in range(n)], pa.int32()),
                }
            )
        )
        commit_staged(lm, writer, batch_id, [stager.finish()], transactional=True)
    lm = LogManager(root)
    ends = {}
    for p in range(3):
        with lm.open_log(TopicPartition(BROKER_DOC_TOPIC, p)) as log:
            ends[p] = log.log_end_offset
    return ends


def wait_until(condition, what: str, limit_s: float = 180.0) -> None:
    """A hang guard only: poll a condition until it holds."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"no sign of {what} after {limit_s:.0f} s"
        time.sleep(0.1)


def block_outputs(stdout: str) -> list[str]:
    parts = re.split(rf"^{re.escape(BLOCK_MARK)}\d+\n", stdout, flags=re.M)
    return parts[1:]


@pytest.mark.kafka
def test_kafka_broker_doc_hand_over_runs_as_pasted_in_order(shell, tmp_path):
    """docs/kafka-broker.md's bash blocks, in order, in one bash (as pasted into one terminal), in a directory
    laid out as Kafka's installation (tools/realkafka/kafka_home.py: bin/ shims running Kafka 4.4's own main
    classes, config/server.properties for one KRaft node, Kafka's log4j2.yaml writing logs/server.log), with
    the broker running, as the doc's cluster is, before the first block. The doc's stated results hold:
    the export's TopicId is the cluster's, the broker loads each partition without a WARN or ERROR, its
    offsets (earliest, latest, by time) are kafkalog's, the console consumer prints 5 records."""
    _, bin_dir = shell
    home = KafkaHome(tmp_path / "kafka", tmp_path / "kafka-data").build()
    root = f"{tmp_path}/data/logs"
    ends = write_broker_doc_topic(root)
    home.format()
    try:
        home.run("kafka-server-start.sh", "-daemon", "config/server.properties")
        wait_until(
            lambda: home.pid() is None or "Kafka Server started" in home.server_log_text(),
            "the broker's start",
        )
        assert home.pid() is not None, (home.home / "logs" / "kafkaServer.out").read_text()[-3000:]

        blocks = broker_doc_blocks()
        assert len(blocks) == 9
        script = "".join(f'echo "{BLOCK_MARK}{i}"\n{block}' for i, block in enumerate(blocks))
        p = run_block(substitute_broker(script, tmp_path, home), home.home, bin_dir)
        check(script, p, BROKER_DOC)
    finally:
        home.kill()

    out = block_outputs(p.stdout)
    assert len(out) == 9, p.stdout
    topic_id = (home.log_dir / "events-0" / "partition.metadata").read_text().split("topic_id: ")[1].strip()
    assert f"Exported 3 partition(s) of topic events (TopicId {topic_id})" in out[5]  # step 4, read from the dirs
    assert f"(TopicId {topic_id})" in out[6]  # the staging variant, given $TOPIC_ID from step 2
    assert ".kafka_cleanshutdown" in out[4]

    verify = out[8].splitlines()
    loads = [line for line in verify if "Completed load of Log(dir=" in line]
    assert len(loads) == 3, out[8]
    for line in loads:
        part = int(re.search(r"partition=(\d+)", line)[1])
        assert f"logEndOffset={ends[part]})" in line, (line, ends)
    assert "none" in verify  # the grep for WARN, ERROR, recovery, stray: nothing
    offsets = [line for line in verify if re.fullmatch(r"events:\d+:\d*", line)]
    assert len(offsets) == 9, out[8]
    start, end, by_time = ({int(x.split(":")[1]): x.split(":")[2] for x in offsets[i : i + 3]} for i in (0, 3, 6))
    assert start == {0: "0", 1: "0", 2: "0"}
    assert end == {p: str(e) for p, e in ends.items()}
    consumed = [line for line in verify if line.startswith("value-")]
    assert len(consumed) == 5, out[8]
    kafkalog = {r["partition"]: str(r["offset"]) for r in map(json.loads, (x for x in verify if x.startswith("{")))}
    assert by_time == kafkalog and len(kafkalog) == 3, (by_time, kafkalog)
    # what the doc says step 6's log shows before the Completed load lines
    assert f"Skipping recovery of 3 logs from {home.log_dir} since clean shutdown file was found" in (
        home.server_log_text()
    )
