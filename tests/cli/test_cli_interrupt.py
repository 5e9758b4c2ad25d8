"""Ctrl-C on `kafkalog produce`, `consume` and `maintain`: one line `kafkalog: interrupted` on stderr,
exit code 130, no traceback, and nothing half-written.

The subprocess tests send SIGINT once the command is demonstrably at work (a file has grown, a line
has been printed), never after a sleep. What was written is checked with kafka-python, an independent
reader of the bytes: every batch whole, its CRC valid, the segment made of batches end to end.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest
from kafka.record import MemoryRecords

import kafkalog_ds.cli as cli
from kafkalog_ds import produce as console
from storage.fs.local import _LocalAppender
from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition
from tests.helpers import REPO

SEG = "00000000000000000000.log"
WAIT_S = 120  # a bound for a condition that should hold within a second or two: a hang fails, never a race


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # so Python installs its KeyboardInterrupt handler


@pytest.fixture(autouse=True)
def sigint_delivered():
    """A run started in the background by a non-interactive shell inherits SIGINT ignored (and Python
    then keeps it ignored): give this process, and the commands it starts, Ctrl-C as a terminal would."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def kafkalog(*args, **kw):
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.update(kw.pop("env", {}))
    return subprocess.Popen([sys.executable, "-m", "kafkalog_ds", *args], env=env, preexec_fn=_sigint_default, **kw)


def wait_for(condition, what: str, proc=None):
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the command ended (exit {proc.returncode}) before {what}: {err.decode()[-2000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {WAIT_S} s")
        time.sleep(0.01)


def batches_of(path):
    """[(records, values)] of every batch in a segment file, read by kafka-python; asserts the file is
    batches end to end with valid CRCs (nothing torn, nothing left over)."""
    data = open(path, "rb").read()
    records = MemoryRecords(data)
    out = []
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc(), path
        out.append([r.value for r in batch])
    # kafka-python stops quietly at a torn tail: the batch lengths (baseOffset, then batchLength of the
    # bytes after it) must add up to the file, batch for batch
    pos = count = 0
    while pos < len(data):
        pos += 12 + int.from_bytes(data[pos + 8 : pos + 12], "big")
        count += 1
    assert pos == len(data) and count == len(out), f"{path}: {len(data)} bytes, batches end at {pos}"
    return out


def assert_interrupted(proc_or_rc, err):
    text = err.decode() if isinstance(err, bytes) else err
    assert proc_or_rc == 130, text
    assert text == "kafkalog: interrupted\n", text


# ---------------------------------------------------------------- produce


def lines(records) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def test_produce_interrupted_after_one_partition_keeps_whole_batches(tmp_path):
    """Partition 1 is held by this test (its write lock), so produce is still at work on it after
    appending partition 0: SIGINT then stops it. Partition 0 holds its batches whole; partition 1 nothing."""
    root = str(tmp_path / "logs")
    lm = LogManager(root)
    lm.create_topic("t", 2)
    n0 = 20_000
    records = [{"key": f"k{i}", "value": f"value {i}", "partition": 0} for i in range(n0)]
    records += [{"key": f"k{i}", "value": f"late {i}", "partition": 1} for i in range(10)]
    seg0 = os.path.join(root, "t-0", SEG)
    with lm.open_log(TopicPartition("t", 1), writable=True):  # partition 1's write lock
        proc = kafkalog(
            "produce",
            root,
            "--topic",
            "t",
            "--batch-size",
            "100",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        proc.stdin.write(lines(records))
        proc.stdin.close()
        proc.stdin = None  # for communicate()
        wait_for(lambda: os.path.getsize(seg0) > 0, "append to partition 0", proc)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=WAIT_S)
    assert_interrupted(proc.returncode, err)
    assert b"Traceback" not in err
    assert out.decode() == f"Wrote {n0} records to t-0 at offsets 0..{n0 - 1}\n"
    batches = batches_of(seg0)
    assert [len(b) for b in batches] == [100] * (n0 // 100)
    assert [v for b in batches for v in b] == [f"value {i}".encode() for i in range(n0)]
    assert os.path.getsize(os.path.join(root, "t-1", SEG)) == 0
    with LogManager(root).open_log(TopicPartition("t", 0)) as log:  # a reader: no damage, the log end
        assert (log.log_start_offset, log.log_end_offset) == (0, n0)


def test_ctrl_c_in_the_middle_of_an_append_lets_the_append_finish(root, capsys, monkeypatch):
    """SIGINT arrives half way through writing a block's batches to the segment: the append completes,
    then produce stops. Without that, the segment would end in a torn batch."""
    lm = LogManager(root)
    lm.create_topic("t", 1)
    block = 8192
    monkeypatch.setattr(cli, "produce", functools.partial(console.produce, block_bytes=block))
    writes = []
    original = _LocalAppender.write

    def write(self, data):
        view = memoryview(data)
        if not self._path.endswith(".log"):  # index entries go through appenders too
            return original(self, data)
        writes.append(view.nbytes)
        if len(writes) == 2:  # the second block's append: half, Ctrl-C, the rest
            original(self, view[: view.nbytes // 2])
            signal.raise_signal(signal.SIGINT)
            original(self, view[view.nbytes // 2 :])
        else:
            original(self, data)

    monkeypatch.setattr(_LocalAppender, "write", write)
    records = [{"key": f"k{i}", "value": f"value {i:06d}"} for i in range(2000)]
    data = lines(records)
    try:
        rc = cli.main(["produce", root, "--topic", "t", "--batch-size", "10"], stdin=io.BytesIO(data))
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped kafkalog's main()")
    cap = capsys.readouterr()
    assert_interrupted(rc, cap.err)
    assert len(writes) == 2  # it stopped after the interrupted append, not at the end of the input
    blocks = [b for _, b in console.iter_blocks(io.BytesIO(data), block)]
    n = blocks[0].count(b"\n") + blocks[1].count(b"\n")  # the two blocks appended
    batches = batches_of(os.path.join(root, "t-0", SEG))
    assert [v for b in batches for v in b] == [f"value {i:06d}".encode() for i in range(n)]
    assert cap.out == f"Wrote {n} records to t-0 at offsets 0..{n - 1}\n"
    size = os.path.getsize(os.path.join(root, "t-0", SEG))
    with LogManager(root).open_log(TopicPartition("t", 0), writable=True) as log:  # recovery cuts nothing
        assert (log.log_end_offset, log.size) == (n, size)


# ---------------------------------------------------------------- consume


def test_consume_interrupted_ends_with_whole_lines(tmp_path):
    root = str(tmp_path / "logs")
    n = 20_000
    assert (
        cli.main(
            ["produce", root, "--topic", "t"],
            stdin=io.BytesIO(lines({"key": "k", "value": "v" * 100 + str(i)} for i in range(n))),
        )
        == 0
    )
    proc = kafkalog("consume", root, "--topic", "t", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()  # it has started printing; it now blocks on the full pipe
    if not first:
        pytest.fail(f"consume printed nothing: {proc.communicate()[1].decode()[-2000:]}")
    assert json.loads(first)["offset"] == 0
    proc.send_signal(signal.SIGINT)
    rest = proc.stdout.read()  # not communicate(): it would skip what readline() buffered
    err = proc.stderr.read()
    proc.wait(timeout=WAIT_S)
    assert_interrupted(proc.returncode, err)
    out = first + rest
    assert out.endswith(b"\n")
    offsets = [json.loads(line)["offset"] for line in out.splitlines()]
    assert offsets == list(range(len(offsets))) and len(offsets) < n


# ---------------------------------------------------------------- maintain


def test_maintain_loop_interrupted_between_passes(tmp_path):
    root = str(tmp_path / "logs")
    assert cli.main(["produce", root, "--topic", "t"], stdin=io.BytesIO(lines([{"value": "x"}]))) == 0
    proc = kafkalog(
        "maintain",
        root,
        "--interval-ms",
        "3600000",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PYTHONUNBUFFERED": "1"},
    )
    seen = []

    def pass_done():
        seen.append(proc.stdout.readline())
        return seen[-1].startswith(b"maintenance pass:") or not seen[-1]

    try:
        wait_for(pass_done, "maintenance pass")
        assert seen[-1].startswith(b"maintenance pass: 1 partition(s), 0 failed"), seen
        # the pass is over: the command says when the next runs, and waits
        if not select.select([proc.stderr], [], [], WAIT_S)[0]:
            pytest.fail(f"nothing on stderr {WAIT_S} s after the pass")
        waiting = proc.stderr.readline()
        when = rb"(\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d"  # with its date past midnight
        assert re.fullmatch(rb"next pass at " + when + rb" \(in 3\d{3}(\.\d+)? s\); Ctrl-C stops\n", waiting), waiting
    except BaseException:
        proc.kill()  # not left waiting an hour for its next pass
        proc.wait()
        raise
    proc.send_signal(signal.SIGINT)
    rest, err = proc.stdout.read(), proc.stderr.read()  # not communicate(): see the consume test
    proc.wait(timeout=WAIT_S)
    assert_interrupted(proc.returncode, err)
    assert rest == b""
