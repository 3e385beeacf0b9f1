"""The embedded log's asyncio face (eventlane/log/embedded/aio.py) against a reference model.

Conditional appends awaited by many tasks on one loop (and, in one test, made at the same
time by another process through the sync log) are written in groups, one fsync a group.
The model is the conditional append's own rule, replayed over what the log holds: an append
is stored only if, when it was written, the key's last record was the one it expected; so,
in log order, every stored record's expectation names the record of its key just before it.
Every acknowledged append is in the log exactly once at the offset it was told, nothing
refused is, and offsets are contiguous. Real files, real fsyncs; an fsync failure is
injected by replacing ``os.fdatasync`` (the fault, not the thing under test).
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import random
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventlane.errors import ConcurrencyError, PartitionReadOnlyError
from eventlane.log import LogStore
from eventlane.log.types import Expect

TOPIC = "t"
KEYS = [b"k0", b"k1", b"k2", b"k3", b"k4"]
ROOT = Path(__file__).resolve().parents[2]


def _partition(key: bytes) -> int:
    return KEYS.index(key) % 2


@dataclass
class Outcomes:
    """What the appenders were told: value -> (key, expected, offset) if acknowledged;
    value -> (key, expected, actual) if refused."""

    acked: dict[bytes, tuple[bytes, int | None, int]] = field(default_factory=dict)
    refused: dict[bytes, tuple[bytes, int | None, int | None]] = field(default_factory=dict)


def _check(store: LogStore, outcomes: Outcomes) -> None:
    """The model (module docstring) over what the log holds."""
    for p in range(2):
        marks = store.offsets(TOPIC, p)
        records, _ = store.read(TOPIC, p, 0, max_bytes=1 << 24)
        assert [r.offset for r in records] == list(range(marks.hwm)), "offsets not contiguous"
        last: dict[bytes, int] = {}
        for r in records:
            assert r.key is not None and r.value is not None
            assert r.value in outcomes.acked, f"{r.value!r} stored, not acknowledged (p{p})"
            key, expected, offset = outcomes.acked[r.value]
            assert (key, offset) == (r.key, r.offset), f"{r.value!r} acked at {offset}"
            assert expected == last.get(key), (
                f"{r.value!r} at {r.offset} expected {expected}, key's last was {last.get(key)}"
            )
            last[key] = r.offset
        stored = {r.value for r in records}
        for value, (key, _, _) in outcomes.acked.items():
            if _partition(key) == p:
                assert value in stored, f"acknowledged {value!r} lost"
        for value, (key, expected, actual) in outcomes.refused.items():
            assert value not in stored, f"refused {value!r} stored"
            assert actual != expected
            if actual is not None and _partition(key) == p:
                assert actual in {r.offset for r in records if r.key == key}


async def _appender(
    face: Any, ops: list[tuple[int, bool, int]], name: str, outcomes: Outcomes
) -> None:
    """One task: for each op, the key's head read through the face (or the task's stale
    belief), then a conditional append; ``spins`` yields between."""
    believed: dict[bytes, int | None] = {}
    for i, (k, stale, spins) in enumerate(ops):
        key = KEYS[k]
        p = _partition(key)
        if not stale or key not in believed:
            records = await face.read_key(TOPIC, p, key)
            believed[key] = records[-1].offset if records else None
        for _ in range(spins):
            await asyncio.sleep(0)
        expected = believed[key]
        value = f"{name}-{i}".encode()
        try:
            result = await face.append(
                TOPIC, p, [(key, value, (), None)], expect=Expect(key, expected), atomic=True
            )
        except ConcurrencyError as err:
            outcomes.refused[value] = (key, expected, err.actual)  # type: ignore[attr-defined]
            believed.pop(key, None)
            continue
        outcomes.acked[value] = (key, expected, result.base_offset)
        believed[key] = result.base_offset


def _create(
    face: Any, partition: int, key: bytes, value: bytes | None = None
) -> Coroutine[Any, Any, Any]:
    """The conditional append of ``key``'s first record (its value: the key, or ``value``)."""
    record = (key, key if value is None else value, (), None)
    return face.append(TOPIC, partition, [record], expect=Expect(key, None), atomic=True)


@pytest.fixture
def store_dir(tmp_path: Path) -> Iterator[Path]:
    with LogStore(tmp_path / "data") as store:
        store.create_topic(TOPIC, 2)
    yield tmp_path / "data"


def _run_tasks(data: Path, schedules: list[list[tuple[int, bool, int]]]) -> Outcomes:
    outcomes = Outcomes()

    async def main() -> None:
        with LogStore(data) as store:
            async with store.async_face() as face:
                await asyncio.gather(
                    *(_appender(face, ops, f"t{n}", outcomes) for n, ops in enumerate(schedules))
                )

    asyncio.run(main())
    return outcomes


OPS = st.lists(
    st.tuples(st.integers(0, len(KEYS) - 1), st.booleans(), st.integers(0, 3)), max_size=12
)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(schedules=st.lists(OPS, min_size=1, max_size=8))
def test_conditional_appends_of_tasks_match_the_model(schedules: list[Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        with LogStore(data) as store:
            store.create_topic(TOPIC, 2)
        outcomes = _run_tasks(data, schedules)
        assert len(outcomes.acked) + len(outcomes.refused) == sum(map(len, schedules))
        with LogStore(data) as store:
            _check(store, outcomes)


_CHILD = textwrap.dedent(
    """
    import json, random, sys
    from eventlane.errors import ConcurrencyError
    from eventlane.log import LogStore
    from eventlane.log.types import Expect

    data, seed, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    keys = [b"k0", b"k1", b"k2", b"k3", b"k4"]
    rng = random.Random(seed)
    with LogStore(data) as store:
        for i in range(count):
            key = rng.choice(keys)
            p = keys.index(key) % 2
            records = store.read_key("t", p, key)
            expected = records[-1].offset if records else None
            value = b"proc-%d" % i
            try:
                result = store.append(
                    "t", p, [(key, value, (), None)], expect=Expect(key, expected), atomic=True
                )
            except ConcurrencyError as err:
                out = ["refused", value.decode(), key.decode(), expected, err.actual]
            else:
                out = ["acked", value.decode(), key.decode(), expected, result.base_offset]
            print(json.dumps(out), flush=True)
    """
)


@pytest.mark.parametrize("seed", [1, 2])
def test_tasks_and_another_process_append_to_the_same_keys(store_dir: Path, seed: int) -> None:
    """The face's grouped writes take the partition's lock as every process's appends do:
    tasks of this process and a real second process append to the same keys at once."""
    rng = random.Random(seed)
    schedules = [
        [(rng.randrange(len(KEYS)), rng.random() < 0.3, rng.randrange(3)) for _ in range(40)]
        for _ in range(8)
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(store_dir), str(seed), "150"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        outcomes = _run_tasks(store_dir, schedules)
        out, _ = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 0
    theirs = [json.loads(line) for line in out.splitlines()]
    assert len(theirs) == 150
    for kind, value, key, expected, where in theirs:
        entry = (key.encode(), expected, where)
        (outcomes.acked if kind == "acked" else outcomes.refused)[value.encode()] = entry
    with LogStore(store_dir) as store:
        _check(store, outcomes)
    mine = [v for v in outcomes.acked if v.startswith(b"t")]
    assert mine and len(mine) < len(outcomes.acked), "both appenders were acknowledged"


def test_concurrent_awaits_on_a_partition_share_fsyncs_off_the_loop(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """64 tasks appending to new keys of one partition: far fewer fsyncs than appends, and
    no write or fsync made on the loop's thread."""
    calls: list[tuple[str, int]] = []
    for name in ("fdatasync", "pwritev", "write"):
        real = getattr(os, name)

        def watched(*args: Any, _name: str = name, _real: Callable[..., Any] = real) -> Any:
            calls.append((_name, threading.get_ident()))
            return _real(*args)

        monkeypatch.setattr(os, name, watched)

    async def main() -> tuple[int, list[int]]:
        with LogStore(store_dir) as store:
            async with store.async_face() as face:
                loop_thread = threading.get_ident()
                results = await asyncio.gather(
                    *(_create(face, 0, b"n-%d" % i, b"v") for i in range(64))
                )
                return loop_thread, [r.base_offset for r in results]

    loop_thread, offsets = asyncio.run(main())
    monkeypatch.undo()
    assert sorted(offsets) == list(range(64))
    syncs = [c for c in calls if c[0] == "fdatasync"]
    assert 1 <= len(syncs) <= 16, f"{len(syncs)} fsyncs for 64 concurrent appends"
    assert not [c for c in calls if c[1] == loop_thread], "file work on the loop"


def test_a_failed_fsync_fails_every_append_of_its_group(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fsync that would cover a group fails (EIO): no append of the group is
    acknowledged, every one is told the partition went read-only, and none is in the log
    once it is reopened; appends acknowledged before stay."""
    with LogStore(store_dir) as store:
        store.append(TOPIC, 0, [(b"before", b"before", (), None)])
    real = os.fdatasync

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error (injected)")

    async def main() -> list[Any]:
        with LogStore(store_dir) as store:
            store.offsets(TOPIC, 0)  # opened before the fault is armed
            async with store.async_face() as face:
                monkeypatch.setattr(os, "fdatasync", failing)
                outcomes = await asyncio.gather(
                    *(_create(face, 0, b"g-%d" % i) for i in range(16)),
                    return_exceptions=True,
                )
                monkeypatch.setattr(os, "fdatasync", real)
                return outcomes

    outcomes = asyncio.run(main())
    assert all(isinstance(o, PartitionReadOnlyError) for o in outcomes), outcomes
    with LogStore(store_dir) as store:
        records, _ = store.read(TOPIC, 0, 0)
        assert [r.value for r in records] == [b"before"]
        assert store.append(TOPIC, 0, [(b"after", b"after", (), None)]).base_offset == 1


def test_a_cancelled_awaiter_leaves_the_others_answered(store_dir: Path) -> None:
    """A task cancelled while its append is in a group: the group's other appends are
    answered, and the cancelled one is either stored once or not at all."""

    async def main() -> tuple[list[Any], LogStore]:
        store = LogStore(store_dir)
        async with store.async_face() as face:
            tasks = [asyncio.ensure_future(_create(face, 1, b"c-%d" % i)) for i in range(8)]
            await asyncio.sleep(0)
            tasks[3].cancel()
            done = await asyncio.gather(*tasks, return_exceptions=True)
        return done, store

    done, store = asyncio.run(main())
    with store:
        records, _ = store.read(TOPIC, 1, 0)
    values = [r.value for r in records]
    assert isinstance(done[3], asyncio.CancelledError)
    for i, outcome in enumerate(done):
        if i != 3:
            assert values[outcome.base_offset] == b"c-%d" % i
    assert values.count(b"c-3") <= 1 and len(values) in (7, 8)


def test_async_commands_on_the_embedded_log_make_no_file_call_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commands on orders (a personal field: a key per customer in the key topic) through
    ``app.open_async`` on the embedded log: the log's calls made on the loop's thread are
    only those answered from memory (a fresh cached partition count, an open partition's
    marks), and the key store's catch-up when the runtime's key tail is behind (as on
    JetStream: eventlane/app/aio_keys.py); every append, key read and topic check runs in
    a thread. The orders are stored and load decrypted."""
    from example_apps.invoicing import app as invoicing  # noqa: PLC0415
    from example_apps.invoicing.domain import Order  # noqa: PLC0415
    from example_apps.invoicing.events import Address, OrderLine  # noqa: PLC0415

    in_memory = {"cached_partition_count", "is_open", "offsets"}
    on_loop: list[str] = []
    loop_thread: list[int] = []
    inside = threading.local()
    for name in dir(LogStore):
        real = getattr(LogStore, name)
        if name.startswith("_") or not callable(real) or name in ("async_face",):
            continue

        def watched(self: Any, *args: Any, _name: str = name, _real: Any = real, **kw: Any) -> Any:
            catch_up = _name == "read" and str(args[0]).endswith("keys")
            if threading.get_ident() not in loop_thread or getattr(inside, "call", None):
                return _real(self, *args, **kw)  # (a call made by another one: not counted)
            if _name not in in_memory and not catch_up:
                on_loop.append(_name)
            inside.call = _name
            try:
                return _real(self, *args, **kw)
            finally:
                inside.call = None

        monkeypatch.setattr(LogStore, name, watched)
    line, home = OrderLine("sku-1", 1, 100), Address("1 Main St", "Oslo", "NO")

    def place(customer: str) -> Callable[[Order], None]:
        return lambda order: order.place(customer, [line], home)

    async def main() -> list[Order]:
        async with invoicing.open_async(tmp_path / "data") as rt:
            loop_thread.append(threading.get_ident())
            for round_ in range(3):
                await asyncio.gather(
                    *(
                        rt.execute(Order, f"o-{round_}-{i}", place(f"c-{i % 3}"), create=True)
                        for i in range(6)
                    )
                )
                await asyncio.sleep(0.6)  # past the metadata cache's and key store's freshness
            await rt.execute(Order, "o-0-0", lambda order: order.confirm())
            loaded = [await rt.load(Order, f"o-{r}-{i}") for r in range(3) for i in range(6)]
            loop_thread.clear()
            return loaded

    loaded = asyncio.run(main())
    assert not on_loop, f"log calls on the loop's thread: {sorted(set(on_loop))}"
    assert [o.customer_id for o in loaded] == [f"c-{i % 3}" for _ in range(3) for i in range(6)]
    assert loaded[0].status == "confirmed" and loaded[0].shipping_address == home
