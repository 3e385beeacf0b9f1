"""Projector names that would share a read model are refused when the app is made
(adversarial review, 2026-11-29): ``order-totals`` and ``order_totals`` map to one
PostgreSQL schema, so they shared its positions and the second read model stayed empty."""

from __future__ import annotations

import pytest

from eventlane.app import App
from eventlane.errors import ConfigError
from tests.projection import bankapp


def test_projector_names_that_would_share_a_schema_are_refused() -> None:
    class Dashed(bankapp.Balances):
        name = "order-totals"

    class Underscored(bankapp.Balances):
        name = "order_totals"

    class Upper(bankapp.Balances):
        name = "Order_Totals"

    for pair in ((Dashed, Underscored), (Underscored, Upper)):
        with pytest.raises(ConfigError, match="would share one PostgreSQL schema"):
            App("bank", aggregates=[bankapp.Account], projectors=list(pair))
    App("bank", aggregates=[bankapp.Account], projectors=[Dashed, bankapp.Balances])
