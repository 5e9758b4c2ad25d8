"""`kafkalog dump-log` bounds each batch's decompressed records as the readers do: a hand-built lz4
batch that inflates to 200 MiB of zeros is reported, under an address-space limit (RLIMIT_AS, as
`ulimit -v` sets) far below what inflating it takes."""

from __future__ import annotations

import struct
import subprocess
import sys

import crc32c
import numpy as np
import pyarrow as pa
import pytest

from storage.records.builder import build_records
from storage.records.record_batch import CompressionType
from tests.helpers import REPO

SEG = "00000000000000000000"
BOMB_BYTES = 200 * 1024 * 1024
ADDRESS_SPACE = 2 * 1024**3  # the fuzz run's cap: `ulimit -v` 2 GiB
GROWTH_LIMIT = 64 * 1024 * 1024  # peak resident growth of the capped dump; inflating the bomb needs 200 MiB

# The child runs under RLIMIT_AS (as `ulimit -v` sets), dumps a small lz4 segment first (imports, codecs
# and kernels loaded), notes its peak resident size (VmHWM), dumps the bomb, and prints how much the peak
# grew (a resource bound: the allocator may reserve address space early, so the growth is measured too).
CHILD = """
import resource, sys
cap = int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
from kafkalog_ds.cli import main

def peak():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

warm, bomb = sys.argv[1], sys.argv[2]
if main(["dump-log", warm, "--print-data-log"]) != 0:
    sys.exit("warm-up dump failed")
before = peak()
print("=== bomb", flush=True)
rc = main(["dump-log", bomb, "--print-data-log"])
print(f"=== peak growth {peak() - before}", flush=True)
sys.exit(rc)
"""


def lz4_bomb_batch(base_offset: int) -> bytes:
    """One v2 batch of one record whose records area is a single lz4 frame (pyarrow's lz4 codec: the LZ4
    frame format Kafka's lz4 uses) of BOMB_BYTES zeros, with a correct CRC-32C."""
    frame = pa.compress(np.zeros(BOMB_BYTES, np.uint8), codec="lz4", asbytes=True)
    # attributes (lz4), lastOffsetDelta, baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence,
    # recordCount: the bytes the CRC covers, with the records
    covered = struct.pack(">hiqqqhii", CompressionType.LZ4.value, 0, 1, 1, -1, -1, -1, 1) + frame
    batch_length = 4 + 1 + 4 + len(covered)  # partitionLeaderEpoch, magic, crc, then the covered bytes
    return struct.pack(">qiibI", base_offset, batch_length, 0, 2, crc32c.crc32c(covered)) + covered


@pytest.fixture(scope="module")
def segments(tmp_path_factory):
    d = tmp_path_factory.mktemp("bomb")
    small = build_records(pa.table({"key": [b"k"], "value": [b"v" * 100]}), compression=CompressionType.LZ4)
    warm = d / "warm" / f"{SEG}.log"
    warm.parent.mkdir()
    warm.write_bytes(small)
    bomb = d / f"{SEG}.log"
    bomb.write_bytes(small + lz4_bomb_batch(1))
    assert bomb.stat().st_size < 2 * 1024 * 1024  # small on disk, 200 MiB inflated
    return str(warm), str(bomb), len(small)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status (VmHWM)")
def test_lz4_bomb_is_reported_within_an_address_space_limit(segments):
    warm, bomb, position = segments
    p = subprocess.run(
        [sys.executable, "-c", CHILD, warm, bomb, str(ADDRESS_SPACE)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 1, p.stderr
    out, growth = p.stdout.split("=== bomb\n", 1)[1].split("=== peak growth ")
    assert int(growth) < GROWTH_LIMIT, growth
    assert "MemoryError" not in p.stderr and "Traceback" not in p.stderr
    # the batch line, then the reason under it, as for any batch whose records cannot be read
    assert "baseOffset: 1 lastOffset: 1 count: 1" in out and "compresscodec: lz4" in out
    reason = (
        f"lz4 records decompress to more than 5242880 bytes, above the limit of 5242880 (--max-message-size) "
        f"({bomb}, position {position}); raise --max-message-size to read it"
    )
    assert f"| error: the records of this batch cannot be read: {reason}" in out
    assert p.stderr == f"kafkalog: error: 1 batch(es) of {bomb} could not be decoded; the first: {reason}\n"
    # the batch before it is dumped in full
    assert "| offset: 0 CreateTime: " in out and "payload: " + "v" * 100 in out
