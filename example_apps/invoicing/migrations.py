"""Read-model migrations of the invoicing example app, one set per projector (they live in
the app's own package, so they install with it).

Each set creates its tables; later migrations evolve them (a new column, an index) without
a rebuild. ``eventlane migrate example_apps.invoicing:app`` applies what is pending.
"""

from __future__ import annotations

from sqlite_utils import Database, Migrations

invoices = Migrations("invoicing.invoices")
customer_balances = Migrations("invoicing.customer_balances")
orders_by_status = Migrations("invoicing.orders_by_status")


@invoices()
def m001_create_invoices(db: Database) -> None:
    db.execute(
        """CREATE TABLE IF NOT EXISTS invoices (
            invoice_id TEXT PRIMARY KEY,
            order_id TEXT NOT NULL,
            customer_id TEXT NOT NULL,
            amount_cents INTEGER NOT NULL,
            paid_cents INTEGER NOT NULL DEFAULT 0,
            status TEXT NOT NULL
        ) WITHOUT ROWID"""
    )


@invoices()
def m002_index_invoices_by_order(db: Database) -> None:
    db.execute("CREATE UNIQUE INDEX IF NOT EXISTS invoices_order ON invoices (order_id)")


@customer_balances()
def m001_create_customer_balances(db: Database) -> None:
    db.execute(
        """CREATE TABLE IF NOT EXISTS customer_balances (
            customer_id TEXT PRIMARY KEY,
            invoiced_cents INTEGER NOT NULL DEFAULT 0,
            paid_cents INTEGER NOT NULL DEFAULT 0,
            voided_cents INTEGER NOT NULL DEFAULT 0,
            invoices INTEGER NOT NULL DEFAULT 0
        ) WITHOUT ROWID"""
    )
    db.execute(
        """CREATE TABLE IF NOT EXISTS invoice_owners (
            invoice_id TEXT PRIMARY KEY,
            customer_id TEXT NOT NULL,
            amount_cents INTEGER NOT NULL
        ) WITHOUT ROWID"""
    )


@orders_by_status()
def m001_create_orders(db: Database) -> None:
    db.execute(
        """CREATE TABLE IF NOT EXISTS orders (
            order_id TEXT PRIMARY KEY,
            customer_id TEXT NOT NULL,
            status TEXT NOT NULL,
            total_cents INTEGER NOT NULL,
            lines INTEGER NOT NULL
        ) WITHOUT ROWID"""
    )
    db.execute("CREATE INDEX IF NOT EXISTS orders_status ON orders (status)")


@orders_by_status()
def m002_track_order_lines(db: Database) -> None:
    """Keep each open line's total so a removed line's amount can be taken off exactly."""
    db.execute(
        """CREATE TABLE IF NOT EXISTS order_lines (
            order_id TEXT NOT NULL,
            sku TEXT NOT NULL,
            total_cents INTEGER NOT NULL,
            PRIMARY KEY (order_id, sku)
        ) WITHOUT ROWID"""
    )
