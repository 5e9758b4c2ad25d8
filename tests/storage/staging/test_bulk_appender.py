"""The bulk appender (staging segments): big writes go around the page cache with O_DIRECT, and the file
must hold exactly the bytes written, in order, whatever the mix of sizes and alignments."""

import os

import numpy as np
import pytest

from storage.fs import local as lf
from storage.fs.local import DIRECT_BLOCK, DIRECT_MIN_WRITE, LocalFileSystem

direct_io = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT on this platform")


def _needs_direct(path) -> None:
    """Skip where the test directory's filesystem refuses O_DIRECT (tmpfs): the fallback has its own test."""
    probe = str(path / "probe")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT))
    except OSError:
        pytest.skip("the temp directory's filesystem refuses O_DIRECT")
    os.unlink(probe)


def _sizes(rng, n):
    """Write sizes around the interesting edges: tiny, block-unaligned, just under and over the direct
    threshold, and bigger than the per-thread buffer."""
    pool = [
        1,
        61,
        DIRECT_BLOCK - 1,
        DIRECT_BLOCK,
        DIRECT_BLOCK + 1,
        DIRECT_MIN_WRITE - 1,
        DIRECT_MIN_WRITE,
        DIRECT_MIN_WRITE + 4095,
        3 * DIRECT_MIN_WRITE + 17,
        (4 << 20) + 123,
        (9 << 20) + 1,
    ]
    return [int(rng.choice(pool)) for _ in range(n)]


def _write_all(path, sizes, rng, *, reopen_every=0):
    fs = LocalFileSystem()
    expected = bytearray()
    app = fs.open_appender(path, bulk=True)
    used_direct = False
    for i, n in enumerate(sizes):
        data = rng.integers(0, 256, n, dtype=np.uint8)
        app.write(data)
        expected += data.tobytes()
        assert app.size == len(expected)
        used_direct |= app._direct_fd >= 0
        if reopen_every and (i + 1) % reopen_every == 0:  # a new appender picks up an unaligned end
            app.flush()
            app.close()
            app = fs.open_appender(path, create=False, bulk=True)
    app.flush()
    app.close()
    return bytes(expected), used_direct


@direct_io
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_bulk_writes_hold_exactly_the_bytes_written(tmp_path, seed):
    _needs_direct(tmp_path)
    rng = np.random.default_rng(seed)
    path = str(tmp_path / "00000000000000000000.log")
    expected, used_direct = _write_all(path, _sizes(rng, 24), rng, reopen_every=5)
    with open(path, "rb") as f:
        got = f.read()
    assert len(got) == len(expected)
    assert got == expected
    assert used_direct  # ext4/xfs take O_DIRECT; the test is about that path


@direct_io
def test_direct_data_is_seen_by_readers_and_after_truncate(tmp_path):
    _needs_direct(tmp_path)
    rng = np.random.default_rng(9)
    fs = LocalFileSystem()
    path = str(tmp_path / "seg.log")
    app = fs.open_appender(path, bulk=True)
    small = rng.integers(0, 256, 1000, dtype=np.uint8).tobytes()
    big = rng.integers(0, 256, 2 * DIRECT_MIN_WRITE + 5, dtype=np.uint8).tobytes()
    app.write(small)  # buffered, partial block
    assert fs.read(path, 0, 1000) == small  # another descriptor sees it before the direct write
    app.write(big)  # rewrites the partial block through O_DIRECT
    assert fs.read(path) == small + big
    app.truncate(1500)
    app.write(big)
    app.flush()
    app.close()
    assert fs.read(path) == (small + big)[:1500] + big


def test_filesystem_without_o_direct_falls_back_to_buffered(tmp_path, monkeypatch):
    """tmpfs refuses O_DIRECT at open(2); the appender must then write through the page cache."""
    real_open = os.open

    def refusing_open(path, flags, *args):
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(22, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(lf.os, "open", refusing_open)
    rng = np.random.default_rng(4)
    path = str(tmp_path / "seg.log")
    expected, used_direct = _write_all(path, _sizes(rng, 12), rng)
    assert not used_direct
    with open(path, "rb") as f:
        assert f.read() == expected


def test_plain_appenders_never_bypass_the_cache(tmp_path):
    fs = LocalFileSystem()
    app = fs.open_appender(str(tmp_path / "a.log"))
    app.write(b"x" * (2 * DIRECT_MIN_WRITE))
    assert app._direct_fd < 0
    app.close()
