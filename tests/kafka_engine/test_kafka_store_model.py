"""A model-based property of the event store on Kafka: random interleavings of ``execute``,
``load`` and ``save`` from two runtimes (two KafkaLogs, two key indexes; the cache on in one,
off in the other) on a few aggregates (one snapshotted every 10 events), against a small
reference model of per-aggregate versions.

The model: ``execute`` always lands one event (retrying conflicts); a ``save`` of an
aggregate a runtime loaded earlier lands iff nobody saved that aggregate since the load,
else it raises ConcurrencyError and writes nothing. After every step a load by either
runtime shows the model's version; at the end the oracle (the raw partitions judged by
its own copy of the rule) shows versions 1..n exactly once per aggregate. Seeded
(``EVENTLANE_MODEL_SEED``), bounded in steps."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import orjson
import pytest

from eventlane.domain import Aggregate
from eventlane.errors import ConcurrencyError
from eventlane.log.kafka.cluster import LocalKafkaCluster
from eventlane.log.kafka.log import KafkaLog
from eventlane.log.partitioner import partition_for_key

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "store"))
from kafka_oracle import judged_partition
from store_domain import Counter, SnapCounter, make_app

AGGREGATES: list[tuple[type[Counter], str]] = [
    (Counter, "c1"),
    (Counter, "c2"),
    (SnapCounter, "s1"),
]


@pytest.mark.parametrize("steps", [40, pytest.param(600, marks=pytest.mark.soak)])
def test_random_interleavings_match_the_model(
    kafka_cluster: LocalKafkaCluster, namespace: str, steps: int
) -> None:
    seed = int(os.environ.get("EVENTLANE_MODEL_SEED", "35"))
    rng = random.Random(seed)
    logs = [KafkaLog(kafka_cluster.bootstrap, namespace=namespace) for _ in range(2)]
    apps = [make_app(logs[0]), make_app(logs[1], cache_events=0)]
    model = {agg: 0 for _, agg in AGGREGATES}
    held: dict[tuple[int, str], tuple[Aggregate, int]] = {}  # loaded, not yet saved
    trace: list[str] = []
    try:
        for step in range(steps):
            r = rng.randrange(2)
            cls, agg = rng.choice(AGGREGATES)
            op = rng.choice(["execute", "execute", "hold", "save"])
            trace.append(f"{step}: runtime {r} {op} {agg} (model {model[agg]})")
            if op == "execute" or (op == "save" and (r, agg) not in held):
                got = apps[r].execute(cls, agg, lambda c, r=r: c.increment(1, f"r{r}"), create=True)
                model[agg] += 1
                assert got.version == model[agg], trace[-5:]
            elif op == "hold":
                loaded = (
                    apps[r].load(cls, agg)
                    if model[agg]
                    else cls(agg)  # a new stream: nothing to load yet
                )
                held[(r, agg)] = (loaded, model[agg])
                assert loaded.version == model[agg], trace[-5:]
            else:
                aggregate, at = held.pop((r, agg))
                n = rng.randint(1, 3)
                for _ in range(n):
                    aggregate.increment(1, f"r{r}")  # type: ignore[attr-defined]
                if at == model[agg]:
                    apps[r].save(aggregate)
                    model[agg] += n
                else:
                    with pytest.raises(ConcurrencyError):
                        apps[r].save(aggregate)
            check = rng.randrange(2)
            if model[agg]:
                assert apps[check].load(cls, agg).version == model[agg], trace[-5:]
        for cls, agg in AGGREGATES:
            topic = cls.topic
            partition = partition_for_key(agg.encode(), logs[0].partition_count(topic))
            judged = judged_partition(kafka_cluster.bootstrap, f"{namespace}.{topic}", partition)
            versions = [
                orjson.loads(r.value or b"")["aggregate_version"]
                for r in judged
                if r.key == agg.encode() and r.visible
            ]
            assert versions == list(range(1, model[agg] + 1)), (agg, seed)
            for app in apps:
                assert app.load(cls, agg).version == model[agg]
    finally:
        for app in apps:
            app.close()
        for log in logs:
            log.close()
