"""Read-model migrations of the invoicing example app, one set per projector (they live in
the app's own package, so they install with it).

Each set creates its tables; later migrations evolve them (a new column, an index) without
a rebuild. ``eventlane migrate example_apps.invoicing:app`` applies what is pending.

The DDL is portable: the same migrations create the tables in a SQLite file or in a
PostgreSQL schema (``App(readmodels="postgresql://...")``); only ``WITHOUT ROWID`` is
SQLite's own (:func:`_clustered`). Amounts are ``BIGINT`` (64-bit on both engines).
"""

from __future__ import annotations

from typing import Any

from sqlite_utils import Migrations

from eventlane.projection import dialect_of


def _clustered(db: Any) -> str:
    """SQLite keeps a table with a text key in key order without a rowid: say so there."""
    return " WITHOUT ROWID" if dialect_of(db) == "sqlite" else ""


invoices = Migrations("invoicing.invoices")
customer_balances = Migrations("invoicing.customer_balances")
orders_by_status = Migrations("invoicing.orders_by_status")


@invoices()
def m001_create_invoices(db: Any) -> None:
    db.execute(
        """CREATE TABLE IF NOT EXISTS invoices (
            invoice_id TEXT PRIMARY KEY,
            order_id TEXT NOT NULL,
            customer_id TEXT NOT NULL,
            amount_cents BIGINT NOT NULL,
            paid_cents BIGINT NOT NULL DEFAULT 0,
            status TEXT NOT NULL
        )"""
        + _clustered(db)
    )


@invoices()
def m002_index_invoices_by_order(db: Any) -> None:
    db.execute("CREATE UNIQUE INDEX IF NOT EXISTS invoices_order ON invoices (order_id)")


@customer_balances()
def m001_create_customer_balances(db: Any) -> None:
    db.execute(
        """CREATE TABLE IF NOT EXISTS customer_balances (
            customer_id TEXT PRIMARY KEY,
            invoiced_cents BIGINT NOT NULL DEFAULT 0,
            paid_cents BIGINT NOT NULL DEFAULT 0,
            voided_cents BIGINT NOT NULL DEFAULT 0,
            invoices BIGINT NOT NULL DEFAULT 0
        )"""
        + _clustered(db)
    )
    db.execute(
        """CREATE TABLE IF NOT EXISTS invoice_owners (
            invoice_id TEXT PRIMARY KEY,
            customer_id TEXT NOT NULL,
            amount_cents BIGINT NOT NULL
        )"""
        + _clustered(db)
    )


@orders_by_status()
def m001_create_orders(db: Any) -> None:
    db.execute(
        """CREATE TABLE IF NOT EXISTS orders (
            order_id TEXT PRIMARY KEY,
            customer_id TEXT NOT NULL,
            status TEXT NOT NULL,
            total_cents BIGINT NOT NULL,
            lines BIGINT NOT NULL
        )"""
        + _clustered(db)
    )
    db.execute("CREATE INDEX IF NOT EXISTS orders_status ON orders (status)")


@orders_by_status()
def m002_track_order_lines(db: Any) -> None:
    """Keep each open line's total so a removed line's amount can be taken off exactly."""
    db.execute(
        """CREATE TABLE IF NOT EXISTS order_lines (
            order_id TEXT NOT NULL,
            sku TEXT NOT NULL,
            total_cents BIGINT NOT NULL,
            PRIMARY KEY (order_id, sku)
        )"""
        + _clustered(db)
    )
