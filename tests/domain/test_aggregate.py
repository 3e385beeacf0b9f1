"""Aggregates: invariants, apply dispatch, versions, pending events, rehydration, snapshots."""

from __future__ import annotations

from decimal import Decimal
from typing import ClassVar

import pytest
from domain_samples import Cart, CartCheckedOut, CartError, CartOpened, ItemAdded
from hypothesis import given
from hypothesis import strategies as st

from eventlane.domain import Aggregate, Snapshot, applies
from eventlane.errors import (
    ConfigError,
    DomainError,
    MissingApplyError,
    StaleSnapshotError,
    StateMutationError,
)


def filled_cart() -> Cart:
    cart = Cart.open("cart-1", "ada")
    cart.add("A", Decimal("2.50"))
    cart.add("B", Decimal("1.25"))
    return cart


def test_new_aggregate() -> None:
    cart = Cart("cart-1")
    assert (cart.id, cart.version, cart.committed_version, cart.pending_events) == (
        "cart-1",
        0,
        0,
        (),
    )
    assert (cart.owner, cart.items, cart.checked_out) == (None, [], False)
    assert repr(cart) == "Cart(id='cart-1', version=0)"


def test_commands_record_and_apply_events_with_versions_1_2_3() -> None:
    cart = filled_cart()
    assert cart.pending_events == (
        CartOpened("ada"),
        ItemAdded("A", Decimal("2.50")),
        ItemAdded("B", Decimal("1.25")),
    )
    assert (cart.version, cart.committed_version) == (3, 0)
    assert cart.total == Decimal("3.75")
    cart.mark_committed()
    assert (cart.version, cart.committed_version, cart.pending_events) == (3, 3, ())
    cart.check_out()
    assert (cart.version, cart.committed_version) == (4, 3)
    assert cart.pending_events == (CartCheckedOut(Decimal("3.75")),)


def test_invariants_raise_domain_errors_and_record_nothing() -> None:
    cart = Cart("cart-1")
    with pytest.raises(CartError, match="not open"):
        cart.add("A", Decimal(1))
    cart = Cart.open("cart-1", "ada")
    with pytest.raises(DomainError, match="empty cart"):
        cart.check_out()
    with pytest.raises(CartError, match="positive"):
        cart.add("A", Decimal(0))
    assert cart.version == 1
    assert len(cart.pending_events) == 1


def test_rehydrate_equals_live_state() -> None:
    live = filled_cart()
    live.check_out()
    rebuilt = Cart.rehydrate("cart-1", live.pending_events)
    assert (rebuilt.owner, rebuilt.items, rebuilt.checked_out) == (
        live.owner,
        live.items,
        live.checked_out,
    )
    assert (rebuilt.version, rebuilt.committed_version, rebuilt.pending_events) == (4, 4, ())


@given(
    st.lists(
        st.decimals(min_value=Decimal("0.01"), max_value=Decimal(10**6), places=2), max_size=20
    )
)
def test_rehydrate_equals_live_state_for_any_history(prices: list[Decimal]) -> None:
    live = Cart.open("c", "ada")
    for i, price in enumerate(prices):
        live.add(f"sku-{i}", price)
    rebuilt = Cart.rehydrate("c", live.pending_events)
    assert rebuilt.take_snapshot() == live.take_snapshot()
    assert rebuilt.version == len(prices) + 1


def test_state_changes_only_by_applying_events() -> None:
    cart = filled_cart()
    with pytest.raises(StateMutationError, match=r"Cart\.owner may only be assigned"):
        cart.owner = "mallory"
    with pytest.raises(StateMutationError):
        del cart.checked_out
    with pytest.raises(AttributeError):  # StateMutationError is an AttributeError
        cart.brand_new = 1  # type: ignore[attr-defined]
    assert cart.owner == "ada"


def test_missing_apply_method_is_a_clear_error() -> None:
    cart = Cart.open("cart-1", "ada")
    with pytest.raises(
        MissingApplyError,
        match=r"Cart has no apply method for CartAbandoned; .*@applies\(CartAbandoned\)",
    ):
        cart.abandon()
    assert cart.version == 1
    assert len(cart.pending_events) == 1


def test_apply_methods_must_not_record() -> None:
    class Recursive(Aggregate):
        topic: ClassVar[str] = "r"

        @applies(CartOpened)
        def _opened(self, event: CartOpened) -> None:
            self.record_that(CartOpened("again"))

    with pytest.raises(StateMutationError, match="must not record"):
        Recursive("r").record_that(CartOpened("x"))


def test_failed_apply_records_nothing() -> None:
    class Fragile(Aggregate):
        topic: ClassVar[str] = "f"

        @applies(CartOpened)
        def _opened(self, event: CartOpened) -> None:
            raise RuntimeError("boom")

    fragile = Fragile("f")
    with pytest.raises(RuntimeError):
        fragile.record_that(CartOpened("x"))
    assert (fragile.version, fragile.pending_events) == (0, ())
    with pytest.raises(StateMutationError):
        fragile.anything = 1  # type: ignore[attr-defined]


def test_two_apply_methods_for_one_event_are_refused() -> None:
    with pytest.raises(ConfigError, match="both _a\\(\\) and _b\\(\\) apply CartOpened"):

        class Twice(Aggregate):
            topic: ClassVar[str] = "t"

            @applies(CartOpened)
            def _a(self, event: CartOpened) -> None: ...

            @applies(CartOpened)
            def _b(self, event: CartOpened) -> None: ...


def test_subclass_inherits_and_overrides_apply_methods() -> None:
    class LoudCart(Cart):
        shouts: int

        def init_state(self) -> None:
            super().init_state()
            self.shouts = 0

        @applies(CartOpened)
        def _opened_loudly(self, event: CartOpened) -> None:
            self.owner = event.owner.upper()
            self.shouts += 1

    cart = LoudCart.open("c", "ada")
    cart.add("A", Decimal(1))
    assert (cart.owner, cart.shouts, cart.items) == ("ADA", 1, [("A", Decimal(1))])
    assert set(LoudCart.event_types()) == {CartOpened, ItemAdded, CartCheckedOut}
    assert list(LoudCart.state_fields()) == ["owner", "items", "checked_out", "shouts"]


def test_state_fields_skip_classvars_and_private_names() -> None:
    assert dict(Cart.state_fields()) == {
        "owner": str | None,
        "items": list[tuple[str, Decimal]],
        "checked_out": bool,
    }


def test_snapshot_capture_and_restore() -> None:
    cart = filled_cart()
    snapshot = cart.take_snapshot()
    assert snapshot == Snapshot(
        aggregate_id="cart-1",
        aggregate_version=3,
        snapshot_version=2,
        state={
            "owner": "ada",
            "items": [("A", Decimal("2.50")), ("B", Decimal("1.25"))],
            "checked_out": False,
        },
    )
    cart.mark_committed()
    cart.add("C", Decimal(1))  # mutates the live list in place: the snapshot must not see it
    assert len(snapshot.state["items"]) == 2

    restored = Cart.from_snapshot(snapshot)
    assert (restored.id, restored.version, restored.pending_events) == ("cart-1", 3, ())
    assert restored.items == [("A", Decimal("2.50")), ("B", Decimal("1.25"))]
    restored.add("C", Decimal(1))
    assert restored.version == 4
    assert len(snapshot.state["items"]) == 2
    with pytest.raises(StateMutationError):
        restored.owner = "x"


def test_rehydrate_from_snapshot_plus_later_events_equals_full_replay() -> None:
    live = filled_cart()
    snapshot = live.take_snapshot()
    live.check_out()
    later = live.pending_events[3:]
    from_snapshot = Cart.rehydrate("cart-1", later, snapshot=snapshot)
    full = Cart.rehydrate("cart-1", live.pending_events)
    assert from_snapshot.take_snapshot() == full.take_snapshot()
    assert from_snapshot.version == 4
    with pytest.raises(ConfigError, match="snapshot of 'cart-1' used to rehydrate 'cart-2'"):
        Cart.rehydrate("cart-2", later, snapshot=snapshot)


def test_stale_snapshot_is_refused() -> None:
    snapshot = Snapshot(aggregate_id="c", aggregate_version=3, snapshot_version=1, state={})
    with pytest.raises(StaleSnapshotError, match="schema version 1, the class has 2"):
        Cart.from_snapshot(snapshot)
    wrong_shape = Snapshot(
        aggregate_id="c", aggregate_version=3, snapshot_version=2, state={"owner": "x"}
    )
    with pytest.raises(ConfigError, match="expected"):
        Cart.from_snapshot(wrong_shape)


def test_snapshot_due() -> None:
    assert [Cart.snapshot_due(0, v) for v in (1, 2, 3, 4)] == [False, False, True, True]
    assert not Cart.snapshot_due(3, 5)
    assert Cart.snapshot_due(5, 6)
    assert not Aggregate.snapshot_due(0, 1000)


def test_class_configuration_is_validated() -> None:
    with pytest.raises(ConfigError, match="snapshot_every"):

        class Bad(Aggregate):
            topic: ClassVar[str] = "b"
            snapshot_every: ClassVar[int | None] = 0

    with pytest.raises(ConfigError, match="aggregate id"):
        Cart("")
    with pytest.raises(ConfigError, match="DomainEvent subclass"):
        applies(int)  # type: ignore[type-var]
