"""An ``async def`` policy (10 ms "remote call" per event, tasks with per-key parallelism)
issues exactly one command per event while its worker is killed with SIGKILL.

Real worker processes (``Runner``, restarted after the kill), a real log. Oracle: the
counter events written here; every event must have exactly one ``echo`` stream with exactly
one event, caused by it; the remote call may repeat (at-least-once) and is only counted.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import orjson
import pytest
from aio_app import app, echo_id
from store_domain import Counter

from eventlane.codec import HEADER_CAUSATION_ID, HEADER_EVENT_ID
from eventlane.projection import Runner, open_readmodel

HERE = Path(__file__).resolve().parent


def raw(log: object, topic: str) -> list[object]:
    out: list[object] = []
    for p in range(log.partition_count(topic)):  # type: ignore[attr-defined]
        marks = log.offsets(topic, p)  # type: ignore[attr-defined]
        offset, cursor = marks.lwm, None
        while offset < marks.hwm:
            records, cursor = log.read(topic, p, offset, cursor=cursor, upto=marks.hwm)  # type: ignore[attr-defined]
            if not records:
                break
            out.extend(records)
            offset = records[-1].offset + 1
    return out


def header(record: object, name: str) -> str | None:
    for key, value in record.headers:  # type: ignore[attr-defined]
        if key == name and value is not None:
            return str(value.decode())
    return None


@pytest.mark.parametrize(
    "orders", [pytest.param(300, id="300"), pytest.param(1000, id="1000", marks=pytest.mark.soak)]
)
def test_async_policy_issues_exactly_once_under_kill_9(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, orders: int
) -> None:
    data = tmp_path / "data"
    monkeypatch.setenv(
        "PYTHONPATH",
        os.pathsep.join([str(HERE), str(HERE.parent / "store"), os.environ.get("PYTHONPATH", "")]),
    )
    monkeypatch.setenv("AIO_CALLS", str(tmp_path / "calls.txt"))
    with app.open(data) as rt:
        open_readmodel(rt, "echo", migrate=True).close()
        runner = Runner(
            "aio_app:app", "echo", data, workers=1, restart=True, session_timeout_ms=1500
        )
        runner.start()
        try:
            ids = [f"c-{i % (orders // 2)}" for i in range(orders)]  # two events per counter
            killed = False
            for n, cid in enumerate(ids):
                rt.execute(Counter, cid, lambda c: c.increment(1), create=True)
                if n == orders // 2 and not killed:
                    time.sleep(0.3)  # let it be mid-flight
                    os.kill(runner.procs[0].pid, signal.SIGKILL)
                    killed = True
            events = raw(rt.log, rt.names.aggregate_topic(Counter))
            assert len(events) == orders
            deadline = time.monotonic() + 180
            while True:
                runner.supervise_once()
                echoes = raw(rt.log, "snapcounters")
                if len(echoes) >= orders or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            time.sleep(1.0)  # anything issued twice would land now
            echoes = raw(rt.log, "snapcounters")
        finally:
            runner.stop()
    assert runner.restarts >= 1, "the worker was never killed and restarted"
    by_stream: dict[bytes, list[object]] = {}
    for r in echoes:
        by_stream.setdefault(r.key, []).append(r)  # type: ignore[attr-defined]
    causes = {header(e, HEADER_EVENT_ID): e for e in events}
    expected = {
        echo_id(e.key.decode(), v).encode()  # type: ignore[attr-defined]
        for e, v in ((e, _version(e)) for e in events)
    }
    assert set(by_stream) == expected, "an event without its echo, or an echo without event"
    twice = {k: len(v) for k, v in by_stream.items() if len(v) != 1}
    assert not twice, f"issued more than once: {twice}"
    assert {header(r, HEADER_CAUSATION_ID) for r in echoes} == set(causes)
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert len(calls) >= orders  # at-least-once remote calls


def _version(record: object) -> int:
    return int(orjson.loads(record.value)["aggregate_version"])  # type: ignore[attr-defined]
