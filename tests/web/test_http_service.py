"""The invoicing HTTP service: a real uvicorn server process (``eventlane invoicing
serve-http``), real worker processes, a real httpx client.

Oracles: the client's own log of acknowledgements (2xx answers) against the raw records of
the log. Every command sends a unique ``X-Request-Id``, stored as its events' correlation
id; the client never repeats a command (an unanswered one is only recorded as unknown),
and every command records one event, so a request id on two events means the *server*
stored a command twice (checked to fail: a server that appended a second event under the
same request id failed the kill test with "stored 2 times").
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from eventlane.codec import HEADER_CORRELATION_ID
from eventlane.log import Log
from eventlane.projection import Runner, open_readmodel
from example_apps.invoicing import app
from example_apps.invoicing.domain import Order, invoice_id_for
from example_apps.invoicing.events import Address, OrderLine

APP = "example_apps.invoicing:app"
ADDRESS = {"street": "1 Main St", "city": "Springfield", "country": "US"}
POSITION = "X-Eventlane-Position"
HOME = Address("1 Main St", "Springfield", "US")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``eventlane invoicing serve-http`` as a child process on a loopback port."""

    def __init__(self, data: Path, log: Path, *, projectors: bool = False) -> None:
        self.data, self.log = data, log
        self.projectors = projectors
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = [sys.executable, "-m", "eventlane.cli", "--data", str(self.data), "invoicing"]
        cmd += ["serve-http", "--port", str(self.port)]
        cmd += ["--projectors" if self.projectors else "--no-projectors"]
        with self.log.open("ab") as sink:
            self.proc = subprocess.Popen(cmd, stdout=sink, stderr=sink)
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, self.log.read_text()[-2000:]
            try:
                if httpx.get(self.url + "/openapi.json", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One data directory, its workers and the server for the module's tests (starting
    five worker processes and a server costs ~10-30 s on a loaded 2-core machine)."""
    tmp_path = tmp_path_factory.mktemp("web")
    data = tmp_path / "data"
    with app.open(data) as rt:
        for name in app.projectors:
            open_readmodel(rt, name, migrate=True).close()
    runners = [Runner(APP, name, data, workers=1, restart=True) for name in app.projectors]
    for r in runners:
        r.start()
    server = Server(data, tmp_path / "server.log")
    try:
        server.start()
        yield server
    finally:
        server.stop()
        for r in runners:
            r.stop()


def raw_by_correlation(log: Log) -> Counter[tuple[str, str]]:
    """``(aggregate_id, correlation id) -> events`` over the command topics' raw records.
    Every command this client sends records exactly one event, so a count of 2 is a
    command stored twice (whether the copies are adjacent or not)."""
    events: Counter[tuple[str, str]] = Counter()
    for topic in ("customers", "orders", "invoices"):
        for p in range(log.partition_count(topic)):
            marks = log.offsets(topic, p)
            offset, cursor = marks.lwm, None
            while offset < marks.hwm:
                records, cursor = log.read(topic, p, offset, cursor=cursor, upto=marks.hwm)
                if not records:
                    break
                for r in records:
                    corr = dict(r.headers).get(HEADER_CORRELATION_ID)
                    if corr:
                        aggregate = orjson.loads(r.value or b"{}")["aggregate_id"]
                        events[(aggregate, corr.decode())] += 1
                offset = records[-1].offset + 1
    return events


class Client:
    """Sends each command once with a fresh request id; records what was acknowledged."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        self.acked: list[tuple[str, str]] = []  # (aggregate id, request id)
        self.unknown: list[tuple[str, str]] = []

    async def command(self, aggregate: str, path: str, body: Any = None) -> httpx.Response:
        rid = uuid.uuid4().hex
        try:
            answer = await self.http.post(path, json=body, headers={"X-Request-Id": rid})
        except httpx.TransportError:
            self.unknown.append((aggregate, rid))
            raise
        if 200 <= answer.status_code < 300:
            self.acked.append((aggregate, rid))
        return answer


async def order_flow(client: Client, n: int) -> None:
    http = client.http
    cust, order = f"cust-{n}", f"order-{n}"
    r = await client.command(
        cust, "/customers", {"customer_id": cust, "name": f"C{n}", "address": ADDRESS}
    )
    assert r.status_code == 201, r.text
    lines = [{"sku": "a", "quantity": 1 + n % 3, "unit_price_cents": 250}]
    body = {"order_id": order, "customer_id": cust, "lines": lines, "address": ADDRESS}
    r = await client.command(order, "/orders", body)
    assert r.status_code == 201, r.text
    placed = r.headers[POSITION]
    got = await http.get(f"/orders/{order}", params={"after": placed})
    assert got.status_code == 200 and got.json()["status"] == "placed", got.text
    r = await client.command(order, f"/orders/{order}/confirm")
    assert r.status_code == 200, r.text
    token = r.headers[POSITION]
    assert r.json()["position"] == token
    got = await http.get(f"/orders/{order}", params={"after": token})
    assert got.status_code == 200 and got.json()["status"] == "confirmed", got.text  # never stale
    invoice = await http.get(f"/orders/{order}/invoice", params={"after": token, "causal": "true"})
    assert invoice.status_code == 200, invoice.text
    amount = (1 + n % 3) * 250
    assert invoice.json()["amount_cents"] == amount
    r = await client.command(
        invoice_id_for(order),
        f"/invoices/{invoice_id_for(order)}/payments",
        {"amount_cents": amount},
    )
    assert r.status_code == 200, r.text
    balance = await http.get(f"/customers/{cust}", params={"after": r.headers[POSITION]})
    assert balance.status_code == 200 and balance.json()["paid_cents"] == amount, balance.text


def test_openapi_and_errors_map_to_status_codes(service: Server) -> None:
    with httpx.Client(base_url=service.url, timeout=30) as http:
        spec = http.get("/openapi.json").json()
        assert {"/orders", "/orders/{order_id}/confirm", "/orders/{order_id}/invoice"} <= set(
            spec["paths"]
        )
        assert http.get("/docs").status_code == 200
        assert http.post("/orders", json={"order_id": "x"}).status_code == 422
        assert http.get("/orders/nope").status_code == 404
        assert http.post("/orders/nope/confirm").status_code == 404
        bad = http.get("/orders/nope", params={"after": "p1~orders~x~1"})
        assert bad.status_code == 422 and "must be numbers" in bad.json()["error"]
        body = {
            "order_id": "o1",
            "customer_id": "c1",
            "lines": [{"sku": "a", "quantity": 1, "unit_price_cents": 5}],
            "address": ADDRESS,
        }
        assert http.post("/orders", json=body).status_code == 201
        again = http.post("/orders", json=body)
        assert again.status_code == 409 and "already placed" in again.json()["error"]
        assert http.post("/orders/o1/confirm").status_code == 200
        assert http.post("/orders/o1/confirm").status_code == 409
        forged = http.get("/orders/o1", params={"after": "p1~orders~0~999999"})
        assert forged.status_code == 422 and "high-water mark" in forged.json()["error"]
        # (a real position no worker reaches, 504: in the SIGTERM test, which has no workers)


@pytest.mark.parametrize(
    "flows", [pytest.param(50, id="50"), pytest.param(200, id="200", marks=pytest.mark.soak)]
)
def test_concurrent_order_flows_read_their_writes_and_are_stored_once(
    service: Server, flows: int
) -> None:
    async def main() -> Client:
        limits = httpx.Limits(max_connections=64, keepalive_expiry=5)
        async with httpx.AsyncClient(base_url=service.url, timeout=120, limits=limits) as http:
            client = Client(http)
            await asyncio.gather(*(order_flow(client, n) for n in range(base, base + flows)))
            return client

    base = 1000 * flows  # the soak run may follow the default one on the same service
    client = asyncio.run(main())
    assert len(client.acked) == flows * 4 and not client.unknown
    with app.open(service.data, create_topics=False) as rt:
        batches = raw_by_correlation(rt.log)
    for key in client.acked:
        assert batches[key] == 1, f"acknowledged command {key} stored {batches[key]} times"


def test_sigterm_stops_the_server_within_its_grace_while_a_request_waits(tmp_path: Path) -> None:
    """SIGTERM while a request waits (a read-your-writes wait that the read model never
    reaches: ``WAIT_S``): the server cancels it after its graceful-shutdown timeout
    (``GRACE_S``) and exits, rather than waiting for every request in flight to end (a
    request that never ends kept a server alive after SIGTERM: docs/performance.md)."""
    from example_apps.invoicing.cli import GRACE_S  # noqa: PLC0415
    from example_apps.invoicing.web import WAIT_S  # noqa: PLC0415

    data = tmp_path / "data"
    with app.open(data) as rt:
        open_readmodel(rt, "orders_by_status", migrate=True).close()
        order = rt.execute(
            Order, "o1", lambda o: o.place("c1", [OrderLine("a", 1, 5)], HOME), create=True
        )
        assert order.stored_position is not None  # on orders: nobody applies it here
        unreached = order.stored_position.token
    server = Server(data, tmp_path / "server.log")
    server.start()
    assert server.proc is not None
    proc = server.proc

    async def main() -> tuple[object, float]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            # a real position no worker reaches: 504 after WAIT_S (a forged one: 422 at once)
            never = await http.get("/orders/o1", params={"after": unreached})
            assert never.status_code == 504 and "has not reached" in never.json()["error"]
            waiting = asyncio.create_task(http.get("/orders/o1", params={"after": unreached}))
            await asyncio.sleep(1.0)  # the request is in flight, waiting
            assert not waiting.done(), waiting.result()
            sent = time.monotonic()
            os.kill(proc.pid, signal.SIGTERM)
            await asyncio.to_thread(proc.wait, 60)
            exited = time.monotonic() - sent
            answer: object
            try:
                answer = (await waiting).status_code
            except httpx.TransportError as exc:
                answer = type(exc).__name__
            return answer, exited

    try:
        answer, exited = asyncio.run(main())
    finally:
        server.stop(signal.SIGKILL)
    assert answer != 504, f"the server waited for the request to end ({exited:.1f} s)"
    assert exited < WAIT_S, f"exited {exited:.1f} s after SIGTERM (grace {GRACE_S} s)"


def test_kill_9_of_the_server_under_load_loses_no_acknowledged_command(service: Server) -> None:
    """Clients keep placing and confirming orders while the server is killed with SIGKILL;
    every acknowledged command is in the log once, an unanswered one at most once."""
    stop = asyncio.Event()

    async def worker(client: Client, w: int) -> None:
        n = 0
        while not stop.is_set():
            order = f"k{w}-{n}"
            body = {
                "order_id": order,
                "customer_id": "c",
                "lines": [{"sku": "a", "quantity": 1, "unit_price_cents": 1}],
                "address": ADDRESS,
            }
            try:
                if (await client.command(order, "/orders", body)).status_code == 201:
                    await client.command(order, f"/orders/{order}/confirm")
            except httpx.TransportError:
                return  # the server is gone: never repeat the command
            n += 1

    async def main() -> Client:
        async with httpx.AsyncClient(base_url=service.url, timeout=30) as http:
            client = Client(http)
            tasks = [asyncio.create_task(worker(client, w)) for w in range(32)]
            await asyncio.sleep(2.0)
            service.stop(signal.SIGKILL)
            stop.set()
            await asyncio.gather(*tasks)
            return client

    client = asyncio.run(main())
    assert service.proc is not None and service.proc.returncode == -signal.SIGKILL
    assert len(client.acked) > 50, "too little load before the kill"
    assert client.unknown, "the kill interrupted no command: it did not happen under load"
    with app.open(service.data, create_topics=False) as rt:
        batches = raw_by_correlation(rt.log)
    for key in client.acked:
        assert batches[key] == 1, f"acknowledged command {key} stored {batches[key]} times"
    for key in client.unknown:
        assert batches[key] <= 1, f"unanswered command {key} stored {batches[key]} times"
    sent = set(client.acked) | set(client.unknown)
    targets = {aggregate for aggregate, _ in sent}
    assert {k for k in batches if k[0] in targets} <= sent  # the policy's invoices aside


def test_serve_http_runs_the_workers_and_hands_a_killed_ones_partitions_over(
    tmp_path: Path,
) -> None:
    """``serve-http`` with its own workers (the default): a worker killed with ``kill -9``
    has its member leave as soon as the server's runner reaps it (within a supervision tick,
    not the 10 s session timeout: checked to fail without the runners holding their groups),
    a replacement takes the partitions, and the service goes on answering read-your-writes
    queries through it."""
    data = tmp_path / "data"
    with app.open(data) as rt:
        for name in app.projectors:
            open_readmodel(rt, name, migrate=True).close()
    server = Server(data, tmp_path / "server.log", projectors=True)
    server.start()
    try:
        with app.open(data) as rt:
            group = rt.group_coordinator("invoices")
            try:

                def owners() -> dict[int, set[Any]]:
                    state = group.current()
                    return {m.pid: set(m.owned) for m in state.members.values()}

                deadline = time.monotonic() + 120
                while not (len(now := owners()) == 1 and all(now.values())):
                    assert time.monotonic() < deadline, (now, server.log.read_text()[-2000:])
                    time.sleep(0.05)
                (victim,) = now
                os.kill(victim, signal.SIGKILL)
                killed = time.monotonic()
                while victim in owners():
                    assert time.monotonic() - killed < 5, "the dead worker's member stayed"
                    time.sleep(0.02)
                while not ((now := owners()) and all(now.values())):  # the replacement's
                    assert time.monotonic() - killed < 60, now
                    time.sleep(0.05)
                assert victim not in now
            finally:
                group.close()

        async def one_order() -> None:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
                await order_flow(Client(http), 1)

        asyncio.run(one_order())  # its invoice read through the replacement worker
    finally:
        server.stop()
    assert server.proc is not None and server.proc.returncode == 0, server.log.read_text()[-2000:]
