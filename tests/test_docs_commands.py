"""The commands in README.md and docs/cli.md work when pasted, in order, into a shell.

Blocks run (each a ```bash block, run whole by bash with `set -e -o pipefail`, cwd a fresh temporary
directory, `kafkalog` on PATH as this checkout's `python -m kafkalog_ds`, TMPDIR inside it):

- README.md, section "The `kafkalog` command": its one block (topics, produce, consume, dump-log,
  describe, maintain on ./logs);
- docs/cli.md: the quick tour and the examples of topics, produce, consume, dump-log, delete-records
  and describe;
- docs/maintenance.md: its ```python blocks, each run by python as a fresh script in a fresh directory;
- README.md, section "From Python": its ```python block, the same way, then a maintenance pass that must
  keep its records.

Skipped: README's install/demo block and its test-suite block (Spark, pip, the whole suite), the Spark
fragments of README.md and docs/spark.md (they name a DataFrame and paths of the reader's own), and
docs/cli.md's maintain block (a synopsis on a placeholder ROOT, with a loop that never ends and a
--spark run). A line the docs mark as failing (`|| echo "exit code $?"`) must fail with exit code 1
(an error, as docs/cli.md's exit codes say); every other command must succeed (set -e).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO

FAIL_MARK = '|| echo "exit code $?"'


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    nxt = text.find("\n## ", start + len(heading))
    return text[start:] if nxt < 0 else text[start:nxt]


def readme_blocks() -> list[str]:
    with open(os.path.join(REPO, "README.md")) as f:
        return bash_blocks(section(f.read(), "## The `kafkalog` command"))


def cli_doc_blocks() -> dict[str, str]:
    """docs/cli.md's runnable blocks by where they are: the quick tour, then each subcommand's section."""
    with open(os.path.join(REPO, "docs", "cli.md")) as f:
        text = f.read()
    out = {"quick tour": bash_blocks(text[text.index("A quick tour") : text.index("\n## ")])[0]}
    for name in ("topics", "produce", "consume", "dump-log", "delete-records", "describe"):
        blocks = bash_blocks(section(text, f"\n## {name}\n"))
        assert len(blocks) == 1, name
        out[name] = blocks[0]
    return out


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


@pytest.mark.parametrize(
    "name", ["quick tour", "topics", "produce", "consume", "dump-log", "delete-records", "describe"]
)
def test_cli_doc_commands_work_pasted_in_order(shell, name):
    work, bin_dir = shell
    block = cli_doc_blocks()[name]
    check(block, run_block(block, work, bin_dir), f"docs/cli.md {name}")


def test_maintenance_doc_python_snippets_run_as_pasted(tmp_path):
    with open(os.path.join(REPO, "docs", "maintenance.md")) as f:
        blocks = python_blocks(f.read())
    assert blocks, "docs/maintenance.md has no python block"
    for i, block in enumerate(blocks):
        work = tmp_path / f"block{i}"
        work.mkdir()
        env = {**os.environ, "PYTHONPATH": REPO, "TMPDIR": str(work)}
        env.pop("PYTHONSTARTUP", None)
        p = subprocess.run(
            [sys.executable, "-c", block], cwd=work, env=env, capture_output=True, text=True, timeout=600
        )
        assert p.returncode == 0 and "Traceback" not in p.stderr, (
            f"docs/maintenance.md python block {i}: exit {p.returncode}\n{block}\nstderr:\n{p.stderr[-3000:]}"
        )
        if "run_once(" in block:  # the pass ran over the topic it names
            assert p.stdout.startswith("changelog-0: ok;"), p.stdout


def test_readme_python_snippet_runs_as_pasted_and_its_records_survive_maintenance(tmp_path):
    """README "From Python": run as a fresh script; its records carry timestamps of now, so a maintenance pass
    under the default retention (7 days) keeps them."""
    with open(os.path.join(REPO, "README.md")) as f:
        (block,) = python_blocks(section(f.read(), "From Python"))
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
