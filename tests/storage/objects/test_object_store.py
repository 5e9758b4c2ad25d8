"""The filesystem seam's contract on local disk, fsspec memory and object stores (fsspec memory and a
real S3 endpoint), plus what only object stores do: ranged GETs, the listing cache, create-only PUTs."""

import json
import multiprocessing
import pickle
import threading
import time
import uuid

import fsspec
import numpy as np
import pytest

from storage.errors import InvalidConfigError, KafkaStorageError
from storage.fs.local import LocalFileSystem
from storage.fs.memory import MemoryFileSystem
from storage.fs.storage_options import (
    is_secret_key,
    redact,
    redact_text,
    redact_url,
    safe_repr,
    storage_options_from_cli,
    storage_options_from_spark,
)
from storage.log_dirs import open_filesystem
from storage.objects.object_store import ObjectStoreFileSystem
from tools.s3_server import BUCKET

KINDS = ["local", "memory", "objmem", "s3"]


@pytest.fixture(params=KINDS)
def store(request, tmp_path):
    """(fs, root) for each filesystem; root is an empty dir (or prefix)."""
    if request.param == "local":
        fs, root = LocalFileSystem(), str(tmp_path / "root")
    elif request.param == "memory":
        fs, root = MemoryFileSystem(), f"/mem-{uuid.uuid4().hex}"
    elif request.param == "objmem":
        fs, root = ObjectStoreFileSystem(fsspec.filesystem("memory")), f"/obj-{uuid.uuid4().hex}"
    else:
        url, opts = request.getfixturevalue("s3_root")
        fs, root = open_filesystem(url, opts)
    fs.mkdirs(root)
    return fs, root


@pytest.fixture
def s3fs_root(s3_root):
    url, opts = s3_root
    return open_filesystem(url, opts)


def put(fs, path, data):
    fs.mkdirs(fs.dirname(path))
    fs.write_atomic(path, data)


def random_bytes(n, seed=7):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


# ------------------------------------------------------------------ the contract, on every filesystem


def test_read_ranges_match_python_slicing(store):
    fs, root = store
    data = random_bytes(10_000)
    path = fs.join(root, "seg.log")
    put(fs, path, data)
    assert fs.size(path) == len(data)
    for start, end in [
        (0, None),
        (0, 1),
        (1, 17),
        (4096, 8192),
        (9999, None),
        (9999, 10_000),
        (9000, 20_000),
        (10_000, None),
        (10_000, 10_001),
        (12_000, 13_000),
        (5, 5),
        (7, 3),
    ]:
        assert fs.read(path, start, end) == data[start:end], (start, end)


def test_missing_object_errors_name_the_path(store):
    fs, root = store
    path = fs.join(root, "nope-00000000000000000042.log")
    for call in (lambda: fs.read(path, 0, 10), lambda: fs.size(path), lambda: fs.modified_ms(path)):
        with pytest.raises(FileNotFoundError) as e:
            call()
        assert "nope-00000000000000000042.log" in str(e.value)
    with pytest.raises(FileNotFoundError):
        fs.delete(path, missing_ok=False)
    fs.delete(path)  # missing_ok


def test_listing_dirs_are_prefixes(store):
    fs, root = store
    put(fs, fs.join(root, "t-0", "a.log"), b"abc")
    put(fs, fs.join(root, "t-0", "a.index"), b"12345678")
    put(fs, fs.join(root, "t-1", "deep", "b.log"), b"x")
    put(fs, fs.join(root, "t-10", "c.log"), b"xy")
    put(fs, fs.join(root, "checkpoint"), b"hello")
    got = {(e.name, e.is_dir) for e in fs.listdir(root)}
    assert got == {("t-0", True), ("t-1", True), ("t-10", True), ("checkpoint", False)}
    assert {e.name: e.size for e in fs.listdir(root) if not e.is_dir} == {"checkpoint": 5}
    assert {(e.name, e.size, e.is_dir) for e in fs.listdir(fs.join(root, "t-0"))} == {
        ("a.log", 3, False),
        ("a.index", 8, False),
    }
    assert fs.listdir(fs.join(root, "absent")) == []
    assert fs.exists(fs.join(root, "t-1")) and fs.isdir(fs.join(root, "t-1"))
    assert fs.exists(fs.join(root, "checkpoint")) and not fs.isdir(fs.join(root, "checkpoint"))
    assert not fs.exists(fs.join(root, "t-2")) and not fs.isdir(fs.join(root, "t-2"))
    assert not fs.exists(fs.join(root, "t-0", "a.lo"))


def test_write_atomic_replaces_and_listing_follows(store):
    fs, root = store
    path = fs.join(root, "recovery-point-offset-checkpoint")
    for data in (b"0\n1\nt 0 5\n", b"0\n2\nt 0 5\nt 1 9\n", b"", b"0\n0\n"):
        fs.write_atomic(path, data)
        assert fs.read(path) == data and fs.size(path) == len(data)
        assert {e.name: e.size for e in fs.listdir(root)} == {"recovery-point-offset-checkpoint": len(data)}


def test_create_exclusive_keeps_the_first(store):
    fs, root = store
    path = fs.join(root, "00000000000000000100.log")
    assert fs.create_exclusive(path, b"writer-a")
    assert not fs.create_exclusive(path, b"writer-b!")
    assert fs.read(path) == b"writer-a"
    assert [e.name for e in fs.listdir(root)] == ["00000000000000000100.log"]


def test_create_exclusive_race_between_threads(store):
    fs, root = store
    rounds, contenders = 50, 4
    for i in range(rounds):
        path = fs.join(root, f"{i:020d}.log")
        barrier = threading.Barrier(contenders)
        results = [None] * contenders

        def contend(n, barrier=barrier, results=results, path=path, i=i):
            barrier.wait()
            results[n] = fs.create_exclusive(path, b"writer-%d-round-%d" % (n, i))

        threads = [threading.Thread(target=contend, args=(n,)) for n in range(contenders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [n for n, won in enumerate(results) if won]
        assert len(winners) == 1, (i, results)
        assert fs.read(path) == b"writer-%d-round-%d" % (winners[0], i)


def test_delete_dir_removes_only_that_prefix(store):
    fs, root = store
    for p in ("t-1/a.log", "t-1/sub/b.log", "t-10/c.log", "t-1x"):
        put(fs, fs.join(root, *p.split("/")), b"data")
    fs.listdir(fs.join(root, "t-1"))  # cached listings must not survive the delete
    fs.delete_dir(fs.join(root, "t-1"))
    assert not fs.exists(fs.join(root, "t-1")) and fs.listdir(fs.join(root, "t-1")) == []
    assert fs.read(fs.join(root, "t-10", "c.log")) == b"data" and fs.read(fs.join(root, "t-1x")) == b"data"
    assert {e.name for e in fs.listdir(root)} == {"t-10", "t-1x"}
    fs.delete_dir(fs.join(root, "never-there"))


def test_rename_moves_the_bytes(store):
    fs, root = store
    src, dst = fs.join(root, "00000000000000000000.log.swap"), fs.join(root, "00000000000000000000.log")
    put(fs, src, b"segment")
    fs.rename(src, dst)
    assert fs.read(dst) == b"segment" and not fs.exists(src)
    assert [e.name for e in fs.listdir(root)] == ["00000000000000000000.log"]


def test_touch_keeps_bytes_and_never_moves_time_back(store):
    fs, root = store
    path = fs.join(root, "00000000000000000000.log.deleted")
    put(fs, path, b"bytes")
    before = fs.modified_ms(path)
    assert abs(before - time.time() * 1000) < 86_400_000  # a wall-clock time in ms, not seconds or ns
    fs.touch(path)
    assert fs.modified_ms(path) >= before and fs.read(path) == b"bytes"


# ------------------------------------------------------------------ object stores only


@pytest.fixture(params=["objmem", "s3"])
def objstore(request):
    if request.param == "objmem":
        return ObjectStoreFileSystem(fsspec.filesystem("memory")), f"/obj-{uuid.uuid4().hex}"
    url, opts = request.getfixturevalue("s3_root")
    return open_filesystem(url, opts)


def test_capabilities_are_declared_honestly(objstore):
    fs, root = objstore
    c = fs.capabilities
    assert (c.append, c.atomic_rename, c.exclusive_create, c.locks, c.fsync) == (False, False, True, False, False)
    path = fs.join(root, "00000000000000000000.log")
    fs.write_atomic(path, b"abc")
    for call, what in [
        (lambda: fs.open_appender(path), "append"),
        (lambda: fs.truncate(path, 1), "truncate"),
        (lambda: fs.lock(fs.join(root, ".lock")), "lock"),
        (lambda: fs.write_at(path, [0], b"x"), "in place"),
    ]:
        with pytest.raises(KafkaStorageError) as e:
            call()
        assert fs.url(path if what != "lock" else fs.join(root, ".lock")) in str(e.value) and what in str(e.value)
    assert fs.read(path) == b"abc"


def test_unknown_backend_refuses_exclusive_create():
    class Plain(fsspec.implementations.memory.MemoryFileSystem):
        protocol = "plainobj"

    fs = ObjectStoreFileSystem(Plain())
    assert fs.capabilities.exclusive_create is False
    with pytest.raises(KafkaStorageError, match="no atomic create-only write"):
        fs.create_exclusive("/x/y", b"1")


def test_create_exclusive_is_idempotent_for_identical_bytes(objstore):
    """A PUT retried after a lost response meets its own object: identical bytes count as created."""
    fs, root = objstore
    path = fs.join(root, "manifest-00000000000000000007")
    assert fs.create_exclusive(path, b"writer-a batch-7")
    assert fs.create_exclusive(path, b"writer-a batch-7")
    assert not fs.create_exclusive(path, b"writer-b batch-7")


def test_mkdirs_is_a_no_op(objstore):
    fs, root = objstore
    fs.mkdirs(fs.join(root, "t-0"))
    assert not fs.exists(fs.join(root, "t-0")) and fs.listdir(root) == []


def test_moto_enforces_if_none_match_on_put(s3_server, s3fs_root):
    fs, root = s3fs_root
    path = fs.join(root, "00000000000000000000.log")
    mark = s3_server.log.mark()
    assert fs.create_exclusive(path, b"a") and not fs.create_exclusive(path, b"b")
    puts = [r.status for r in s3_server.log.since(mark, path_prefix="/" + path) if r.method == "PUT"]
    assert puts == [200, 412]  # the server refused the second PUT: not a client-side existence check


def test_ranged_read_is_one_get_of_that_range(s3_server, s3fs_root):
    fs, root = s3fs_root
    path = fs.join(root, "00000000000000000000.log")
    data = random_bytes(1 << 20)
    fs.write_atomic(path, data)
    for start, end, header, status in [
        (1000, 5000, "bytes=1000-4999", 206),
        (1000, None, "bytes=1000-", 206),
        (5, 5, None, None),
        (len(data), None, f"bytes={len(data)}-", 416),
    ]:
        mark = s3_server.log.mark()
        assert fs.read(path, start, end) == data[start:end]
        sent = s3_server.log.since(mark, path_prefix="/" + BUCKET)
        if header is None:
            assert sent == []
            continue
        assert [(r.method, r.path, r.range, r.status) for r in sent] == [("GET", "/" + path, header, status)]
        if status == 206:
            assert sent[0].body_bytes == len(data[start:end])


def test_listing_cache_saves_lists_and_follows_own_writes(s3_server, s3_root):
    url, opts = s3_root
    fs, root = open_filesystem(url, opts)
    other, _ = open_filesystem(url, opts)
    fs_nocache = ObjectStoreFileSystem(fs.fsspec_fs, listing_ttl=0)
    fs.write_atomic(fs.join(root, "a"), b"1")

    def lists(call):
        mark = s3_server.log.mark()
        out = call()
        return out, sum(1 for r in s3_server.log.since(mark) if r.method == "GET" and "list-type" in r.query)

    assert lists(lambda: [e.name for e in fs.listdir(root)]) == (["a"], 1)
    assert lists(lambda: [e.name for e in fs.listdir(root)]) == (["a"], 0)
    assert lists(lambda: (fs.exists(fs.join(root, "a")), fs.exists(fs.join(root, "b")))) == ((True, False), 0)
    other.write_atomic(other.join(root, "b"), b"2")  # another writer: unseen until the cache is dropped
    assert lists(lambda: [e.name for e in fs.listdir(root)]) == (["a"], 0)
    assert lists(lambda: sorted(e.name for e in fs_nocache.listdir(root))) == (["a", "b"], 1)
    fs.invalidate_listings(root)
    assert lists(lambda: sorted(e.name for e in fs.listdir(root))) == (["a", "b"], 1)
    fs.create_exclusive(fs.join(root, "c"), b"3")  # own write: the next listing goes to the store
    assert lists(lambda: sorted(e.name for e in fs.listdir(root))) == (["a", "b", "c"], 1)


def test_listing_cache_expires_after_ttl():
    now = [0.0]
    fs = ObjectStoreFileSystem(fsspec.filesystem("memory"), listing_ttl=5.0, clock=lambda: now[0])
    root = f"/ttl-{uuid.uuid4().hex}"
    fs.write_atomic(fs.join(root, "a"), b"1")
    assert [e.name for e in fs.listdir(root)] == ["a"]
    fsspec.filesystem("memory").pipe_file(fs.join(root, "b"), b"2")  # behind the cache's back
    now[0] = 4.9
    assert [e.name for e in fs.listdir(root)] == ["a"]
    now[0] = 5.0
    assert sorted(e.name for e in fs.listdir(root)) == ["a", "b"]


def _race_worker(url, opts, keys, barrier, out):
    fs, root = open_filesystem(url, opts)
    pid = multiprocessing.current_process().name
    barrier.wait()
    out.put([(k, fs.create_exclusive(fs.join(root, k), f"{pid}:{k}".encode())) for k in keys])


def test_create_exclusive_race_between_processes(s3_root):
    url, opts = s3_root
    ctx = multiprocessing.get_context("spawn")
    keys = [f"{i:020d}.log" for i in range(50)]
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_race_worker, args=(url, opts, keys, barrier, out), name=f"w{n}") for n in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    fs, root = open_filesystem(url, opts)
    for i, k in enumerate(keys):
        wins = [n for n in range(2) if results[n][i] == (k, True)]
        assert len(wins) == 1, (k, results[0][i], results[1][i])
        assert fs.read(fs.join(root, k)).endswith(f":{k}".encode())
    assert sum(1 for r in results for _, won in r if won) == len(keys)


def test_pickled_filesystem_reaches_the_same_store(s3fs_root):
    fs, root = s3fs_root
    fs.write_atomic(fs.join(root, "x"), b"payload")
    clone = pickle.loads(pickle.dumps(fs))
    assert clone.read(fs.join(root, "x"), 3, None) == b"load" and clone.capabilities == fs.capabilities


# ------------------------------------------------------------------ opening, options and secrets


def test_open_filesystem_dispatch(s3_root):
    assert isinstance(open_filesystem("memory://x")[0], MemoryFileSystem)
    url, opts = s3_root
    fs, path = open_filesystem(url + "/", opts)
    assert isinstance(fs, ObjectStoreFileSystem) and path == url[len("s3://") :]
    assert fs.url(path) == url
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(KafkaStorageError, match="gcsfs"):
            open_filesystem("gs://bucket/p")


def test_spark_options_reach_the_server(s3_server):
    o = s3_server.storage_options
    spark = {
        "FS.KEY": o["key"],
        "fs.secret": o["secret"],
        "fs.endpoint_url": o["endpoint_url"],
        "fs.client_kwargs": json.dumps(o["client_kwargs"]),
        "path": "ignored",
        "topic": "t",
    }
    fs, root = open_filesystem(f"s3://{BUCKET}/spark-{uuid.uuid4().hex}", storage_options_from_spark(spark))
    assert fs.create_exclusive(fs.join(root, "x"), b"1") and fs.read(fs.join(root, "x")) == b"1"


def test_storage_options_decoding():
    got = storage_options_from_spark(
        {
            "fs.endpoint_url": "http://127.0.0.1:9000",
            "fs.anon": "false",
            "fs.default_block_size": "5242880",
            "fs.client_kwargs": '{"region_name": "eu-west-1"}',
            "fs.client_kwargs.verify": "false",
            "fs.config_kwargs.s3.addressing_style": "path",
            "fs.secret": "12345",
            "fs.token": "null",
            "other": "x",
        }
    )
    assert got == {
        "endpoint_url": "http://127.0.0.1:9000",
        "anon": False,
        "default_block_size": 5242880,
        "client_kwargs": {"region_name": "eu-west-1", "verify": False},
        "config_kwargs": {"s3": {"addressing_style": "path"}},
        "secret": "12345",
        "token": "null",
    }
    assert storage_options_from_cli(["key=AKID", 'client_kwargs={"region_name": "us-east-1"}', "a.b=2"]) == {
        "key": "AKID",
        "client_kwargs": {"region_name": "us-east-1"},
        "a": {"b": 2},
    }
    with pytest.raises(InvalidConfigError, match="given twice"):
        storage_options_from_cli(['client_kwargs={"verify": true}', "client_kwargs.verify=false"])
    with pytest.raises(InvalidConfigError) as e:
        storage_options_from_cli(["wJalrXUtnFEMIK7MDENGbPxRfiCYSECRET"])
    assert "wJalrXUtnFEMI" not in str(e.value)


def test_redaction():
    opts = {
        "key": "AKIDEXAMPLE",
        "secret": "s3cr3t-value",
        "client_kwargs": {"region_name": "us-east-1", "aws_session_token": "tok-123456"},
        "connection_string": "AccountKey=abc;",
        "password": "hunter22",
        "credentials": {"client_email": "x@y"},
        "endpoint_url": "http://user:pw@host:9000",
        "anon": False,
    }
    shown = safe_repr(opts)
    for secret in ("AKIDEXAMPLE", "s3cr3t-value", "tok-123456", "AccountKey=abc", "hunter22", "x@y", "user:pw"):
        assert secret not in shown
    assert redact(opts)["client_kwargs"]["region_name"] == "us-east-1" and redact(opts)["anon"] is False
    assert redact_url("s3://AKID:SECRET@bucket/p") == "s3://***@bucket/p"
    assert redact_text("denied for s3cr3t-value at s3://AKID:SECRET@b/p", opts) == "denied for *** at s3://***@b/p"
    assert [
        k
        for k in (
            "SSECustomerKey",
            "sas_token",
            "AccountKey",
            "region_name",
            "endpoint_url",
            "use_ssl",
            "client_kwargs",
            "signature_version",
        )
        if is_secret_key(k)
    ] == ["SSECustomerKey", "sas_token", "AccountKey"]


def test_errors_never_show_credentials(s3_root):
    url, opts = s3_root
    secret, key_id = "S3CR3T-VALUE-for-this-test", "AKIDTESTONLY42"
    opts = dict(opts, secret=secret, key=key_id)
    fs, root = open_filesystem(url, opts)
    texts = [repr(fs), fs.url(root)]
    with pytest.raises(FileNotFoundError) as e:
        fs.read(fs.join(root, "missing"), 0, 4)
    texts.append(str(e.value))
    with pytest.raises(KafkaStorageError) as e:
        open_filesystem("nosuchproto://bucket/p", opts)
    texts.append(str(e.value))

    class Leaky(fsspec.implementations.memory.MemoryFileSystem):  # a backend that echoes its config
        def cat_file(self, path, start=None, end=None, **kw):
            raise OSError(f"signature mismatch for key {key_id} secret {secret}")

    leaky = ObjectStoreFileSystem(Leaky(), storage_options=opts)
    with pytest.raises(KafkaStorageError) as e:
        leaky.read("/b/seg.log", 0, 4)
    assert "/b/seg.log" in str(e.value) and e.value.__cause__ is None and e.value.__suppress_context__
    texts.append(str(e.value))
    for t in texts:
        assert secret not in t and key_id not in t, t
