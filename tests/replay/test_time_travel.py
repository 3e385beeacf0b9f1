"""Time travel: an aggregate loaded as of a moment, and a read model rebuilt as of a moment,
equal what a log truncated at the same offsets gives (an independent oracle: the records
below the vector copied into a fresh log, rebuilt there), local == Spark."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from eventlane import AggregateNotFoundError, rebuild
from eventlane.log import LogStore, TopicPartition
from eventlane.replay import end_vector_at
from eventlane.replay.checksum import compare, file_checksums
from example_apps.invoicing.app import app
from example_apps.invoicing.domain import Customer, Order
from example_apps.invoicing.events import Address, OrderLine

PROJECTIONS = ("orders_by_status",)


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


# The spark case asks for the session's SparkSession by name (getfixturevalue), which the
# suite's grouping cannot see: the module runs on the worker that holds the SparkSession.
pytestmark = pytest.mark.xdist_group("session-spark")


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, datetime]:
    """Orders placed in two phases, with a moment ``middle`` between them."""
    data = tmp_path_factory.mktemp("travel") / "data"
    with app.open(data) as rt:
        for i in range(8):
            c = Customer(f"c{i}")
            c.register(f"name {i}", Address("s", "Oslo", "NO"))
            rt.save(c)
            o = Order(f"o{i}")
            o.place(f"c{i}", [OrderLine("sku", 1, 100)], Address("s", "Oslo", "NO"))
            rt.save(o)
        time.sleep(0.05)
        middle = datetime.now(UTC)
        time.sleep(0.05)
        for i in range(8):
            rt.execute(Order, f"o{i}", lambda o: o.confirm())
        for i in range(8, 12):
            c = Customer(f"c{i}")
            c.register(f"name {i}", Address("s", "Oslo", "NO"))
            rt.save(c)
            o = Order(f"o{i}")
            o.place(f"c{i}", [OrderLine("sku", 1, 100)], Address("s", "Oslo", "NO"))
            rt.save(o)
    return data, middle


def test_an_aggregate_as_of_a_moment(history: tuple[Path, datetime]) -> None:
    data, middle = history
    with app.open(data, create_topics=False) as rt:
        then = rt.load(Order, "o1", as_of=middle)
        now = rt.load(Order, "o1")
        assert then.status == "placed" and then.version == 1
        assert now.status == "confirmed" and now.version == 2
        assert rt.load(Order, "o1", as_of=ms(middle)).version == 1
        with pytest.raises(AggregateNotFoundError):
            rt.load(Order, "o9", as_of=middle)  # placed after the moment
        before_everything = datetime(2000, 1, 1, tzinfo=UTC)
        with pytest.raises(AggregateNotFoundError):
            rt.load(Customer, "c0", as_of=before_everything)


def truncated_copy(data: Path, target: Path, vector: dict[TopicPartition, int]) -> Path:
    """The oracle: a fresh log holding exactly the records below ``vector`` (same partitions,
    same order, same keys, values, headers and timestamps)."""
    src = LogStore(data)
    dst = LogStore(target)
    try:
        for topic in sorted({tp.topic for tp in vector}):
            count = src.partition_count(topic)
            dst.create_topic(topic, count, {"retention_ms": -1}, exist_ok=True)
            for p in range(count):
                end = vector.get(TopicPartition(topic, p), 0)
                offset = src.offsets(topic, p).lwm
                while offset < end:
                    records, _ = src.read(topic, p, offset, upto=end)
                    if not records:
                        break
                    dst.append(
                        topic, p, [(r.key, r.value, tuple(r.headers), r.timestamp) for r in records]
                    )
                    offset = records[-1].offset + 1
    finally:
        src.close()
        dst.close()
    return target


@pytest.mark.parametrize("engine", ["local", "spark"])
def test_a_read_model_as_of_a_moment_equals_a_rebuild_of_the_truncated_log(
    history: tuple[Path, datetime], tmp_path: Path, engine: str, request: pytest.FixtureRequest
) -> None:
    data, middle = history
    spark = request.getfixturevalue("spark") if engine == "spark" else None
    with app.open(data, create_topics=False) as rt:
        for name in PROJECTIONS:
            topics = app.projector(name).topic_names
            vector = end_vector_at(rt.log, topics, ms(middle))
            result = rebuild(
                rt,
                name,
                engine=engine,
                spark=spark,
                as_of=middle,
                output=tmp_path / f"{name}.sqlite",
            )
            assert dict(result.end) == vector
            now = end_vector_at(rt.log, topics, ms(datetime.now(UTC)))
            assert sum(vector.values()) < sum(now.values())  # the moment is really in the past
            oracle_data = truncated_copy(data, tmp_path / "oracle", vector)
            with app.open(oracle_data, create_topics=False) as oracle_rt:
                expected = rebuild(
                    oracle_rt, name, engine="local", output=tmp_path / "oracle.sqlite"
                )
            diffs = compare(file_checksums(expected.path), file_checksums(result.path))
            differ = [
                d.table for d in diffs if not d.equal and not d.table.startswith("_eventlane")
            ]
            assert diffs and not differ, differ
