"""A local Apache Kafka cluster for development and tests: real KRaft brokers (``kafka.Kafka``).

Layout of the cluster directory ``D``::

    D/cluster.json        {"cluster_id", "host", "nodes": [{"node_id", "port",
                           "controller_port", "pid"}, ...]}
    D/b<i>.properties     the broker's ``server.properties``
    D/b<i>.log            its stdout/stderr (log4j's console appender)
    D/data<i>/            its log directory (formatted by the storage tool)

Each node runs the broker and controller roles in one JVM ("combined" mode): three JVMs
rather than six on a small machine, and a 3-voter controller quorum that survives one node's
loss, as the brokers' replication does. Invariants: every node binds ``host`` only (loopback
unless told otherwise); topics default to replication 3 with ``min.insync.replicas=2`` and
unclean leader election off, so a write acknowledged with ``acks=all`` is on at least two
brokers and no out-of-sync replica ever becomes leader; the nodes are stopped by the PIDs
recorded in ``cluster.json`` (never by name). The cluster is ready when a metadata request
lists every broker.

Kafka's jars come from Maven Central (``make kafka-jars``: ``tools/kafka/lib``); the
directory is found from ``lib=``, ``$EVENTLANE_KAFKA_LIB`` or ``./tools/kafka/lib``.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import orjson

from eventlane.errors import ConfigError
from eventlane.log.processes import LOOPBACK, alive, free_ports, stop_pid
from eventlane.observability import get_logger

log = get_logger("eventlane.log")

STATE_FILE = "cluster.json"
KAFKA_VERSION = "4.4.0"
HEAP = "-Xmx384m"
"""Each broker's heap: three brokers fit a small machine beside the tests."""
JVM_OPTIONS = (HEAP, "-Xms128m", "-XX:+UseSerialGC", "-Djava.awt.headless=true")


def kafka_lib(lib: str | Path | None = None) -> Path:
    """The directory holding Kafka's jars, checked (``ConfigError`` naming the fix)."""
    where = Path(lib or os.environ.get("EVENTLANE_KAFKA_LIB") or "tools/kafka/lib")
    if not (where / f"kafka_2.13-{KAFKA_VERSION}.jar").exists():
        raise ConfigError(
            f"Apache Kafka {KAFKA_VERSION}'s jars are not in {where}: run `make kafka-jars`"
            " (or point --lib / $EVENTLANE_KAFKA_LIB at them)"
        )
    return where.resolve()


def java_binary() -> str:
    found = shutil.which("java")
    if found is None:
        raise ConfigError("java (17 or later) is not installed: run `make test-deps`")
    return found


def new_cluster_id() -> str:
    """A KRaft cluster id: a random UUID in URL-safe base64 without padding (22 chars),
    never starting with ``-`` (the storage tool would take it for an option; Kafka's own
    ``Uuid.randomUuid`` draws again for the same reason)."""
    while (cid := base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("="))[0] == "-":
        pass
    return cid


@attrs.define
class KafkaNode:
    node_id: int
    port: int
    controller_port: int
    pid: int = 0


@attrs.define
class LocalKafkaCluster:
    """``LocalKafkaCluster.create(dir, 3).start()``; ``.bootstrap`` for clients."""

    directory: Path
    cluster_id: str
    nodes: list[KafkaNode]
    host: str = LOOPBACK
    lib: Path | None = None
    retention_check_ms: int = 300_000
    """How often the brokers apply retention (Kafka's default; tests whose records carry
    fixed past timestamps set it long, so that retention leaves them alone). The first
    check runs as a broker starts (``log.initial.task.delay.ms=0``), the next one this long
    after: a restarted broker applies retention at once."""

    @classmethod
    def create(
        cls,
        directory: str | Path,
        nodes: int = 3,
        *,
        host: str = LOOPBACK,
        lib: str | Path | None = None,
        retention_check_ms: int = 300_000,
    ) -> LocalKafkaCluster:
        """A new cluster description on fresh ports of ``host`` (nothing started yet)."""
        if not 1 <= nodes <= 9:
            raise ConfigError(f"a local Kafka cluster has 1 to 9 nodes, got {nodes}")
        ports = free_ports(2 * nodes, host)
        members = [KafkaNode(i + 1, ports[2 * i], ports[2 * i + 1]) for i in range(nodes)]
        return cls(
            Path(directory), new_cluster_id(), members, host, kafka_lib(lib), retention_check_ms
        )

    @classmethod
    @contextlib.contextmanager
    def running(
        cls, reuse: str | Path | None, scratch: Path, nodes: int = 3
    ) -> Iterator[LocalKafkaCluster]:
        """The cluster ``eventlane kafka up --dir REUSE`` started (left running), or else a
        new one of ``nodes`` brokers under ``scratch/kafka``, started here and stopped when
        the block ends (benchmarks' ``--cluster DIR``)."""
        if reuse:
            yield cls.load(reuse)
            return
        cluster = cls.create(scratch / "kafka", nodes)
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.stop()

    @classmethod
    def load(cls, directory: str | Path, *, lib: str | Path | None = None) -> LocalKafkaCluster:
        """The cluster described by ``directory/cluster.json`` (written by :meth:`start`)."""
        path = Path(directory) / STATE_FILE
        try:
            body = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            raise ConfigError(f"no Kafka cluster in {directory} ({STATE_FILE} missing)") from None
        nodes = [KafkaNode(**n) for n in body["nodes"]]
        return cls(
            Path(directory),
            body["cluster_id"],
            nodes,
            body["host"],
            kafka_lib(lib),
            body.get("retention_check_ms", 300_000),
        )

    @property
    def bootstrap(self) -> str:
        """``host:port,host:port,...`` (Kafka's ``bootstrap.servers``)."""
        return ",".join(f"{self.host}:{n.port}" for n in self.nodes)

    @property
    def url(self) -> str:
        """The ``--log`` URL of the cluster: ``kafka://127.0.0.1:A,127.0.0.1:B,...``."""
        return "kafka://" + self.bootstrap

    def node(self, node_id: int) -> KafkaNode:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise ConfigError(f"no node {node_id} in the Kafka cluster at {self.directory}")

    def data_dir(self, node: KafkaNode) -> Path:
        return self.directory / f"data{node.node_id}"

    def properties(self, node: KafkaNode) -> str:
        """The node's ``server.properties`` (combined broker and controller)."""
        voters = ",".join(f"{n.node_id}@{self.host}:{n.controller_port}" for n in self.nodes)
        replicas = min(3, len(self.nodes))
        settings = {
            "process.roles": "broker,controller",
            "node.id": node.node_id,
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{self.host}:{node.port},"
            f"CONTROLLER://{self.host}:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{node.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir(node).resolve()),
            "num.partitions": 1,
            "default.replication.factor": replicas,
            "min.insync.replicas": min(2, replicas),
            "unclean.leader.election.enable": "false",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min(2, replicas),
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min(2, replicas),
            "group.initial.rebalance.delay.ms": 0,
            # a development cluster: sessions down to 1 s (Kafka's default least is 6 s)
            "group.min.session.timeout.ms": 1000,
            "num.network.threads": 2,
            "num.io.threads": 2,
            "num.recovery.threads.per.data.dir": 1,
            "background.threads": 2,
            "log.cleaner.threads": 1,
            "log.cleaner.dedupe.buffer.size": 8 * 1024 * 1024,
            "log.retention.check.interval.ms": self.retention_check_ms,
            # the first retention check at start (no records yet), the next one
            # retention_check_ms later: with Kafka's default (30 s after start) a check
            # fell inside the test session and deleted the contract kit's 2023-stamped
            # records mid-test ("offset 0 is outside [5, 30]")
            "log.initial.task.delay.ms": 0,
        }
        return "".join(f"{k}={v}\n" for k, v in settings.items())

    def _java(self, main: str, *args: str, fast: bool) -> list[str]:
        assert self.lib is not None
        opts = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xshare:auto") if fast else ()
        return [java_binary(), *opts, "-cp", f"{self.lib}/*", main, *args]

    def _save(self) -> None:
        body = {
            "cluster_id": self.cluster_id,
            "host": self.host,
            "retention_check_ms": self.retention_check_ms,
            "nodes": [attrs.asdict(n) for n in self.nodes],
        }
        (self.directory / STATE_FILE).write_bytes(orjson.dumps(body, option=orjson.OPT_INDENT_2))

    def format(self) -> None:
        """Write each node's properties and format its storage (once; the tool refuses to
        format a directory twice, and an unformatted one is formatted here)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        procs = []
        for node in self.nodes:
            conf = self.directory / f"b{node.node_id}.properties"
            conf.write_text(self.properties(node))
            if (self.data_dir(node) / "meta.properties").exists():
                continue
            cmd = self._java(
                "kafka.tools.StorageTool",
                "format",
                "-t",
                self.cluster_id,
                "-c",
                str(conf),
                "--ignore-formatted",
                fast=True,
            )
            procs.append(
                (node, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
            )
        for node, proc in procs:
            out, _ = proc.communicate(timeout=180)
            if proc.returncode != 0:
                raise ConfigError(
                    f"formatting Kafka node {node.node_id}'s storage failed:"
                    f" {out.decode(errors='replace')[-2000:]}"
                )
        self._save()

    def start(self, *, timeout: float = 120.0) -> None:
        """Format (if needed) and start every stopped node; wait until all brokers are
        listed by a metadata request. On failure every node started is stopped."""
        try:
            self.format()
            for node in self.nodes:
                if not node.pid:
                    self.start_node(node.node_id, wait=False)
            self.wait_ready(timeout=timeout)
            self.wait_group_coordinator(timeout=timeout)
        except BaseException:
            self.stop()
            raise

    def start_node(self, node_id: int, *, wait: bool = True, timeout: float = 120.0) -> None:
        """(Re)start one node on its existing data directory."""
        node = self.node(node_id)
        conf = self.directory / f"b{node.node_id}.properties"
        conf.write_text(self.properties(node))
        cmd = [java_binary(), *JVM_OPTIONS, "-cp", f"{self.lib}/*", "kafka.Kafka", str(conf)]
        with open(self.directory / f"b{node.node_id}.log", "ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        node.pid = proc.pid
        self._save()
        log.info("kafka node started", node=node.node_id, pid=proc.pid, port=node.port)
        if wait:
            self.wait_ready(timeout=timeout)

    def brokers_listed(self) -> set[int]:
        """The broker ids a metadata request lists now (empty when none answers)."""
        from confluent_kafka.admin import AdminClient  # noqa: PLC0415 - the kafka extra

        alive = [n for n in self.nodes if n.pid]
        if not alive:
            return set()
        servers = ",".join(f"{self.host}:{n.port}" for n in alive)
        probe: dict[str, Any] = {"bootstrap.servers": servers, "logger": _PROBE, "log_level": 0}
        admin = AdminClient(probe)
        try:
            return set(admin.list_topics(timeout=2).brokers)
        except Exception:  # not ready yet, whatever librdkafka says
            return set()

    def wait_ready(self, *, timeout: float = 120.0) -> None:
        """Block until a metadata request lists every node whose PID is recorded."""
        deadline = time.monotonic() + timeout
        want = {n.node_id for n in self.nodes if n.pid}
        while True:
            if want <= self.brokers_listed():
                return
            for node in self.nodes:
                if node.pid and not alive(node.pid):
                    raise ConfigError(
                        f"Kafka node {node.node_id} exited; see"
                        f" {self.directory / f'b{node.node_id}.log'}"
                    )
            if time.monotonic() > deadline:
                raise ConfigError(
                    f"Kafka cluster not ready after {timeout}s; see {self.directory}/b*.log"
                )
            time.sleep(0.25)

    def wait_group_coordinator(self, *, timeout: float = 120.0) -> None:
        """Block until every group coordinator answers: the first FindCoordinator makes the
        brokers create ``__consumer_offsets`` and load its partitions, and until a group's
        partition is loaded by its leader every call for that group fails ("Coordinator load
        in progress", "not coordinator": a client started right after ``kafka up`` died of
        the first, a test's group call of the second while one probe group answered). One
        probe group per partition of ``__consumer_offsets``, asked one after the other."""
        from confluent_kafka.admin import AdminClient  # noqa: PLC0415 - the kafka extra

        probe: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "logger": _PROBE}
        admin = AdminClient(probe)
        deadline = time.monotonic() + timeout
        pending: list[str] = []  # empty: __consumer_offsets is not there yet
        last: object = None
        while time.monotonic() < deadline:
            try:  # one group a call: librdkafka 2.x aborted (an assertion in its
                # coordinator fan-out, rd_kafka_enq_once) on one call naming 50 groups
                group = pending[0] if pending else "__eventlane_probe"
                admin.describe_consumer_groups([group], request_timeout=5)[group].result()
                if pending:
                    pending.pop(0)
                    if not pending:
                        return
                else:  # the first answer created the topic: now one group per partition
                    meta = admin.list_topics(OFFSETS_TOPIC, timeout=5).topics[OFFSETS_TOPIC]
                    pending = probe_groups(len(meta.partitions))
            except Exception as exc:  # load in progress, not available: ask again
                last = exc
                time.sleep(0.25)
        raise ConfigError(
            f"Kafka's group coordinators did not answer within {timeout}s ({last});"
            f" see {self.directory}/b*.log"
        )

    def kill(self, node_id: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to one node (by its PID) and wait for it to exit."""
        node = self.node(node_id)
        if node.pid:
            stop_pid(node.pid, sig, grace=30.0)
            node.pid = 0
            self._save()

    def stop(self) -> None:
        """Stop every node (SIGTERM, SIGKILL after 30 s), by PID; data is kept."""
        for node in self.nodes:
            if node.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.pid, signal.SIGTERM)
        for node in self.nodes:
            if node.pid:
                stop_pid(node.pid, signal.SIGTERM, grace=30.0)
                node.pid = 0
        if self.directory.exists():
            self._save()

    def __enter__(self) -> LocalKafkaCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


OFFSETS_TOPIC = "__consumer_offsets"


def group_partition(group: str, partitions: int) -> int:
    """The partition of ``__consumer_offsets`` (so the coordinator) of ``group``: Kafka's
    ``abs(groupId.hashCode()) % partitions``, Java's string hash over UTF-16 code units."""
    data = group.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    if h >= 1 << 31:
        h -= 1 << 32
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def probe_groups(partitions: int) -> list[str]:
    """One group id for each partition of ``__consumer_offsets`` (``partitions`` of them)."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < partitions:
        name = f"__eventlane_probe_{n}"
        found.setdefault(group_partition(name, partitions), name)
        n += 1
    return [found[p] for p in range(partitions)]


_PROBE = logging.getLogger("eventlane.log.librdkafka")
"""librdkafka's log lines while probing a starting cluster (refused connections)."""
