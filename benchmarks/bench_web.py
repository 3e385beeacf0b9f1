"""HTTP commands per second with 64 concurrent clients: async endpoints vs the same
endpoints sync in FastAPI's thread pool (issue 30).

    python benchmarks/bench_web.py --requests 1000 --runs 5 --clients 64

One uvicorn server process (started by this script, loopback) serves both kinds of
endpoint on one embedded log: ``POST /async/{id}`` (``async def``: ``await
runtime.execute(...)`` on ``app.open_async``) and ``POST /sync/{id}`` (``def``, run by
FastAPI in its thread pool: the sync ``Runtime.execute``). Each request places a new order
(a conditional, durable append). Rounds alternate (sync, async, sync, ...) so a noisy
minute hurts both; each round sends ``--requests`` requests from ``--clients`` concurrent
clients (keep-alive HTTP/1.1 connections, see :class:`Connection`). Prints per kind the
median commands/s, p99 latency and server CPU a command (``/proc``: a figure the machine's
load moves less than wall time) of the rounds, and the ratios async/sync (throughput and
commands per CPU second: above 1 is faster; p99: below 1 is better).

Two bare endpoints (``POST /bare-sync/{id}``, ``POST /bare-async/{id}``: return at once, no
command) alternate with them: their server CPU a request is uvicorn's and FastAPI's own (the
floor), and the last line gives the ratio per CPU second with that floor taken out.
uvicorn uses httptools and uvloop when installed (the sample's ``web`` extra). A request
unanswered for ``ANSWER_S`` stops the run after dumping the server's threads (py-spy, if
installed beside this Python) and its asyncio tasks (``SIGUSR1``) to stderr.

``--jetstream``: the same on a real local 3-node JetStream cluster (started by this script on
loopback, stopped by PID) instead of the embedded log: the async endpoints await the log's
asyncio face on uvicorn's loop, the sync ones cross the sync log's bridge from the pool.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def dump_tasks() -> None:
    """Print every asyncio task of the running loop with its stack to stderr (SIGUSR1 in the
    server: what a request that never finishes awaits)."""
    tasks = asyncio.all_tasks()
    print(f"--- {len(tasks)} asyncio tasks ---", file=sys.stderr)
    for task in tasks:
        print(task, file=sys.stderr)
        task.print_stack(limit=30, file=sys.stderr)
    sys.stderr.flush()


def serve(port: int, data: str) -> None:
    """The server process: both kinds of endpoint on one runtime."""
    from contextlib import asynccontextmanager  # noqa: PLC0415

    import uvicorn  # noqa: PLC0415
    from fastapi import FastAPI  # noqa: PLC0415

    from example_apps.invoicing.app import app  # noqa: PLC0415
    from example_apps.invoicing.domain import Order  # noqa: PLC0415
    from example_apps.invoicing.events import Address, OrderLine  # noqa: PLC0415

    line, home = OrderLine("sku-1", 1, 100), Address("1 Main St", "Oslo", "NO")

    def place(order: Order) -> None:
        order.place("cust-1", [line], home)

    @asynccontextmanager
    async def lifespan(api: FastAPI):  # type: ignore[no-untyped-def]
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump_tasks)
        async with app.open_async(data) as runtime:
            api.state.runtime = runtime
            yield

    api = FastAPI(lifespan=lifespan)

    @api.post("/async/{order_id}")
    async def place_async(order_id: str) -> dict[str, str]:
        order = await api.state.runtime.execute(Order, order_id, place, create=True)
        return {"position": order.stored_position.token}

    @api.post("/sync/{order_id}")
    def place_sync(order_id: str) -> dict[str, str]:
        order = api.state.runtime.sync.execute(Order, order_id, place, create=True)
        return {"position": order.stored_position.token}

    @api.post("/bare-async/{order_id}")
    async def bare_async(order_id: str) -> dict[str, str]:
        return {"position": order_id}

    @api.post("/bare-sync/{order_id}")
    def bare_sync(order_id: str) -> dict[str, str]:
        return {"position": order_id}

    uvicorn.run(
        api,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        timeout_keep_alive=75,
        timeout_graceful_shutdown=5,  # (a request that never ends does not hold the exit)
    )


class Connection:
    """One keep-alive HTTP/1.1 connection of a client, framed by h11 (the protocol library
    under httpx and uvicorn) on asyncio streams: a load generator that costs tens of
    microseconds a request, where httpx's pool costs milliseconds (measured: ~7 ms of the
    client's CPU a request with 64 clients, which capped both kinds of endpoint at ~100
    commands/s on JetStream whatever the server did)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import h11  # noqa: PLC0415

        self.reader, self.writer, self.h11 = reader, writer, h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, port: int) -> Connection:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def post(self, path: str) -> tuple[int, bytes]:
        import h11  # noqa: PLC0415

        conn = self.h11
        headers = [("Host", "127.0.0.1"), ("Content-Length", "0")]
        self.writer.write(
            conn.send(h11.Request(method="POST", target=path, headers=headers))
            + conn.send(h11.EndOfMessage())
        )
        status, body = 0, b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await self.reader.read(1 << 16))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                conn.start_next_cycle()
                return status, body
            elif isinstance(event, h11.ConnectionClosed):
                raise ConnectionError("the server closed the connection")

    def close(self) -> None:
        self.writer.close()


KINDS = ("sync", "async", "bare-sync", "bare-async")
"""The endpoints of a run, alternating in order: the two kinds measured, and the two bare
ones (return at once, no command: uvicorn's and FastAPI's own CPU a request, the floor)."""

ANSWER_S = 60.0
"""A request unanswered this long stops the run, naming it (one hung once: docs/performance.md)."""


def dump_server(pid: int) -> None:
    """A request went unanswered: the server's threads (py-spy, when installed) and its
    asyncio tasks (SIGUSR1, :func:`dump_tasks`) to stderr."""
    print(f"no answer: dumping server {pid}", file=sys.stderr)
    spy = Path(sys.executable).with_name("py-spy")
    if spy.exists():
        subprocess.run([str(spy), "dump", "--pid", str(pid)], timeout=60, check=False)
    os.kill(pid, signal.SIGUSR1)
    time.sleep(2)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def round_(
    url: str,
    kind: str,
    requests: int,
    clients: int,
    tag: str,
    *,
    use_httpx: bool = False,
    server_cpu: Callable[[], float] = lambda: 0.0,
    on_hang: Callable[[], None] = lambda: None,
) -> tuple[float, float, float]:
    """Commands/s, p99 latency (s) and the server's CPU seconds per command of one round."""
    latencies: list[float] = []
    todo = iter(range(requests))
    if use_httpx:
        import httpx  # noqa: PLC0415

        limits = httpx.Limits(max_connections=clients, keepalive_expiry=30)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:

            async def post(path: str) -> tuple[int, bytes]:
                answer = await http.post(path)
                return answer.status_code, answer.content

            await post(f"/{kind}/{tag}-{kind}-warm")
            posts = [post] * clients
            cpu = server_cpu()
            elapsed = await _clients(posts, kind, tag, todo, latencies, on_hang)
            cpu = server_cpu() - cpu
    else:
        port = int(url.rpartition(":")[2])
        conns = [await Connection.open(port) for _ in range(clients)]
        try:
            for conn in conns:  # connected and warm before the clock starts
                status, body = await conn.post(f"/{kind}/{tag}-{kind}-warm-{id(conn)}")
                assert status == 200, body
            cpu = server_cpu()
            elapsed = await _clients([c.post for c in conns], kind, tag, todo, latencies, on_hang)
            cpu = server_cpu() - cpu
        finally:
            for conn in conns:
                conn.close()
    latencies.sort()
    return requests / elapsed, latencies[int(0.99 * (len(latencies) - 1))], cpu / requests


async def _clients(
    posts: list[Callable[[str], Awaitable[tuple[int, bytes]]]],
    kind: str,
    tag: str,
    todo: Iterator[int],
    latencies: list[float],
    on_hang: Callable[[], None],
) -> float:
    """Run one client per ``posts`` until ``todo`` is empty; the seconds it took."""

    async def client(post: Callable[[str], Awaitable[tuple[int, bytes]]]) -> None:
        for i in todo:
            t0 = time.perf_counter()
            path = f"/{kind}/{tag}-{kind}-{i}"
            try:
                async with asyncio.timeout(ANSWER_S):
                    status, body = await post(path)
            except TimeoutError:
                on_hang()
                raise SystemExit(f"no answer to POST {path} in {ANSWER_S:.0f} s") from None
            latencies.append(time.perf_counter() - t0)
            assert status == 200, body

    t0 = time.perf_counter()
    await asyncio.gather(*(client(post) for post in posts))
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument(
        "--jetstream", action="store_true", help="on a local 3-node JetStream cluster"
    )
    parser.add_argument(
        "--httpx",
        action="store_true",
        help="clients on httpx (as before: its CPU bounds the figure) instead of h11",
    )
    parser.add_argument("--serve", nargs=2, metavar=("PORT", "DATA"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(int(args.serve[0]), args.serve[1])
        return
    import httpx  # noqa: PLC0415

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        data, cluster = str(Path(tmp) / "data"), None
        if args.jetstream:
            from eventlane.log.jetstream.cluster import LocalCluster  # noqa: PLC0415

            cluster = LocalCluster.create(Path(tmp) / "nats", nodes=3)
            cluster.start()
            data = cluster.url
        cmd = [sys.executable, __file__, "--serve", str(port), data]
        server = subprocess.Popen(cmd)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(url + "/openapi.json", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
                if time.monotonic() > deadline:
                    raise SystemExit("the server did not start")
            figures: dict[str, list[tuple[float, float, float]]] = {k: [] for k in KINDS}
            for r in range(args.runs):
                for kind in KINDS if r % 2 == 0 else KINDS[::-1]:
                    figures[kind].append(
                        asyncio.run(
                            round_(
                                url,
                                kind,
                                args.requests,
                                args.clients,
                                f"r{r}",
                                use_httpx=args.httpx,
                                server_cpu=lambda: cpu_seconds(server.pid),
                                on_hang=lambda: dump_server(server.pid),
                            )
                        )
                    )
        finally:
            os.kill(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:  # a request in flight holds uvicorn's shutdown
                server.kill()
                server.wait()
            if cluster is not None:
                cluster.stop()
    med = {
        kind: (
            statistics.median(f[0] for f in rounds),
            statistics.median(f[1] for f in rounds),
            statistics.median(f[2] for f in rounds),
        )
        for kind, rounds in figures.items()
    }
    for kind, rounds in figures.items():
        rates = ", ".join(f"{f[0]:,.0f}" for f in rounds)
        print(
            f"{kind:>5} endpoints: {med[kind][0]:,.0f} commands/s, p99 {med[kind][1] * 1000:.1f} ms,"
            f" server CPU {med[kind][2] * 1000:.2f} ms a command"
            f" (median of {args.runs} rounds of {args.requests}, {args.clients} clients: {rates})"
        )
    print(
        f"ratio async/sync: throughput {med['async'][0] / med['sync'][0]:.2f}x,"
        f" p99 {med['async'][1] / med['sync'][1]:.2f}x,"
        f" commands per server CPU second {med['sync'][2] / med['async'][2]:.2f}x"
    )
    floor = {kind: med[f"bare-{kind}"][2] for kind in ("sync", "async")}
    print(
        f"HTTP floor (bare endpoints, server CPU a request): sync {floor['sync'] * 1000:.2f} ms,"
        f" async {floor['async'] * 1000:.2f} ms; the command path's own CPU, sync / async:"
        f" {(med['sync'][2] - floor['sync']) * 1000:.2f} / {(med['async'][2] - floor['async']) * 1000:.2f} ms,"
        f" ratio per CPU second with the floor out"
        f" {(med['sync'][2] - floor['sync']) / max(med['async'][2] - floor['async'], 1e-9):.2f}x"
    )


if __name__ == "__main__":
    main()
