"""A producer process for the leader-kill test: appends numbered records through KafkaLog
and prints each outcome on stdout, one line each, flushed before the next append:
``ack ID PARTITION OFFSET``, ``unknown ID`` (OutcomeUnknownError) or ``refused ID``
(an error that says nothing was written). Bounded by a record count and a deadline.

usage: acked_producer.py BOOTSTRAP NAMESPACE TOPIC NAME COUNT SECONDS
"""

from __future__ import annotations

import sys
import time

from eventlane.errors import LogError, OutcomeUnknownError
from eventlane.log.kafka.log import KafkaLog


def main() -> None:
    bootstrap, namespace, topic, name, count, seconds = sys.argv[1:]
    deadline = time.monotonic() + float(seconds)
    with KafkaLog(bootstrap, namespace=namespace, timeout=20.0) as log:
        partitions = log.partition_count(topic)
        for i in range(int(count)):
            if time.monotonic() > deadline:
                break
            rid = f"{name}-{i}"
            p = i % partitions
            try:
                result = log.append(topic, p, [(rid.encode(), rid.encode(), (), None)])
            except OutcomeUnknownError:
                print(f"unknown {rid}", flush=True)
            except LogError as exc:
                assert exc.retriable or not exc.indeterminate
                print(f"refused {rid}", flush=True)
            else:
                print(f"ack {rid} {p} {result.base_offset}", flush=True)


if __name__ == "__main__":
    main()
