"""Simulated hosts on one machine: network namespaces joined by a bridge, for partition tests.

Layout (names carry a per-run tag ``<t>``, addresses only inside these namespaces)::

    <t>hub     a bridge br0; one veth end per host (``v1``..``vN``, ``vc``)
    <t>n1..nN  a nats-server each, eth0 = 10.211.0.<i>/24
    <t>c       the clients (writers, readers), eth0 = 10.211.0.100/24
    <t>c2..    more client hosts when asked for (``clients=``), eth0 = 10.211.0.101/24, ...

A host is cut off from every other (servers and clients) by setting its veth end in the hub
down, and healed by setting it up again: packets are dropped, sockets stay open (as when a
cable or a switch port fails). Everything is removed by :meth:`Hosts.remove`, servers by
PID first. Needs root and ``ip`` (iproute2).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from eventlane.log.jetstream.cluster import LocalCluster, Node

SUBNET = "10.211.0"
CLIENT_ADDR = f"{SUBNET}.100"


def unavailable() -> str | None:
    """Why namespaces cannot be made here (``None``: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (not root here)"
    if shutil.which("ip") is None:
        return "network namespaces need `ip` (iproute2), not installed"
    probe = f"elprobe{os.getpid()}"
    made = subprocess.run(
        ["ip", "netns", "add", probe], check=False, capture_output=True, text=True
    )
    if made.returncode != 0:
        return f"`ip netns add` failed here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=False, capture_output=True)
    return None


def require_namespaces(what: str) -> None:
    """Skip the calling test where namespaces cannot be made, except in CI (CI=true), where
    ``what`` must run: there it fails."""
    import pytest  # noqa: PLC0415 - a test helper; the module is also imported by child scripts

    reason = unavailable()
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run {what}: {reason}")
    pytest.skip(reason)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Hosts:
    """``count`` server namespaces and one client namespace on a bridge (see module doc)."""

    def __init__(self, count: int, clients: int = 1) -> None:
        self.tag = f"el{os.getpid() % 100000}"
        self.hub = f"{self.tag}hub"
        self.servers = [f"{self.tag}n{i + 1}" for i in range(count)]
        self.clients = [f"{self.tag}c{j + 1 if j else ''}" for j in range(clients)]
        self.client = self.clients[0]
        self.made: list[str] = []

    def client_addr(self, j: int) -> str:
        return f"{SUBNET}.{100 + j}"

    def addr(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def create(self) -> None:
        self.remove()  # leftovers of a killed run with the same PID tag
        for ns in [self.hub, *self.servers, *self.clients]:
            _ip("netns", "add", ns)
            self.made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        hosts = [(ns, f"v{i + 1}", self.addr(i)) for i, ns in enumerate(self.servers)]
        clients = [
            (ns, f"vc{j + 1 if j else ''}", self.client_addr(j))
            for j, ns in enumerate(self.clients)
        ]
        for ns, end, addr in [*hosts, *clients]:
            _ip(
                "link",
                "add",
                end,
                "netns",
                self.hub,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns,
            )
            _ip("-n", self.hub, "link", "set", end, "master", "br0")
            _ip("-n", self.hub, "link", "set", end, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")

    def cut(self, i: int) -> None:
        """Cut server ``i`` off from every other host (its port on the bridge goes down)."""
        _ip("-n", self.hub, "link", "set", f"v{i + 1}", "down")

    def heal(self, i: int) -> None:
        _ip("-n", self.hub, "link", "set", f"v{i + 1}", "up")

    def cut_client(self, j: int) -> None:
        """Cut client host ``j`` off from every other host."""
        _ip("-n", self.hub, "link", "set", f"vc{j + 1 if j else ''}", "down")

    def heal_client(self, j: int) -> None:
        _ip("-n", self.hub, "link", "set", f"vc{j + 1 if j else ''}", "up")

    def run_in_client(self, j: int = 0) -> list[str]:
        """The command prefix that runs a program in client namespace ``j``."""
        return ["ip", "netns", "exec", self.clients[j]]

    def remove(self) -> None:
        for ns in [*self.clients, *self.servers, self.hub]:
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "del", ns)
        self.made.clear()


class NamespaceCluster(LocalCluster):
    """A :class:`LocalCluster` whose node ``i`` runs in ``hosts.servers[i]`` on its address
    there (fixed ports: each host has its own), checked from the client namespace."""

    hosts: Hosts

    @classmethod
    def on(cls, hosts: Hosts, directory: Path) -> NamespaceCluster:
        nodes = [
            Node(f"n{i + 1}", 4222, 6222, 8222, host=hosts.addr(i))
            for i in range(len(hosts.servers))
        ]
        cluster = cls(directory, nodes)
        cluster.hosts = hosts
        return cluster

    def command(self, node: Node, conf: Path) -> list[str]:
        ns = self.hosts.servers[int(node.name[1:]) - 1]
        return ["ip", "netns", "exec", ns, *super().command(node, conf)]

    def healthy(self, node: Node) -> bool:
        probe = (
            "import sys, urllib.request\n"
            "try:\n"
            f"    r = urllib.request.urlopen('http://{node.host}:{node.http}/healthz', timeout=2)\n"
            "    sys.exit(0 if r.status == 200 else 1)\n"
            "except OSError:\n"
            "    sys.exit(1)\n"
        )
        done = subprocess.run(
            [*self.hosts.run_in_client(), sys.executable, "-c", probe],
            check=False,
            capture_output=True,
        )
        return done.returncode == 0
