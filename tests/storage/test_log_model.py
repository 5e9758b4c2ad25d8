"""Model-based: reads by offset and by timestamp against a brute-force list of every record."""

import shutil
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition
from tests.helpers.kafka_reference import kp_batch

TP = TopicPartition("t", 0)

batch_strategy = st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=6)


@st.composite
def workloads(draw):
    batches = draw(st.lists(batch_strategy, min_size=1, max_size=40))
    config = {
        "segment.bytes": str(draw(st.integers(min_value=100, max_value=3000))),
        "index.interval.bytes": str(draw(st.sampled_from([0, 1, 64, 300, 4096]))),
        "segment.ms": str(draw(st.sampled_from([1, 500, 5000, 604800000]))),
        "segment.index.bytes": str(draw(st.sampled_from([24, 48, 10485760]))),
    }
    sessions = draw(st.integers(min_value=1, max_value=4))
    per_append = draw(st.sampled_from([1, 2, 7, 40]))
    probes_t = draw(st.lists(st.integers(min_value=-5, max_value=10_005), min_size=1, max_size=8))
    return batches, config, sessions, per_append, probes_t


def build_log(root, batches, config, sessions, per_append):
    lm = LogManager(root)
    lm.create_topic("t", 1, config)
    model = []  # (offset, timestamp, value)
    cut = max(1, len(batches) // sessions)
    for s in range(0, len(batches), cut):
        with lm.open_log(TP, writable=True) as log:
            session = batches[s : s + cut]
            for a in range(0, len(session), per_append):  # several batches per append: rolls happen mid-append
                first = len(model)
                data = b""
                for timestamps in session[a : a + per_append]:
                    base = len(model)
                    recs = [(ts, None, b"v%d" % (base + i), []) for i, ts in enumerate(timestamps)]
                    data += kp_batch(recs)
                    model.extend(
                        [(base + i, ts, r[2]) for i, (ts, r) in enumerate(zip(timestamps, recs, strict=False))]
                    )
                info = log.append(data)
                assert (info.first_offset, info.last_offset) == (first, len(model) - 1)
    return lm, model


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads(), st.data())
def test_reads_match_brute_force(workload, data):
    batches, config, sessions, per_append, probes_t = workload
    root = tempfile.mkdtemp()
    try:
        lm, model = build_log(root, batches, config, sessions, per_append)
        with lm.open_log(TP) as log:
            assert log.log_end_offset == len(model)
            for seg in log.segments:  # no segment holds an offset below its base
                for chunk in seg.iter_chunks(0):
                    assert int(chunk.scan.headers["base_offset"].min()) >= seg.base_offset
            # read from random offsets to the end, and bounded ranges
            for start in data.draw(st.lists(st.integers(0, len(model)), min_size=1, max_size=5)):
                end = data.draw(st.integers(start, len(model)))
                got = [
                    (o, t, v)
                    for b in log.read_records(start, end)
                    for o, t, v in zip(
                        b.column("offset").to_pylist(),
                        b.column("timestamp").to_pylist(),
                        b.column("value").to_pylist(),
                        strict=False,
                    )
                ]
                assert got == model[start:end]
            # earliest offset whose timestamp >= T
            for t in probes_t + [r[1] for r in model[:3]]:
                expected = next((o for o, ts, _ in model if ts >= t), None)
                assert log.offset_for_timestamp(t) == expected, (t, expected)
    finally:
        shutil.rmtree(root, ignore_errors=True)
