"""The invoicing sample as an HTTP service (FastAPI, asyncio): ``eventlane invoicing
serve-http``, OpenAPI at ``/docs`` and ``/openapi.json``.

Commands (``POST``) run on the async runtime (``app.open_async``) and answer with the
write's position token in the ``X-Eventlane-Position`` header (and the body's
``position``); queries (``GET``) read the read models and take that token back as
``?after=TOKEN``: they wait until the read model has applied the write (read-your-writes),
and with ``&causal=true`` until it also reflects what the policies did because of it (the
invoice of a just-confirmed order). A request's ``X-Request-Id`` becomes the correlation id
of the events it writes (the service does not deduplicate: a client must not repeat a
command whose answer it did not get, or must read before repeating it).

Errors -> status codes: a domain rule refusing a command (``DomainError``) 409; a write
conflict that outlived the retries (``ConcurrencyError``) 409 with ``Retry-After``; an
unknown aggregate or row 404; a malformed body or token 422; a wait that timed out 504; the
log unavailable (nothing written) 503 with ``Retry-After``; an outcome unknown (maybe
written) 500 with ``"indeterminate": true``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Header, HTTPException, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from eventlane import DomainError
from eventlane.app.aio import AsyncRuntime
from eventlane.errors import (
    AggregateNotFoundError,
    ConcurrencyError,
    InvalidPositionError,
    LogUnavailableError,
    OutcomeUnknownError,
    RuntimeClosedError,
    WaitTimeoutError,
)
from eventlane.log.position import Position
from example_apps.invoicing.app import app as invoicing
from example_apps.invoicing.domain import Customer, Invoice, Order, invoice_id_for
from example_apps.invoicing.events import Address, OrderLine

POSITION_HEADER = "X-Eventlane-Position"
WAIT_S = 10.0


class AddressIn(BaseModel):
    street: str
    city: str
    country: str


class CustomerIn(BaseModel):
    customer_id: str = Field(min_length=1, max_length=100)
    name: str = Field(min_length=1)
    address: AddressIn


class LineIn(BaseModel):
    sku: str = Field(min_length=1)
    quantity: int = Field(gt=0)
    unit_price_cents: int = Field(ge=0)


class OrderIn(BaseModel):
    order_id: str = Field(min_length=1, max_length=100)
    customer_id: str = Field(min_length=1)
    lines: list[LineIn] = Field(min_length=1)
    address: AddressIn


class PaymentIn(BaseModel):
    amount_cents: int = Field(gt=0)


class Written(BaseModel):
    id: str
    version: int
    position: str


RequestId = Annotated[str | None, Header(alias="X-Request-Id")]
After = Annotated[
    str | None,
    Query(description="a position token: answer once the read model has applied it"),
]
Causal = Annotated[
    bool, Query(description="with after: also wait for what policies did because of it")
]


def _address(a: AddressIn) -> Address:
    return Address(a.street, a.city, a.country)


def _error(status: int, exc: Exception, **extra: Any) -> JSONResponse:
    headers = {"Retry-After": "1"} if extra.pop("retry", False) else None
    return JSONResponse({"error": str(exc), **extra}, status_code=status, headers=headers)


def create_app(data: str | Path | None = None, *, threads: int = 64) -> FastAPI:
    """The service on the log at ``data`` (a data directory or a ``nats://`` URL)."""

    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        async with invoicing.open_async(data, threads=threads) as runtime:
            api.state.runtime = runtime
            yield

    api = FastAPI(title="eventlane invoicing", lifespan=lifespan)

    @api.exception_handler(DomainError)
    async def refused(_: Request, exc: DomainError) -> JSONResponse:
        if isinstance(exc, AggregateNotFoundError):
            return _error(404, exc)
        return _error(409, exc, refused=True)

    @api.exception_handler(ConcurrencyError)
    async def conflict(_: Request, exc: ConcurrencyError) -> JSONResponse:
        return _error(409, exc, retry=True)

    @api.exception_handler(InvalidPositionError)
    async def bad_token(_: Request, exc: InvalidPositionError) -> JSONResponse:
        return _error(422, exc)

    @api.exception_handler(WaitTimeoutError)
    async def too_slow(_: Request, exc: WaitTimeoutError) -> JSONResponse:
        return _error(504, exc)

    @api.exception_handler(LogUnavailableError)
    async def unavailable(_: Request, exc: LogUnavailableError) -> JSONResponse:
        return _error(503, exc, retry=True)

    @api.exception_handler(RuntimeClosedError)
    async def closing(_: Request, exc: RuntimeClosedError) -> JSONResponse:
        return _error(503, exc, retry=True)  # shutting down: not started, nothing written

    @api.exception_handler(OutcomeUnknownError)
    async def unknown(_: Request, exc: OutcomeUnknownError) -> JSONResponse:
        return _error(500, exc, indeterminate=True)

    def rt(request: Request) -> AsyncRuntime:
        runtime: AsyncRuntime = request.app.state.runtime
        return runtime

    async def command(
        request: Request,
        response: Response,
        cls: type[Any],
        aggregate_id: str,
        action: Callable[[Any], None],
        request_id: str | None,
        *,
        create: bool = False,
    ) -> Written:
        aggregate = await rt(request).execute(
            cls, aggregate_id, action, create=create, correlation_id=request_id
        )
        position = aggregate.stored_position
        token = position.token if position is not None else ""
        response.headers[POSITION_HEADER] = token
        return Written(id=aggregate.id, version=aggregate.version, position=token)

    @api.post("/customers", status_code=201)
    async def register_customer(
        body: CustomerIn, request: Request, response: Response, request_id: RequestId = None
    ) -> Written:
        def register(c: Customer) -> None:
            if c.version == 0:
                c.register(body.name, _address(body.address))
            elif c.name != body.name:
                raise DomainError(f"customer {body.customer_id} exists")

        return await command(
            request, response, Customer, body.customer_id, register, request_id, create=True
        )

    @api.post("/orders", status_code=201)
    async def place_order(
        body: OrderIn, request: Request, response: Response, request_id: RequestId = None
    ) -> Written:
        lines = [OrderLine(ln.sku, ln.quantity, ln.unit_price_cents) for ln in body.lines]
        return await command(
            request,
            response,
            Order,
            body.order_id,
            lambda o: o.place(body.customer_id, lines, _address(body.address)),
            request_id,
            create=True,
        )

    @api.post("/orders/{order_id}/confirm")
    async def confirm_order(
        order_id: str, request: Request, response: Response, request_id: RequestId = None
    ) -> Written:
        return await command(request, response, Order, order_id, lambda o: o.confirm(), request_id)

    @api.post("/invoices/{invoice_id}/payments")
    async def pay_invoice(
        invoice_id: str,
        body: PaymentIn,
        request: Request,
        response: Response,
        request_id: RequestId = None,
    ) -> Written:
        return await command(
            request,
            response,
            Invoice,
            invoice_id,
            lambda i: i.record_payment(body.amount_cents),
            request_id,
        )

    async def query(
        request: Request,
        projector: str,
        after: str | None,
        causal: bool,
        sql: str,
        args: tuple[Any, ...],
        what: str,
    ) -> dict[str, Any]:
        runtime = rt(request)
        if after:
            position = Position.parse(after)
            if causal:
                await runtime.wait_causal(projector, position, timeout=WAIT_S)
            elif not await runtime.wait_for(projector, position, timeout=WAIT_S):
                raise WaitTimeoutError(
                    f"read model {projector!r} has not reached {after} within {WAIT_S:g} s"
                )
        path = runtime.sync.readmodel_path(projector)

        def read() -> dict[str, Any] | None:
            if not path.exists():  # no worker has created the read model yet
                return None
            with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
                db.row_factory = sqlite3.Row
                row = db.execute(sql, args).fetchone()
                return None if row is None else dict(row)

        row = await runtime.run(read)
        if row is None:
            raise HTTPException(404, f"{what} not found")
        return row

    @api.get("/orders/{order_id}")
    async def get_order(
        order_id: str, request: Request, after: After = None, causal: Causal = False
    ) -> dict[str, Any]:
        return await query(
            request,
            "orders_by_status",
            after,
            causal,
            "SELECT * FROM orders WHERE order_id = ?",
            (order_id,),
            f"order {order_id}",
        )

    @api.get("/orders/{order_id}/invoice")
    async def get_order_invoice(
        order_id: str, request: Request, after: After = None, causal: Causal = False
    ) -> dict[str, Any]:
        return await query(
            request,
            "invoices",
            after,
            causal,
            "SELECT * FROM invoices WHERE invoice_id = ?",
            (invoice_id_for(order_id),),
            f"invoice of order {order_id}",
        )

    @api.get("/invoices/{invoice_id}")
    async def get_invoice(
        invoice_id: str, request: Request, after: After = None, causal: Causal = False
    ) -> dict[str, Any]:
        return await query(
            request,
            "invoices",
            after,
            causal,
            "SELECT * FROM invoices WHERE invoice_id = ?",
            (invoice_id,),
            f"invoice {invoice_id}",
        )

    @api.get("/customers/{customer_id}")
    async def get_customer(
        customer_id: str, request: Request, after: After = None, causal: Causal = False
    ) -> dict[str, Any]:
        return await query(
            request,
            "customer_balances",
            after,
            causal,
            "SELECT * FROM customer_balances WHERE customer_id = ?",
            (customer_id,),
            f"customer {customer_id}",
        )

    return api
