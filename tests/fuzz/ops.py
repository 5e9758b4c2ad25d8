"""The six operations, each run in its own child process under a memory cap and a timeout.

    a dump          `kafkalog dump-log <every .log, .index, .timeindex> --print-data-log`
    b consume       `kafkalog consume ROOT --topic T --offset earliest` (stops at the log end by itself)
    c read          LogManager(root, storage_options).open_log(tp).read_records(log_start_offset)
    d read_mid      the same from a middle offset (chosen by the runner from the oracle's valid prefix)
    e recover_ckpt  open_log(tp, writable=True) with recovery-point-offset-checkpoint present, append
                    one record, close, then read everything through a fresh LogManager
    f recover_full  the same after the runner deleted the checkpoint (full recovery)

On a partition with transactions (the `txn` partition, TXN_OPS) two more, and e and f then also read the
partition at read_committed after their session:

    g read_committed     open_log(tp).read_records(log_start_offset, isolation_level="read_committed")
    h consume_committed  `kafkalog consume ROOT --topic T --offset earliest --isolation-level read_committed`

Process model. Starting a Python that imports numba and pyarrow costs about a second here, and a run
is 1,800+ operations, so a *fork server* does the imports once: `python -m tests.fuzz.ops --serve FD`
(the "zygote") imports the engine, warms its numba kernels on a tiny log of its own, and then, per
request, forks a fresh child. The child sets RLIMIT_AS, points fds 1 and 2 at the pipes the runner
passed over a SOCK_SEQPACKET socket (SCM_RIGHTS), runs one operation and `os._exit`s. The zygote
reports the child's pid at once and its wait status and peak RSS (`wait4`) when it ends; the runner
kills the child by pid when its timeout passes (hang detection only). So every operation runs in a
child process of its own, with the engine's state fresh from import, and its stdout streams to the
runner (a consume of the bomb prints 3 GB; nothing of it is stored).

In the object-store mode (runner --s3) ROOT and the dumped files are s3:// URLs on the S3 test
server, given to the CLI as `--fs KEY=VALUE` flags and to the API as storage_options; only the
reading operations (a-d) run there.

The CLI operations call `kafkalog_ds.cli.main(argv)`, what `python -m kafkalog_ds` runs; an exception
escaping it is printed as Python would print it (a traceback, exit 1). The API operations print JSON
lines: {"ev": ...} events and {"o": offset, "d": digest, "p": preview} per record served.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

OPS = ["dump", "consume", "read", "read_mid", "recover_ckpt", "recover_full"]
TXN_OPS = [*OPS, "read_committed", "consume_committed"]
OP_LETTER = dict(zip(TXN_OPS, "abcdefgh", strict=False))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

APPEND_KEY = b"fuzz-appended-key"
APPEND_VALUE = b"fuzz-appended-value"
APPEND_TS = 1_800_000_000_000
APPEND_HEADERS = [("fuzz", b"1")]


def appended_digest() -> str:
    from tests.fuzz.reference import record_digest

    return record_digest(APPEND_TS, 0, APPEND_KEY, APPEND_VALUE, APPEND_HEADERS)


# ---------------------------------------------------------------- inside the child


class _Out:
    """JSON lines on fd 1, buffered."""

    def __init__(self):
        self.f = open(1, "w", buffering=1 << 16, encoding="utf-8", closefd=False)

    def ev(self, **kw):
        self.f.write(json.dumps({"ev": kw}) + "\n")

    def rec(self, offset, digest, preview):
        self.f.write(json.dumps({"o": offset, "d": digest, "p": preview}) + "\n")

    def flush(self):
        self.f.flush()


def _exc_info(e: BaseException, stage: str) -> dict:
    from storage.errors import KafkaLogError

    tb = traceback.format_exception(type(e), e, e.__traceback__)
    return {
        "stage": stage,
        "type": type(e).__name__,
        "module": type(e).__module__,
        "kafka": isinstance(e, KafkaLogError),
        "memory": isinstance(e, MemoryError),
        "msg": str(e)[:2000],
        "tb": "".join(tb)[-3000:],
    }


def _emit_records(out: _Out, log, start: int, isolation_level: str = "read_uncommitted") -> None:
    from tests.fuzz.reference import _short, record_digest

    for batch in log.read_records(start, isolation_level=isolation_level):
        cols = {name: batch.column(name) for name in batch.schema.names}
        offs = cols["offset"].to_pylist()
        tss = cols["timestamp"].to_pylist()
        tst = cols["timestampType"].to_pylist()
        keys, values, heads = cols["key"], cols["value"], cols["headers"]
        for i in range(batch.num_rows):
            k = keys[i].as_py()
            v = values[i].as_py()
            h = heads[i].as_py() or []
            hs = [(x["key"], x["value"]) for x in h]
            out.rec(
                offs[i],
                record_digest(tss[i], tst[i], k, v, hs),
                f"ts={tss[i]} key={_short(k)} value={_short(v)} headers={len(hs)}",
            )
            del k, v
        del batch, cols, keys, values, heads


def _read_op(out: _Out, req: dict) -> None:
    from storage.log_manager import LogManager
    from storage.topic_partition import TopicPartition

    tp = TopicPartition(req["topic"], req.get("partition", 0))
    stage = "open"
    try:
        with LogManager(req["root"], req.get("storage_options")).open_log(tp) as log:
            start = log.log_start_offset if req.get("offset") is None else req["offset"]
            out.ev(opened={"log_start": log.log_start_offset, "log_end": log.log_end_offset, "start": start})
            stage = "read"
            _emit_records(out, log, start, req.get("isolation_level") or "read_uncommitted")
        out.ev(done=True)
    except BaseException as e:  # noqa: BLE001 - every exception is an outcome to classify
        out.ev(exc=_exc_info(e, stage))


def _recover_op(out: _Out, req: dict) -> None:
    import pyarrow as pa

    from storage.log_manager import LogManager
    from storage.records.builder import build_records
    from storage.records.record_batch import CompressionType
    from storage.topic_partition import TopicPartition

    tp = TopicPartition(req["topic"], req.get("partition", 0))
    stage = "open-writable"
    appended_at = None
    try:
        with LogManager(req["root"]).open_log(tp, writable=True, lock_timeout=5) as log:
            out.ev(opened={"log_start": log.log_start_offset, "log_end": log.log_end_offset})
            stage = "append"
            htype = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
            table = pa.table(
                {
                    "key": pa.array([APPEND_KEY], pa.binary()),
                    "value": pa.array([APPEND_VALUE], pa.binary()),
                    "timestamp": pa.array([APPEND_TS], pa.int64()),
                    "headers": pa.array([[{"key": k, "value": v} for k, v in APPEND_HEADERS]], htype),
                }
            )
            info = log.append(build_records(table, compression=CompressionType[req["codec"].upper()]))
            appended_at = info.first_offset
            out.ev(appended={"first": info.first_offset, "last": info.last_offset, "log_end": log.log_end_offset})
            stage = "close"
        out.ev(closed=True)
    except BaseException as e:  # noqa: BLE001
        out.ev(exc=_exc_info(e, stage))
        out.flush()
    stage = "reopen"
    try:
        with LogManager(req["root"]).open_log(tp) as log:
            out.ev(reopened={"log_start": log.log_start_offset, "log_end": log._next_offset})
            stage = "read-after"
            _emit_records(out, log, log.log_start_offset)
        out.ev(done=True)
    except BaseException as e:  # noqa: BLE001
        out.ev(exc=_exc_info(e, stage))
    if req.get("committed"):  # a transactional partition: the same log at read_committed
        try:
            with LogManager(req["root"]).open_log(tp) as log:
                out.ev(committed_phase=True)
                _emit_records(out, log, log.log_start_offset, "read_committed")
            out.ev(committed_done=True)
        except BaseException as e:  # noqa: BLE001
            out.ev(exc=_exc_info(e, "read-committed"))
    if appended_at is not None:  # a record appended behind damage must still be readable from its offset
        try:
            with LogManager(req["root"]).open_log(tp) as log:
                out.ev(appended_phase=True)
                _emit_records(out, log, appended_at)
        except BaseException as e:  # noqa: BLE001
            out.ev(appended_read_exc=_exc_info(e, "read-appended"))


def _cli_op(req: dict) -> int:
    import io

    from kafkalog_ds.cli import main

    if req["op"] == "dump":
        argv = ["dump-log", *req["files"], "--print-data-log"]
    else:
        argv = ["consume", req["root"], "--topic", req["topic"], "--offset", "earliest"]
        if req["op"] == "consume_committed":
            argv += ["--isolation-level", "read_committed"]
    for k, v in (req.get("storage_options") or {}).items():  # the object-store mode: --fs as a user gives them
        argv += ["--fs", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
    try:
        return main(argv, stdin=io.BytesIO(b""))
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - what `python -m kafkalog_ds` would show: a traceback
        sys.stdout.flush()
        traceback.print_exc()
        return 1


def run_in_child(req: dict) -> int:
    """Body of a forked child; returns its exit code."""
    if req["op"] in ("dump", "consume", "consume_committed"):
        rc = _cli_op(req)
        sys.stdout.flush()
        sys.stderr.flush()
        return rc
    out = _Out()
    try:
        if req["op"] in ("read", "read_mid", "read_committed"):
            _read_op(out, req)
        else:
            _recover_op(out, req)
    finally:
        out.flush()
    return 0


# ---------------------------------------------------------------- the zygote


def _warm_up() -> None:
    """Import the engine and run its kernels once (numba loads or compiles them on first call)."""
    import io
    import logging
    import tempfile

    import pyarrow as pa

    import kafkalog_ds.cli
    import tests.fuzz.reference  # noqa: F401  (record digests in the child)

    try:  # the object-store mode's children open s3:// URLs: import s3fs (and botocore) once, here
        import s3fs  # noqa: F401
    except ImportError:
        pass
    from storage.log_manager import LogManager
    from storage.records.builder import build_records
    from storage.records.record_batch import CompressionType
    from storage.topic_partition import TopicPartition

    with tempfile.TemporaryDirectory(prefix="kl-zygote-") as d:
        lm = LogManager(os.path.join(d, "root"))
        lm.create_topic("w", 1, {"segment.bytes": "400", "index.interval.bytes": "100"})
        tp = TopicPartition("w", 0)
        htype = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
        for codec in ("NONE", "GZIP", "SNAPPY", "LZ4", "ZSTD"):
            t = pa.table(
                {
                    "key": pa.array([b"k", None], pa.binary()),
                    "value": pa.array([b"v" * 50, None], pa.binary()),
                    "timestamp": pa.array([1, 2], pa.int64()),
                    "headers": pa.array([[{"key": "a", "value": b"b"}], None], htype),
                }
            )
            with lm.open_log(tp, writable=True) as log:
                log.append(build_records(t, compression=CompressionType[codec]))
        with lm.open_log(tp) as log:
            for _ in log.read_records(log.log_start_offset):
                pass
        files = sorted(
            os.path.join(d, "root", "w-0", n)
            for n in os.listdir(os.path.join(d, "root", "w-0"))
            if n.endswith((".log", ".index", ".timeindex"))
        )
        sink = io.StringIO()
        saved = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = sink
        try:
            kafkalog_ds.cli.main(["dump-log", *files, "--print-data-log"])
            kafkalog_ds.cli.main(["consume", os.path.join(d, "root"), "--topic", "w"])
        finally:
            sys.stdout, sys.stderr = saved
    # main() configured logging for the warm-up's stderr; a fresh `python -m kafkalog_ds` has none
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)


def serve(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    _warm_up()
    import gc

    gc.collect()
    vm = _vm_size()
    sock.send(json.dumps({"ready": True, "pid": os.getpid(), "vm": vm}).encode())
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 4)
        except OSError:
            return
        if not msg:
            return
        req = json.loads(msg)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child
            code = 70
            try:
                os.dup2(fds[0], 1)
                os.dup2(fds[1], 2)
                for f in fds:
                    os.close(f)
                cap = req.get("mem_cap")
                if cap:
                    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
                code = run_in_child(req)
            except BaseException:  # noqa: BLE001
                try:
                    traceback.print_exc()
                except BaseException:  # noqa: BLE001
                    pass
            finally:
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                except BaseException:  # noqa: BLE001
                    pass
                try:  # the child's peak address space, for choosing the cap (sent before the zygote's report)
                    sock.send(json.dumps({"vmpeak": _vm_peak()}).encode())
                except BaseException:  # noqa: BLE001
                    pass
                os._exit(code)
        for f in fds:
            os.close(f)
        sock.send(json.dumps({"pid": pid}).encode())
        _, status, ru = os.wait4(pid, 0)
        sock.send(
            json.dumps(
                {"pid": pid, "status": status, "maxrss_kb": ru.ru_maxrss, "utime": ru.ru_utime, "stime": ru.ru_stime}
            ).encode()
        )


def _vm_peak() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmPeak:"):
                return int(line.split()[1]) * 1024
    return 0


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


# ---------------------------------------------------------------- the runner's side


class OpResult:
    def __init__(self):
        self.pid = None
        self.status = None  # os.wait status
        self.exit_code = None
        self.signal = None
        self.hung = False
        self.maxrss_kb = 0
        self.vmpeak = None  # bytes, reported by the child itself when it exits normally
        self.seconds = 0.0
        self.stderr = ""
        self.stderr_truncated = False

    def __repr__(self):
        return (
            f"OpResult(exit={self.exit_code}, signal={self.signal}, hung={self.hung}, "
            f"maxrss={self.maxrss_kb}kB, {self.seconds:.1f}s)"
        )


class Zygote:
    """One fork server; not thread-safe (one operation at a time)."""

    def __init__(self, *, start_timeout: float = 600):
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONIOENCODING"] = "utf-8"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fuzz.ops", "--serve", str(child.fileno())],
            pass_fds=[child.fileno()],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        child.close()
        self.sock = parent
        self.sock.settimeout(start_timeout)
        hello = json.loads(self.sock.recv(1 << 16) or b"null")
        if not hello or not hello.get("ready"):
            raise RuntimeError("the fork server did not start")
        self.vm = hello["vm"]
        self.sock.settimeout(None)

    def close(self):
        try:
            self.sock.close()
        finally:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def run(self, req: dict, on_stdout_line, *, timeout: float, stderr_cap: int = 1 << 20) -> OpResult:
        """Run one operation; `on_stdout_line(bytes)` gets each stdout line as it arrives."""
        res = OpResult()
        r_out, w_out = os.pipe()
        r_err, w_err = os.pipe()
        t0 = time.monotonic()
        try:
            socket.send_fds(self.sock, [json.dumps(req).encode()], [w_out, w_err])
        finally:
            os.close(w_out)
            os.close(w_err)
        err_chunks = []
        err_len = [0]
        reader_error = []

        def read_out():
            try:
                with os.fdopen(r_out, "rb", buffering=1 << 16) as f:
                    for line in f:
                        on_stdout_line(line)
            except BaseException as e:  # noqa: BLE001 - a parser bug must not hang the run
                reader_error.append(e)
                # keep draining so the child is not blocked on a full pipe
                try:
                    while os.read(r_out, 1 << 16):
                        pass
                except OSError:
                    pass

        def read_err():
            with os.fdopen(r_err, "rb", buffering=0) as f:
                while True:
                    b = f.read(1 << 16)
                    if not b:
                        break
                    if err_len[0] < stderr_cap:
                        err_chunks.append(b)
                    else:
                        res.stderr_truncated = True
                    err_len[0] += len(b)

        to = threading.Thread(target=read_out, daemon=True)
        te = threading.Thread(target=read_err, daemon=True)
        to.start()
        te.start()
        # messages: {"pid"} from the zygote at fork, {"vmpeak"} from the child as it exits (either may
        # come first), {"status"} from the zygote once the child is reaped
        deadline = time.monotonic() + timeout
        done = None
        try:
            while done is None:
                self.sock.settimeout(max(0.01, deadline - time.monotonic()) if not res.hung else 60)
                try:
                    m = json.loads(self.sock.recv(1 << 16))
                except TimeoutError:
                    if res.hung or res.pid is None:
                        raise
                    res.hung = True
                    try:
                        os.kill(res.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    continue
                if "vmpeak" in m:
                    res.vmpeak = m["vmpeak"]
                elif "status" in m:
                    done = m
                elif "pid" in m:
                    res.pid = m["pid"]
        finally:
            self.sock.settimeout(None)
        to.join()
        te.join()
        res.seconds = time.monotonic() - t0
        res.status = done["status"]
        res.maxrss_kb = done["maxrss_kb"]
        if os.WIFSIGNALED(res.status):
            res.signal = os.WTERMSIG(res.status)
        else:
            res.exit_code = os.WEXITSTATUS(res.status)
        res.stderr = b"".join(err_chunks).decode("utf-8", "replace")
        if reader_error:
            raise reader_error[0]
        return res


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--serve":
        serve(int(argv[1]))
        return 0
    print("usage: python -m tests.fuzz.ops --serve FD (started by the runner)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
