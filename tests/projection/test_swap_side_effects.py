"""A hand-off never takes over work the live workers had not done (adversarial review,
2026-11-29): ``rebuild --swap`` replays with side effects suppressed (``ctx.replaying``), so
it may replay only events the live read model had applied. A policy whose workers lag keeps
the rest for them: after the swap they issue its commands, exactly one invoice per order.
The oracle is the log itself: every order's invoice stream holds exactly one event.

Seen failing before the fix (both engines): the swap caught the shadow up to the
high-water marks, the workers went on from there, and 8 of 12 orders never got an invoice.
"""

from __future__ import annotations

from pathlib import Path

from projection_kit import BOTH
from test_projection_apply import all_records, applier_for

from eventlane.app import Runtime
from eventlane.errors import AggregateNotFoundError
from eventlane.log import TopicPartition
from eventlane.replay.handoff import rebuild_and_swap
from tests.projection import bankapp

ORDERS = 12


def invoices(runtime: Runtime) -> dict[str, int]:
    """Invoice events per order, read from the log."""
    found = {}
    for n in range(ORDERS):
        try:
            found[f"order-{n}"] = len(runtime.store.read("invoices", f"invoice-order-{n}"))
        except AggregateNotFoundError:
            found[f"order-{n}"] = 0
    return found


@BOTH
def test_swap_leaves_what_a_lagging_policy_had_not_handled_to_its_workers(
    engine: str, runtime: Runtime, data: Path
) -> None:
    for n in range(ORDERS):
        runtime.execute(bankapp.Order, f"order-{n}", lambda o, n=n: o.place(10 + n), create=True)
    orders = all_records(runtime, "orders")
    applier, readmodel = applier_for(runtime, "invoicing")
    handled = orders[:4]  # the live policy has handled 4 orders and lags on the rest
    assert applier.apply(handled).applied == 4
    live = readmodel.positions()
    readmodel.close()

    handoff = rebuild_and_swap(runtime, "invoicing", engine="local")
    # the shadow stopped where the live model stood: nothing replayed past it
    assert {tp: o for tp, o in handoff.positions.items() if o} == {
        tp: o for tp, o in live.items() if o
    }
    assert sum(invoices(runtime).values()) == 4

    applier, readmodel = applier_for(runtime, "invoicing")  # the workers go on
    try:
        assert applier.apply(orders).applied == ORDERS - 4
    finally:
        readmodel.close()
    assert invoices(runtime) == {f"order-{n}": 1 for n in range(ORDERS)}


@BOTH
def test_a_first_swap_with_no_live_read_model_builds_to_the_end(
    engine: str, runtime: Runtime, data: Path
) -> None:
    """No live read model at all (a first build): the hand-off builds to the high-water
    marks, and (documented) a policy built that way issues nothing for that history."""
    for n in range(3):
        runtime.execute(bankapp.Order, f"order-{n}", lambda o, n=n: o.place(10 + n), create=True)
    handoff = rebuild_and_swap(runtime, "invoicing", engine="local")
    ends = {
        TopicPartition("orders", p): runtime.log.offsets("orders", p).hwm
        for p in range(runtime.log.partition_count("orders"))
    }
    assert {tp: o for tp, o in handoff.positions.items() if o} == {
        tp: o for tp, o in ends.items() if o
    }
    assert sum(invoices(runtime).values()) == 0
