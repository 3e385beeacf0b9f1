"""Closing an async runtime under load (adversarial review, 2026-11-29): ``close()`` refuses
new calls at once (``RuntimeClosedError``: not started, nothing written), lets every call in
flight end as it would have, and only then closes the log's face and the runtime. The oracle
is the log, read back by a fresh runtime: every caller told "done" finds its command stored
once, every caller told "closed" finds nothing, and no caller is left waiting.

Seen failing before the fix: 5-37 of 100 callers still waiting 30 s after ``close()``
returned, the others told ``ValueError: mmap closed``, ``ProgrammingError: closed
database`` or ``RuntimeError: cannot schedule new futures after shutdown``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from eventlane.errors import AggregateNotFoundError, LogError, RuntimeClosedError
from eventlane.log import LogStore
from eventlane.log.types import Expect
from example_apps.invoicing.app import app
from example_apps.invoicing.domain import Customer
from example_apps.invoicing.events import Address

CALLS = 100


def _register(customer: Customer) -> None:
    customer.register("n", Address("s", "Oslo", "NO"))


async def _close_under_load(data: Path, delay: float) -> dict[int, str]:
    told: dict[int, str] = {}
    runtime = app.open_async(data)
    await runtime.open()

    async def one(i: int) -> None:
        try:
            await runtime.execute(Customer, f"c-{i}", _register, create=True)
            told[i] = "done"
        except RuntimeClosedError:
            told[i] = "closed"

    first = [asyncio.ensure_future(one(i)) for i in range(CALLS)]
    await asyncio.sleep(delay)
    closing = asyncio.ensure_future(runtime.close())
    await asyncio.sleep(0)  # close() has begun: what starts now is refused
    late = [asyncio.ensure_future(one(CALLS + i)) for i in range(10)]
    await asyncio.wait_for(closing, 60)
    finished, pending = await asyncio.wait([*first, *late], timeout=5)
    assert not pending, f"{len(pending)} callers still waiting after close()"
    for task in finished:
        task.result()  # no other error reached a caller
    assert all(told[CALLS + i] == "closed" for i in range(10))
    return told


@pytest.mark.parametrize("delay", [0.0, 0.01, 0.05, 0.2])
def test_close_lets_calls_in_flight_end_and_refuses_new_ones(tmp_path: Path, delay: float) -> None:
    data = tmp_path / "data"
    told = asyncio.run(_close_under_load(data, delay))
    with app.open(data) as runtime:
        for i, outcome in told.items():
            try:
                stored = runtime.load(Customer, f"c-{i}").version
            except AggregateNotFoundError:
                stored = 0
            assert stored == (1 if outcome == "done" else 0), (i, outcome)
    assert list(told.values()).count("done") == CALLS  # all began before close()


def test_a_call_after_close_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    async def main() -> None:
        async with app.open_async(tmp_path / "data") as runtime:
            await runtime.execute(Customer, "c-1", _register, create=True)
        with pytest.raises(RuntimeClosedError, match=r"not open: execute\(\) was not started"):
            await runtime.execute(Customer, "c-2", _register, create=True)

    asyncio.run(main())


def test_an_append_to_a_closed_face_is_refused_not_left_waiting(tmp_path: Path) -> None:
    """The embedded face's lane: a conditional append after the face's pool shut down fails
    at once (it waited forever, its partition's lane stuck "busy")."""

    async def main() -> None:
        with LogStore(tmp_path / "data") as store:
            store.create_topic("t", 1)
            face = await store.async_face().open()
            await face.close()
            record = [(b"k", b"v", (), None)]
            for _ in range(2):  # the lane is not left stuck by the first refusal
                with pytest.raises(LogError, match="closed"):
                    await asyncio.wait_for(
                        face.append("t", 0, record, expect=Expect(b"k", None), atomic=True), 5
                    )

    asyncio.run(main())
