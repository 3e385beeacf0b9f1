"""Spark: the data source, typed frames, the Spark rebuild, retries, the hand-off, memory.

One SparkSession for the run (``local[2,4]``, driver memory 512 MiB; see ``conftest``).
Every equality here is table by table, by content checksum (``eventlane.replay.checksum``).
"""

from __future__ import annotations

import doctest
import gc
import importlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import psutil
import pyarrow as pa
import pytest
from click.testing import CliRunner
from pyspark.sql import functions as F

from eventlane.cli import main
from eventlane.codec import Envelope
from eventlane.errors import ReplayError
from eventlane.log import LogStore, Record, TopicPartition
from eventlane.projection import ReadModelView, readmodel_path
from eventlane.projection.pause import PauseControl
from eventlane.replay.checksum import POSITIONS, compare, file_checksums
from eventlane.replay.datasource import EventlaneReader, records_to_arrow
from eventlane.replay.handoff import rebuild_and_swap
from eventlane.replay.merge import MergeConflictError
from eventlane.replay.rebuild import rebuild
from eventlane.replay.typed import arrow_schema, decode_batches, event_frame, event_frames
from example_apps.invoicing.app import app as invoicing
from example_apps.invoicing.events import Address, OrderLine, OrderPlaced
from tests.replay import replay_app
from tests.replay.conftest import (
    APP,
    DRIVER_MEMORY,
    ROOT,
    GeneratedLog,
    Procs,
    expected_markers,
    make_history,
    rows,
    run_live,
)

pytestmark = pytest.mark.spark


def all_equal(a: Path, b: Path, *, skip: tuple[str, ...] = ()) -> list[str]:
    """Tables that differ between two read-model files (empty: identical)."""
    return [
        d.table
        for d in compare(file_checksums(a), file_checksums(b))
        if not d.equal and d.table not in skip
    ]


@pytest.fixture(scope="module")
def local_sales(history: GeneratedLog, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The local engine's ``sales`` at the history's high-water marks (the reference)."""
    out = tmp_path_factory.mktemp("local") / "sales.sqlite"
    with replay_app.app.open(history.data, create_topics=False) as runtime:
        rebuild(runtime, "sales", engine="local", output=out)
    return out


# ---------------------------------------------------------------------------- data source
def log_rows(data: Path, topic: str) -> list[tuple[Any, ...]]:
    log = LogStore(data)
    try:
        out = []
        for p in range(log.partition_count(topic)):
            marks = log.offsets(topic, p)
            offset = marks.lwm
            while offset < marks.hwm:
                records, _ = log.read(topic, p, offset, upto=marks.hwm)
                if not records:
                    break
                out += [
                    (r.topic, r.partition, r.offset, r.key, r.value, r.headers, r.timestamp)
                    for r in records
                ]
                offset = records[-1].offset + 1
        return out
    finally:
        log.close()


def frame_rows(df: Any) -> list[tuple[Any, ...]]:
    out = []
    for r in df.collect():
        headers = tuple((h["key"], bytes(h["value"])) for h in r["headers"])
        ms = int(r["timestamp"].timestamp() * 1000)
        out.append(
            (
                r["topic"],
                r["partition"],
                r["offset"],
                bytes(r["key"]),
                bytes(r["value"]),
                headers,
                ms,
            )
        )
    return out


def test_data_source_reads_exactly_the_log(spark: Any, history: GeneratedLog) -> None:
    reader = spark.read.format("eventlane").option("path", str(history.data))
    for topic, parts in (("orders", 4), ("payments", 3), ("customers", 2)):
        df = reader.option("topic", topic).load()
        assert df.columns == [
            "topic",
            "partition",
            "offset",
            "key",
            "value",
            "headers",
            "timestamp",
        ]
        assert df.rdd.getNumPartitions() == parts  # one input partition per log partition
        want = log_rows(history.data, topic)
        assert sorted(frame_rows(df)) == sorted(want)
    # orders starts above offset 0 (retention), customers has gaps (compaction)
    lwms = history.facts["lwms"]
    orders = reader.option("topic", "orders").load()
    firsts = dict(orders.groupBy("partition").agg(F.min("offset")).collect())
    assert all(firsts[p] >= lwms[TopicPartition("orders", p)] > 0 for p in range(4))


def test_data_source_offsets_and_splits(spark: Any, history: GeneratedLog) -> None:
    base = spark.read.format("eventlane").option("path", str(history.data))
    whole = base.option("topic", "payments").load()
    split = base.option("topic", "payments").option("maxOffsetsPerPartition", "50").load()
    assert split.rdd.getNumPartitions() > 3 * 5
    assert sorted(frame_rows(split)) == sorted(frame_rows(whole))
    sliced = (
        base.option("topic", "payments")
        .option("startingOffsets", '{"0": 10, "2": 5}')
        .option("endingOffsets", orjson.dumps({"payments": {"0": 20, "1": 7, "2": 6}}).decode())
        .load()
    )
    got = sorted(
        (r["partition"], r["offset"]) for r in sliced.select("partition", "offset").collect()
    )
    assert got == [(0, o) for o in range(10, 20)] + [(1, o) for o in range(7)] + [(2, 5)]


@pytest.mark.parametrize(
    "module", ["eventlane.replay.datasource", "eventlane.replay.typed", "eventlane.replay.session"]
)
def test_docstring_examples(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_reader_pins_the_end_when_planned(history: GeneratedLog, tmp_path: Path) -> None:
    """Records appended after planning are not read by the planned tasks."""
    data = tmp_path / "data"
    log = LogStore(data)
    log.create_topic("t", 2)
    for p in range(2):
        log.append("t", p, [(b"k", b"v%d" % i, (), None) for i in range(5)])
    reader = EventlaneReader({"path": str(data), "topic": "t"})
    planned = reader.partitions()
    for p in range(2):
        log.append("t", p, [(b"k", b"late", (), None)] * 3)
    got = [batch.num_rows for part in planned for batch in reader.read(part)]
    assert sum(got) == 10
    log.close()


def test_typed_event_frame_upcasts_old_versions(
    spark: Any, history: GeneratedLog, local_sales: Path
) -> None:
    df = event_frame(spark, replay_app.app, history.data, replay_app.OrderPlaced, topics=["orders"])
    assert df.columns == [
        "topic",
        "partition",
        "offset",
        "aggregate_id",
        "aggregate_version",
        "event_id",
        "timestamp",
        "customer",
        "amount",
        "currency",
    ]
    assert dict(df.dtypes)["amount"] == "bigint"
    got = {
        (r[0], r[1], r[2], r[3])
        for r in df.select("aggregate_id", "customer", "amount", "currency").collect()
    }
    want = set(rows(local_sales, "SELECT id, customer, amount, currency FROM orders"))
    assert got == want
    assert {r[3] for r in got} == {"EUR"}  # v1 records had no currency: upcast
    # Spark SQL over the history
    df.createOrReplaceTempView("placed")
    top = spark.sql("SELECT customer, sum(amount) AS s FROM placed GROUP BY customer").collect()
    spent = dict(rows(local_sales, "SELECT customer, spent FROM customer_stats WHERE orders > 0"))
    assert {r["customer"]: r["s"] for r in top} == spent


def test_event_frames_read_the_topic_once_for_every_type(
    spark: Any, history: GeneratedLog, tmp_path: Path
) -> None:
    """``event_frames`` equals ``event_frame`` per type, and reads the log once: after the
    first action the data directory is moved away, and every frame still answers."""
    import shutil  # noqa: PLC0415

    data = tmp_path / "data"
    shutil.copytree(history.data, data)
    classes = [replay_app.OrderPlaced, replay_app.OrderShipped]  # two types of one topic
    topics = ["orders"]
    one_by_one = {
        cls: sorted(event_frame(spark, replay_app.app, data, cls, topics=topics).collect())
        for cls in classes
    }
    frames = event_frames(spark, replay_app.app, data, classes, topics=topics)
    try:
        assert list(frames) == classes
        first = sorted(frames[classes[0]].collect())
        data.rename(tmp_path / "gone")  # nothing can read the log any more
        assert first == one_by_one[classes[0]]
        for cls in classes:
            assert frames[cls].columns == list(arrow_schema(cls).names)
            assert sorted(frames[cls].collect()) == one_by_one[cls], cls
        assert all(one_by_one[cls] for cls in classes)
    finally:
        spark.catalog.clearCache()


# ---------------------------------------------------------------------------- rebuild
def test_spark_equals_local_equals_live(
    spark: Any, history: GeneratedLog, local_sales: Path, tmp_path: Path
) -> None:
    with replay_app.app.open(history.data, create_topics=False) as runtime:
        result = rebuild(
            runtime, "sales", engine="spark", spark=spark, output=tmp_path / "s.sqlite"
        )
        assert result.tasks == 9 and result.merge is not None and result.merge.partials == 9
        assert all_equal(result.path, local_sales) == []
        # the live model, built by a real worker to the same E
        run_live(runtime, "sales")
        live = readmodel_path(history.data, "sales")
        assert all_equal(result.path, live, skip=("_eventlane_dead_letters",)) == []
    assert dict(result.end) == {
        TopicPartition(t, p): o
        for t, p, o in rows(live, "SELECT topic, partition, next_offset FROM _eventlane_positions")
    }
    # the CLI does the same comparisons and prints them
    out = tmp_path / "cli.sqlite"
    res = CliRunner().invoke(
        main,
        [
            "rebuild",
            APP,
            "-p",
            "sales",
            "--output",
            str(out),
            "--verify",
            "--json",
            "--data",
            str(history.data),
        ],
    )
    assert res.exit_code == 0, res.output
    body = orjson.loads(res.stdout)
    assert [c["what"] for c in body["verify"]] == ["local engine", "live"]
    assert all(c["ok"] and c["skipped"] is None for c in body["verify"])
    assert body["rebuild"]["engine"] == "spark"


def test_task_failures_and_retries_give_the_same_result(
    spark: Any, history: GeneratedLog, local_sales: Path, tmp_path: Path
) -> None:
    """``flaky_sales`` raises mid-task on orders/0 and kills its Python worker mid-task on
    payments/1, on the first attempt only; Spark retries both (``local[2,4]``)."""
    with replay_app.app.open(history.data, create_topics=False) as runtime:
        result = rebuild(
            runtime, "flaky_sales", engine="spark", spark=spark, output=tmp_path / "f.sqlite"
        )
    assert result.retried_tasks >= 2
    assert all_equal(result.path, local_sales) == []
    assert not list(tmp_path.glob(".f.sqlite.parts-*"))  # partials cleaned up


def test_a_crashed_python_worker_is_named_and_its_parts_removed(
    spark: Any, history: GeneratedLog, tmp_path: Path
) -> None:
    """A job that fails because its Python worker died (``os._exit`` in every attempt) says
    so, not ``java.io.EOFException`` (what the JVM saw of the dead pipe), and leaves no
    ``.<output>.parts-*`` folder behind once it has failed."""
    out = tmp_path / "c.sqlite"
    with replay_app.app.open(history.data, create_topics=False) as runtime:
        with pytest.raises(ReplayError) as err:
            rebuild(runtime, "crashing_sales", engine="spark", spark=spark, output=out)
    summary = str(err.value).splitlines()[0]
    assert "EOFException" not in summary, summary
    assert "Python worker" in summary and "exited" in summary, summary
    time.sleep(3)  # tasks Spark had not stopped yet would have written by now
    assert not list(tmp_path.glob(".c.sqlite.parts-*"))
    assert not out.exists()


def _claim_parts_and_wait(output: Path, ready: Path) -> None:
    """A child process: claim a parts folder for ``output`` as a Spark rebuild does, say so
    in ``ready``, then wait to be killed."""
    from eventlane.replay.spark import claim_parts  # noqa: PLC0415

    work = claim_parts(output)
    ready.write_text(str(work.path))
    time.sleep(600)


def test_parts_of_a_killed_rebuild_are_removed_by_the_next_one(
    spark: Any, history: GeneratedLog, tmp_path: Path
) -> None:
    """A rebuild killed mid-job (kill -9: no ``finally``) leaves its parts folder; the next
    rebuild of the same output removes it, and never the folder of one still running."""
    import multiprocessing  # noqa: PLC0415

    out = tmp_path / "k.sqlite"
    ctx = multiprocessing.get_context("spawn")
    folders = []
    children = []
    for name in ("killed", "alive"):
        ready = tmp_path / f"{name}.ready"
        child = ctx.Process(target=_claim_parts_and_wait, args=(out, ready))
        child.start()
        children.append(child)
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        folders.append(Path(ready.read_text()))
    killed, alive = folders
    try:
        os.kill(children[0].pid, signal.SIGKILL)  # type: ignore[arg-type]
        children[0].join(10)
        assert killed.is_dir() and alive.is_dir()
        with replay_app.app.open(history.data, create_topics=False) as runtime:
            rebuild(runtime, "sales", engine="spark", spark=spark, output=out)
        assert not killed.exists(), "a dead rebuild's parts outlived the next rebuild"
        assert alive.is_dir(), "a running rebuild's parts were removed under it"
    finally:
        for child in children:
            child.kill()
            child.join(10)
    assert {p.name for p in tmp_path.glob(".k.sqlite.parts-*")} == {alive.name}


def test_per_key_state_runs_more_tasks_than_partitions(
    spark: Any, history: GeneratedLog, tmp_path: Path
) -> None:
    with replay_app.app.open(history.data, create_topics=False) as runtime:
        local = rebuild(runtime, "order_status", engine="local", output=tmp_path / "l.sqlite")
        grouped = rebuild(
            runtime,
            "order_status",
            engine="spark",
            spark=spark,
            key_groups=3,
            output=tmp_path / "g.sqlite",
        )
        default = rebuild(
            runtime, "order_status", engine="spark", spark=spark, output=tmp_path / "d.sqlite"
        )
    assert grouped.tasks == 12 and default.tasks >= 4
    assert all_equal(grouped.path, local.path) == []
    assert all_equal(default.path, local.path) == []


def test_cross_partition_rows_without_a_rule_fail_loudly(
    spark: Any, history: GeneratedLog, tmp_path: Path
) -> None:
    out = tmp_path / "n.sqlite"
    with replay_app.app.open(history.data, create_topics=False) as runtime:
        with pytest.raises(MergeConflictError) as err:
            rebuild(runtime, "norule", engine="spark", spark=spark, output=out)
    assert err.value.table == "per_customer"
    assert set(err.value.key) == {"customer"}
    text = str(err.value)
    assert "per_customer" in text and "customer='cust-" in text and "merge_rules" in text
    assert "orders/" in text
    assert not out.exists()


# ---------------------------------------------------------------------------- memory
def test_driver_memory_does_not_grow_with_records(spark: Any, tmp_path: Path) -> None:
    """1 GiB of records through a driver whose JVM heap is 512 MiB, and a rebuild of a
    history ten times larger than the first: the driver Python process does not grow."""
    data = tmp_path / "big"
    log = LogStore(data)
    log.create_topic("blobs", 2, {"flush_policy": "os", "segment_bytes": 64 << 20})
    value = os.urandom(16 << 10)
    batches = 0
    for _ in range(1024):
        for p in range(2):
            log.append("blobs", p, [(b"k", value, (), None)] * 32)
            batches += 1
    total = batches * 32 * len(value)
    assert total == 1 << 30
    log.close()
    heap = spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory()
    assert heap <= total / 2, f"driver heap {heap} is not small next to {total} bytes"
    df = spark.read.format("eventlane").option("path", str(data)).option("topic", "blobs").load()
    me = psutil.Process()
    gc.collect()
    before = me.memory_info().rss
    size = df.agg(F.sum(F.length("value")).alias("n")).collect()[0]["n"]
    assert size == total
    grown = me.memory_info().rss - before
    assert grown < 64 << 20, f"driver Python grew by {grown / 2**20:.0f} MiB reading 1 GiB"

    t0 = time.monotonic()
    small, large = make_history(tmp_path / "h1", 200), make_history(tmp_path / "h2", 2000)
    growth = []
    for gen in (small, large):  # the first run warms up (imports, caches)
        with replay_app.app.open(gen.data, create_topics=False) as runtime:
            gc.collect()
            before = me.memory_info().rss
            rebuild(runtime, "sales", engine="spark", spark=spark, output=tmp_path / "m.sqlite")
            gc.collect()
            growth.append(me.memory_info().rss - before)
    assert growth[1] < 32 << 20, growth  # ten times the records: the driver stays flat
    print(f"rebuild part: {time.monotonic() - t0:.1f}s, growth {growth}")
    assert DRIVER_MEMORY == "512m"


# ---------------------------------------------------------------------------- hand-off
def wait_until(cond: Any, timeout: float, what: str, procs: Procs) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{procs.output()}")
        time.sleep(0.1)


def at_hwm(data: Path, name: str) -> bool:
    log = LogStore(data)
    try:
        with ReadModelView(readmodel_path(data, name)) as view:
            pos = view.positions()
        for topic in ("orders", "payments", "customers"):
            for p in range(log.partition_count(topic)):
                marks = log.offsets(topic, p)
                at = pos.get(TopicPartition(topic, p), marks.lwm)
                if at < marks.hwm and log.read(topic, p, at, max_bytes=1, upto=marks.hwm)[0]:
                    return False
        return True
    finally:
        log.close()


def test_hand_off_under_load_has_no_gap_and_no_duplicate(
    spark: Any, tmp_path: Path, procs: Procs
) -> None:
    gen = make_history(tmp_path / "data", 800)
    data = gen.data
    live = readmodel_path(data, "sales")
    for n in range(2):
        procs.worker(data, "sales", n)
    wait_until(lambda: live.exists() and at_hwm(data, "sales"), 90, "live workers", procs)
    stop = tmp_path / "stop-producer"
    procs.start(
        [sys.executable, "-m", "tests.replay.replay_app", str(data), str(stop), "500000"],
        "producer",
    )

    def appended() -> int:
        log = LogStore(data)
        try:
            return sum(
                log.offsets(t, p).hwm
                for t in ("orders", "payments")
                for p in range(log.partition_count(t))
            )
        finally:
            log.close()

    start = appended()
    wait_until(lambda: appended() > start, 60, "the producer's first appends", procs)
    inode_before = live.stat().st_ino

    def after_end(result: Any) -> None:
        # The hand-off under test catches up what was appended after E: on a loaded machine
        # make sure the producer got there before the swap (it keeps appending meanwhile).
        end = sum(off for tp, off in result.end.items() if tp.topic in ("orders", "payments"))
        wait_until(lambda: appended() > end, 60, "appends after the rebuild's end", procs)

    with replay_app.app.open(data, create_topics=False) as runtime:
        result = rebuild_and_swap(
            runtime, "sales", engine="spark", spark=spark, pause_timeout=60, before_swap=after_end
        )
    assert live.stat().st_ino != inode_before  # the file was replaced
    assert len(result.members) == 2  # both live workers paused and acknowledged
    assert result.caught_up > 0  # records appended after E reached the shadow
    assert not PauseControl(data, "sales").path.exists()
    swapped_at = dict(result.positions)
    time.sleep(1.5)  # workers go on from the new file while the producer still appends
    stop.touch()
    wait_until(lambda: Path(f"{stop}.done").exists(), 30, "producer", procs)
    wait_until(lambda: at_hwm(data, "sales"), 90, "catch-up after the swap", procs)
    for proc in procs.procs:
        if proc.poll() is None and proc.args[5:7] == ["project", "worker"]:  # type: ignore[index]
            proc.send_signal(signal.SIGTERM)
    for proc in procs.procs:
        assert proc.wait(30) == 0, procs.output()

    # 0 gaps, 0 duplicates: exactly the events of the whole log, each applied once
    markers = rows(live, "SELECT topic, partition, offset FROM applied")
    assert len(markers) == len(set(markers))
    assert set(markers) == expected_markers(data)
    assert rows(live, "SELECT events FROM totals") == [(100 + len(markers),)]
    letters = rows(live, "SELECT topic, error FROM _eventlane_dead_letters")
    assert letters and all(t == "payments" and "negative" in e for t, e in letters)
    # the workers applied past the swap positions, in the new file
    after = {
        (t, p): o
        for t, p, o in rows(live, "SELECT topic, partition, next_offset FROM _eventlane_positions")
    }
    assert any(after[(tp.topic, tp.partition)] > off for tp, off in swapped_at.items())
    # and the whole model equals the reference engine at the final end vector
    with replay_app.app.open(data, create_topics=False) as runtime:
        ref = rebuild(runtime, "sales", engine="local", output=tmp_path / "ref.sqlite")
    assert all_equal(ref.path, live, skip=("_eventlane_dead_letters",)) == []
    assert POSITIONS in file_checksums(live)
    assert str(ROOT) in os.environ["PYTHONPATH"]


def test_typed_rows_of_nested_events(tmp_path: Path) -> None:
    """Structs, arrays of structs: the example app's ``OrderPlaced`` (decoded without a
    session: the same function ``mapInArrow`` runs in the workers). Its shipping address is
    personal: the executor's codec opens the app's key store in the data directory."""
    event = OrderPlaced(
        "customer-1",
        (OrderLine("sku-1", 2, 450), OrderLine("sku-2", 1, 999)),
        Address("1 Main St", "Oslo", "NO"),
    )
    data = tmp_path / "data"
    with invoicing.open(data) as runtime:
        key, value, headers = runtime.codec.encode(Envelope(event, "order-1", 1))
    assert b"1 Main St" not in value  # sealed on the way in
    raw = records_to_arrow(
        [Record("orders", 0, 7, 1_700_000_000_000, 0, key, value, tuple(headers))]
    )
    (batch,) = list(decode_batches([raw], invoicing, OrderPlaced, data))
    schema = arrow_schema(OrderPlaced)
    assert pa.types.is_list(schema.field("lines").type)
    assert pa.types.is_struct(schema.field("shipping_address").type)
    row = batch.to_pylist()[0]
    assert row["aggregate_id"] == "order-1" and row["offset"] == 7
    assert row["lines"] == [
        {"sku": "sku-1", "quantity": 2, "unit_price_cents": 450},
        {"sku": "sku-2", "quantity": 1, "unit_price_cents": 999},
    ]
    assert row["shipping_address"] == {"street": "1 Main St", "city": "Oslo", "country": "NO"}
