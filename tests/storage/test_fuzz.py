"""Seeded mutation fuzzing of the log engine (tests/fuzz/): damaged copies of valid logs, six operations
each in a child process under a memory cap and a timeout, every outcome checked against an oracle
that reads the bytes without the engine.

Quick mode (the default suite, about half a minute on 2 cores): the unmutated corpus through all six
operations, the compression bomb through `consume`, and 70 mutants of each of 3 fixed
seeds (no bomb mutants). Long mode (`pytest tests/storage/test_fuzz.py --fuzz-long`, or
KAFKALOG_FUZZ_LONG=1): the bomb through all six operations and 10 seeds x 300 mutants, one in 100 a
bomb mutant.

What the oracle demands of an error (tests/fuzz/runner.py): a project error (one `kafkalog: error:`
line; a KafkaLogError) that names the file and the absolute byte position in it, spelled
`position N` (an offset is no place in a file); for damage in an .index/.timeindex the file's name is
enough. When a read (a-d) served the whole valid prefix, its error must name the segment where the
prefix stops and a position inside the batch at fault there, so a position relative to a chunk or a
read is caught too. Anything else is BAD_ERROR.

Object-store mode (`python -m tests.fuzz.runner --s3`, and the `s3` tests here, which use the session's
S3 test server: moto on 127.0.0.1, tests/conftest.py `s3_server`): the same mutants, built and judged
by the same oracle on a local copy, are uploaded under a prefix of their own and read through s3://
URLs (`--fs` flags for the CLI, storage_options for the API), with the same outcome classes; a reader
that changes an object (its ETag) is SILENT_WRONG. Only the reading operations run (a dump, b
consume, c read, d read_mid: objects are immutable, writers are fuzzed locally), and one target in
eight is the `chunky` partition (400 KB segments of few-KB batches), whose mutants are 3 in 4 placed
at the end of one of a reader's chunk reads, where a read through s3fs issues its next ranged GET and
carries the cut-off batch over (mutate.m_chunk). Quick (the default suite, under a minute on 2
cores): the clean corpus and the mutants the mode found bugs with, through a, b, c; 1 seed x 8
mutants through a, b, c. Long (--fuzz-long): 4 seeds x 80 mutants through a-d.

A failure prints, per failing (mutant, operation): the seed, the mutant index, the mutation, the
operation, the first differing offset, what happened, and the command that reproduces it:
    PYTHONPATH=. python -m tests.fuzz.runner [--s3] --seed S --only K --ops X -v
Transaction mode (`python -m tests.fuzz.runner --txn`; tests/fuzz/mutate_txn.py): the `txn` partition's
markers, `.txnindex` files and producer snapshots damaged, operations a-h (g read_committed, h consume
--isolation-level read_committed; e and f also read at read_committed), judged against the oracle's
read_committed answer from the log bytes alone. Quick: the clean partition through a-h (in the clean-corpus
test) and TXN_QUICK_MUTANTS of one seed. Long (--fuzz-long): TXN_LONG_SEEDS x TXN_LONG_MUTANTS. Hints are
verified, not obeyed: a `.txnindex` entry removed, added or shifted, an open transaction erased from a snapshot
with its CRC fixed, or a marker whose meaning changed behind a good CRC must not change what read_committed
serves (TXN_HINT_CASES: mutants the engine got wrong while it trusted them).

The done-criterion (>= 300 mutants x 6 operations, and the object-store mode): no SILENT_WRONG,
LOST, MEMORY, BAD_ERROR or HANG. No test here sleeps or races a clock; the timeout only detects hangs.
"""

from __future__ import annotations

import os
import random

import pytest

from tests.fuzz import ops as O
from tests.fuzz.mutate_txn import mutate_txn
from tests.fuzz.reference import Rec, partition_views
from tests.fuzz.runner import FAILURES, S3_OPS, Corpus, ObjectStore, Runner, classify_read, summary_table
from tools.s3_server import BUCKET

QUICK_SEEDS = [101, 102, 103]
QUICK_MUTANTS = 70
QUICK_BOMB_OPS = ["consume"]  # the CLI over the same reader as `read`; dump-log: tests/cli/test_dump_log_memory.py
LONG_SEEDS = list(range(1, 11))
LONG_MUTANTS = 300
LONG_BOMB_EVERY = 100
JOBS = 2
MAX_MESSAGES = 40
S3_QUICK_OPS = ["dump", "consume", "read"]
S3_QUICK_SEEDS = [201]
S3_QUICK_MUTANTS = 8
S3_LONG_SEEDS = [1, 2, 3, 4]
S3_LONG_MUTANTS = 80
# (seed, mutant) pairs of the object-store mode that found engine bugs: a last batch whose baseOffset
# is 2^63-1 read as an empty log with no error; a torn segment object's error without its position
S3_FOUND = [(1, 6), (1, 10)]
TXN_QUICK_SEED = 301
TXN_QUICK_MUTANTS = 12
TXN_LONG_SEEDS = [1, 2, 3, 4]
TXN_LONG_MUTANTS = 100
# (seed, mutant) of the transaction mode the engine got wrong while it trusted its hints: an entry removed from
# 00000000000000000272.txnindex, an open transaction erased from the latest snapshot (CRC fixed), a COMMIT
# marker turned ABORT behind a good CRC below the latest snapshot
TXN_HINT_CASES = [(1, 10), (1, 37), (1, 7)]


def long_mode(config) -> bool:
    return bool(config.getoption("--fuzz-long", default=False)) or os.environ.get("KAFKALOG_FUZZ_LONG") == "1"


@pytest.fixture(scope="session")
def fuzz_corpus(tmp_path_factory):
    return Corpus.build(str(tmp_path_factory.mktemp("fuzz-corpus")))


@pytest.fixture(scope="session")
def fuzz_runner(fuzz_corpus, tmp_path_factory):
    runner = Runner(fuzz_corpus, seed=0, work=str(tmp_path_factory.mktemp("fuzz-work")), jobs=JOBS, bomb_every=0)
    yield runner
    runner.close()


def assert_no_failures(outcomes, what: str, *, allow=None):
    failures = [o for o in outcomes if o.cls in FAILURES and not (allow and allow(o))]
    if not failures:
        return
    shown = "\n".join(o.message() for o in failures[:MAX_MESSAGES])
    more = (
        f"\n... and {len(failures) - MAX_MESSAGES} more failing (mutant, op) pairs"
        if len(failures) > MAX_MESSAGES
        else ""
    )
    pytest.fail(
        f"{what}: {len(failures)} failing (mutant, op) pair(s)\n{summary_table(outcomes)}\n\n{shown}{more}",
        pytrace=False,
    )


def test_oracle_reads_the_clean_corpus_as_written(fuzz_corpus):
    """The oracle's valid prefix of every unmutated partition is exactly what was appended."""
    for topic, part in fuzz_corpus.manifest["partitions"].items():
        views = partition_views(fuzz_corpus.root, topic)
        got = [[r.offset, r.digest] for r in views[0].records]
        assert got == part["written"], f"{topic}: the oracle does not read back what was written"
        assert views[0].stop is None, f"{topic}: {views[0].stop}"
        if part["kind"] == "txn":
            assert [[r.offset, r.digest] for r in views[0].committed] == part["committed"], "read_committed differs"
            assert views[0].committed_stop is None and views[0].lso == part["lso"]
            assert len(part["committed"]) < len(part["written"]), "aborted and open transactions hide records"
        if part["kind"] == "swap":
            assert len(views) == 2, "the .swap leftover gives a post-swap view"
            written = {o: d for o, d in part["written"]}
            assert all(written.get(r.offset) == r.digest for r in views[1].records)
            assert len(views[1].records) < len(views[0].records), "the swap holds a compacted copy"


def test_harness_detects_a_dropped_or_changed_record(fuzz_corpus):
    """The comparison itself: serving the oracle's records minus one, or with one changed, is SILENT_WRONG."""
    views = partition_views(fuzz_corpus.root, "c-none")
    recs = views[0].records
    served = [(r.offset, r.digest, r.preview) for r in recs]
    assert classify_read(recs, None, served, None)[0][0] == "OK"
    dropped = served[:10] + served[11:]
    (cls, detail, first), _ = classify_read(recs, None, dropped, None)
    assert cls == "SILENT_WRONG" and first == recs[10].offset, detail
    changed = list(served)
    changed[5] = (changed[5][0], "0" * 24, "x")
    assert classify_read(recs, None, changed, None)[0][:1] == ("SILENT_WRONG",)
    assert isinstance(recs[0], Rec)


def test_oracle_marker_damage_behind_a_good_crc_changes_the_committed_answer(fuzz_corpus, tmp_path):
    """A COMMIT turned ABORT (or back) with the CRC fixed: the log's bytes now say otherwise, and so does the
    oracle; a damaged .txnindex or snapshot leaves its answer as it was (they are hints)."""
    clean = partition_views(fuzz_corpus.root, "txn")[0]
    seen = set()
    for k in range(200):
        root = tmp_path / f"m{k}"
        part = fuzz_corpus.copy_partition("txn", str(root))
        rng = random.Random(f"oracle:{k}")
        family = ["marker", "txnindex", "snapshot"][k % 3]
        mut = mutate_txn(rng, part, family=family)
        view = partition_views(str(root), "txn")[0]
        same = [r.offset for r in view.committed] == [r.offset for r in clean.committed]
        if family != "marker":
            assert same and view.committed_stop is None, mut.desc
        elif "marker type 1 -> 0" in mut.desc and mut.desc.endswith("CRC fixed"):
            assert not same and len(view.committed) < len(clean.committed), mut.desc
            seen.add("commit->abort")
        elif "marker type 0 -> 1" in mut.desc and mut.desc.endswith("CRC fixed"):
            assert not same, mut.desc
            seen.add("abort->commit")
        elif "marker type" in mut.desc and mut.desc.endswith("CRC fixed") and "-> 0" not in mut.desc:
            assert view.committed_stop is not None and view.committed_stop.reason.startswith("marker:"), mut.desc
            seen.add("unknown type")
        if len(seen) == 3 and k > 30:
            break
    assert seen == {"commit->abort", "abort->commit", "unknown type"}, seen


def test_clean_corpus_passes_every_operation(fuzz_corpus, fuzz_runner):
    ks = [f"clean:{t}" for t in fuzz_corpus.manifest["partitions"] if t != "bomb"]
    outcomes = fuzz_runner.run(ks, seed=0)
    txn_ops = len(O.TXN_OPS) - len(O.OPS)
    assert len(outcomes) == len(ks) * len(O.OPS) + txn_ops * sum(1 for k in ks if k == "clean:txn")
    assert_no_failures(outcomes, "unmutated corpus")
    assert all(o.cls == "OK" for o in outcomes), [(o.k, o.op, o.cls, o.detail) for o in outcomes if o.cls != "OK"]


def test_compression_bomb_is_read_within_the_memory_cap(fuzz_runner, request):
    """3000 zstd batches of ~100 bytes, each inflating to 1 MB: a valid log that readers must stream."""
    ops = list(O.OPS) if long_mode(request.config) else QUICK_BOMB_OPS
    outcomes = fuzz_runner.run(["clean:bomb"], seed=0, ops=ops)
    assert_no_failures(outcomes, f"compression bomb (memory cap {fuzz_runner.mem_cap / 2**20:.0f} MiB)")


@pytest.mark.parametrize("seed", QUICK_SEEDS)
def test_fuzz_quick(fuzz_runner, seed):
    outcomes = fuzz_runner.run(range(QUICK_MUTANTS), seed=seed)
    assert len(outcomes) == QUICK_MUTANTS * len(O.OPS)
    assert_no_failures(outcomes, f"seed {seed}, mutants 0..{QUICK_MUTANTS - 1}")


@pytest.mark.fuzz_long
@pytest.mark.parametrize("seed", LONG_SEEDS)
def test_fuzz_long(fuzz_corpus, tmp_path, request, seed):
    if not long_mode(request.config):
        pytest.skip("long fuzzing: pass --fuzz-long or set KAFKALOG_FUZZ_LONG=1")
    runner = Runner(fuzz_corpus, seed=seed, work=str(tmp_path), jobs=JOBS, bomb_every=LONG_BOMB_EVERY)
    try:
        outcomes = runner.run(range(LONG_MUTANTS), seed=seed)
    finally:
        runner.close()
    assert_no_failures(outcomes, f"seed {seed}, mutants 0..{LONG_MUTANTS - 1}")


@pytest.fixture(scope="session")
def txn_fuzz_runner(fuzz_corpus, tmp_path_factory):
    runner = Runner(fuzz_corpus, seed=0, work=str(tmp_path_factory.mktemp("fuzz-txn")), jobs=JOBS, txn=True)
    yield runner
    runner.close()


def test_txn_fuzz_quick(txn_fuzz_runner):
    outcomes = txn_fuzz_runner.run(range(TXN_QUICK_MUTANTS), seed=TXN_QUICK_SEED)
    assert len(outcomes) == TXN_QUICK_MUTANTS * len(O.TXN_OPS)
    assert_no_failures(outcomes, f"txn seed {TXN_QUICK_SEED}")


@pytest.mark.parametrize("seed,k", TXN_HINT_CASES)
def test_txn_hint_not_obeyed(txn_fuzz_runner, seed, k):
    outcomes = txn_fuzz_runner.run([k], seed=seed, ops=["read_committed"])
    assert_no_failures(outcomes, f"txn seed {seed}, mutant {k}")


@pytest.mark.fuzz_long
@pytest.mark.parametrize("seed", TXN_LONG_SEEDS)
def test_txn_fuzz_long(fuzz_corpus, tmp_path, request, seed):
    if not long_mode(request.config):
        pytest.skip("long fuzzing: pass --fuzz-long or set KAFKALOG_FUZZ_LONG=1")
    runner = Runner(fuzz_corpus, seed=seed, work=str(tmp_path), jobs=JOBS, txn=True)
    try:
        outcomes = runner.run(range(TXN_LONG_MUTANTS), seed=seed)
    finally:
        runner.close()
    print(f"txn seed {seed}\n{summary_table(outcomes)}")
    assert_no_failures(outcomes, f"txn seed {seed}, mutants 0..{TXN_LONG_MUTANTS - 1}")


@pytest.fixture(scope="session")
def s3_fuzz_runner(fuzz_corpus, s3_server, tmp_path_factory):
    store = ObjectStore(BUCKET, s3_server.storage_options)
    runner = Runner(fuzz_corpus, seed=0, work=str(tmp_path_factory.mktemp("fuzz-s3")), jobs=JOBS, s3=store)
    yield runner
    runner.close()


def test_s3_clean_corpus_passes_every_read(fuzz_corpus, s3_fuzz_runner):
    ks = [f"clean:{t}" for t in fuzz_corpus.manifest["partitions"] if t != "bomb"]
    outcomes = s3_fuzz_runner.run(ks, seed=0, ops=S3_QUICK_OPS)
    assert {o.store for o in outcomes} == {"s3"}
    assert_no_failures(outcomes, "unmutated corpus through S3")
    assert all(o.cls == "OK" for o in outcomes), [(o.k, o.op, o.cls, o.detail) for o in outcomes if o.cls != "OK"]


@pytest.mark.parametrize("seed,k", S3_FOUND)
def test_s3_fuzz_found(s3_fuzz_runner, seed, k):
    outcomes = s3_fuzz_runner.run([k], seed=seed, ops=S3_OPS)
    assert_no_failures(outcomes, f"S3 seed {seed}, mutant {k}")
    assert {o.cls for o in outcomes if o.op != "dump"} == {"ERROR_OK"}, [(o.op, o.cls, o.error) for o in outcomes]


@pytest.mark.parametrize("seed", S3_QUICK_SEEDS)
def test_s3_fuzz_quick(s3_fuzz_runner, seed):
    outcomes = s3_fuzz_runner.run(range(S3_QUICK_MUTANTS), seed=seed, ops=S3_QUICK_OPS)
    assert len(outcomes) == S3_QUICK_MUTANTS * len(S3_QUICK_OPS)
    assert_no_failures(outcomes, f"S3 seed {seed}, mutants 0..{S3_QUICK_MUTANTS - 1}")


@pytest.mark.fuzz_long
@pytest.mark.parametrize("seed", S3_LONG_SEEDS)
def test_s3_fuzz_long(fuzz_corpus, s3_server, tmp_path, request, seed):
    if not long_mode(request.config):
        pytest.skip("long fuzzing: pass --fuzz-long or set KAFKALOG_FUZZ_LONG=1")
    store = ObjectStore(BUCKET, s3_server.storage_options)
    runner = Runner(fuzz_corpus, seed=seed, work=str(tmp_path), jobs=JOBS, s3=store)
    try:
        outcomes = runner.run(range(S3_LONG_MUTANTS), seed=seed)
    finally:
        runner.close()
    assert len(outcomes) == S3_LONG_MUTANTS * len(S3_OPS)
    assert_no_failures(outcomes, f"S3 seed {seed}, mutants 0..{S3_LONG_MUTANTS - 1}")
