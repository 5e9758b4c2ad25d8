#!/usr/bin/env bash
# A Kafka-format log on local disk with no broker: create a topic, produce, describe, consume by
# offset and by timestamp, dump the segment files as kafka-dump-log.sh would, and let kafka-python
# (an independent Kafka client) read the files back.
# Usage: bash examples/quickstart.sh [ROOT]    (default ./quickstart-logs, made afresh; a ROOT you
# give must be new or empty: it is never deleted)
set -euo pipefail
if [ $# -ge 1 ]; then
  ROOT=$1
  if [ -e "$ROOT" ] && [ -n "$(ls -A "$ROOT")" ]; then
    echo "quickstart: error: $ROOT is not empty; give a new directory" >&2
    exit 1
  fi
else
  ROOT=./quickstart-logs
  rm -rf "$ROOT"
fi

kafkalog topics "$ROOT" --create --topic events --partitions 3 --config segment.bytes=2048 --config index.interval.bytes=512

"${PYTHON:-python}" - <<'PY' | kafkalog produce "$ROOT" --topic events --compression zstd --batch-size 50
import json
for i in range(3000):
    print(json.dumps({"key": f"user-{i % 40}", "value": f"event {i}", "timestamp": 1700000000000 + i * 1000,
                      "headers": [["seq", str(i)]]}))
PY

kafkalog describe "$ROOT"
echo "--- first records of partition 0"
kafkalog consume "$ROOT" --topic events --partition 0 --max-messages 3
echo "--- records at or after 2023-11-14T22:30:00Z (1700001000000)"
kafkalog consume "$ROOT" --topic events --partition 0 --timestamp 1700001000000 --max-messages 3
echo "--- kafka-dump-log view of the first segment"
kafkalog dump-log "$ROOT/events-0/00000000000000000000.log" | head -4
kafkalog dump-log "$ROOT/events-0/00000000000000000000.index" | head -4

echo "--- kafka-python reads every segment"
"${PYTHON:-python}" - "$ROOT" <<'PY'
import glob, sys
from kafka.record import MemoryRecords
total = 0
for path in sorted(glob.glob(f"{sys.argv[1]}/events-*/*.log")):
    records = MemoryRecords(open(path, "rb").read())
    while records.has_next():
        batch = records.next_batch()
        assert batch.validate_crc(), path
        total += sum(1 for _ in batch)
print(f"kafka-python read {total} records, every CRC valid")
PY
