"""Kafka clients' groups in ``eventlane groups list/describe``: a real listener process, a
kafka-python and a confluent-kafka member, and the real CLI in its own process.

While the listener serves the group, the CLI shows what ``kafka-consumer-groups --describe``
shows (members with client id and host, their partitions, committed offsets and lag) and
refuses to reset its offsets; after a kill -9 of the listener the members disappear within
the publication lease; after a clean stop at once, the committed offsets staying.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka
import kafka
from kafka.structs import OffsetAndMetadata

from eventlane.kafka.groups import PUBLISH_LEASE_MS
from eventlane.log import LogStore
from tests.kafka.conftest import KafkaProcess, free_port

TOPIC, GROUP, PARTITIONS, PER_PARTITION, COMMITTED = "visible", "visible-group", 4, 10, 3


def cli(data: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from eventlane.cli import main; main()",
            "--data",
            str(data),
            *args,
        ],
        capture_output=True,
        text=True,
        check=check,
        timeout=120,
    )


def describe(data: Path) -> dict[str, Any]:
    return json.loads(cli(data, "groups", "describe", GROUP, "--json").stdout)


def wait(
    predicate: Callable[[], bool], timeout: float, what: str, seen: Callable[[], str] = str
) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if predicate():
            return time.monotonic() - t0
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; saw {seen()}")


class Member(threading.Thread):
    """One Kafka client member of GROUP, polling from its own thread (a client is not
    thread-safe): publishes its assignment, commits COMMITTED on what it owns when asked."""

    def __init__(self, kind: str, bootstrap: str) -> None:
        super().__init__(daemon=True)
        self.kind, self.bootstrap = kind, bootstrap
        self.client_id = f"visible-{kind}"
        self.owned: list[int] = []
        self.commit_now = threading.Event()
        self.committed = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.polled = time.monotonic()  # when its last poll returned (a client stuck in it)

    def run(self) -> None:
        try:
            (self._kafka_python if self.kind == "kp" else self._confluent)()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _kafka_python(self) -> None:
        consumer = kafka.KafkaConsumer(
            TOPIC,
            bootstrap_servers=self.bootstrap,
            client_id=self.client_id,
            group_id=GROUP,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=30_000,
            heartbeat_interval_ms=1_000,
        )
        try:
            while not self.stop.is_set():
                consumer.poll(timeout_ms=200)
                self.polled = time.monotonic()
                self.owned = sorted(tp.partition for tp in consumer.assignment())
                if self.commit_now.is_set():
                    consumer.commit(
                        {
                            kafka.TopicPartition(TOPIC, p): OffsetAndMetadata(COMMITTED, "", -1)
                            for p in self.owned
                        }
                    )
                    self.commit_now.clear()
                    self.committed.set()
        finally:
            consumer.close(autocommit=False)

    def _confluent(self) -> None:
        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "client.id": self.client_id,
                "group.id": GROUP,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 30_000,
                "heartbeat.interval.ms": 1_000,
            }
        )
        consumer.subscribe([TOPIC])
        try:
            while not self.stop.is_set():
                consumer.poll(0.2)
                self.polled = time.monotonic()
                self.owned = sorted(tp.partition for tp in consumer.assignment())
                if self.commit_now.is_set():
                    consumer.commit(
                        offsets=[
                            confluent_kafka.TopicPartition(TOPIC, p, COMMITTED) for p in self.owned
                        ],
                        asynchronous=False,
                    )
                    self.commit_now.clear()
                    self.committed.set()
        finally:
            consumer.close()


def balanced(members: list[Member]) -> bool:
    for m in members:
        if m.error is not None:
            raise AssertionError(f"{m.client_id} failed: {m.error!r}")
    owned = [m.owned for m in members]
    return all(len(ps) == PARTITIONS // 2 for ps in owned) and sorted(
        p for ps in owned for p in ps
    ) == list(range(PARTITIONS))


def test_kafka_clients_groups_show_in_groups_list_and_describe(tmp_path: Path) -> None:
    listener = KafkaProcess(tmp_path / "data", free_port())
    listener.start()
    log = LogStore(listener.data)
    members = [Member("kp", listener.bootstrap), Member("rdk", listener.bootstrap)]
    try:
        log.create_topic(TOPIC, PARTITIONS)
        producer = confluent_kafka.Producer({"bootstrap.servers": listener.bootstrap})
        for p in range(PARTITIONS):
            for i in range(PER_PARTITION):
                producer.produce(TOPIC, value=f"{p}-{i}", partition=p)
        assert producer.flush(30) == 0
        del producer

        for m in members:
            m.start()
        wait(lambda: balanced(members), 90, "both members to own 2 partitions each")
        for m in members:
            m.commit_now.set()
        for m in members:
            assert m.committed.wait(60), f"{m.client_id} did not commit"
        owned = {m.client_id: m.owned for m in members}

        def shows_members() -> bool:
            for m in members:
                if m.error is not None:
                    raise AssertionError(f"{m.client_id} failed: {m.error!r}; saw {seen()}")
            doc = describe(listener.data)
            return doc["state"] == "Stable" and len(doc["members"]) == 2

        def seen() -> str:
            doc = describe(listener.data)
            group = {k: doc[k] for k in ("state", "generation")}
            group["members"] = [m["client_id"] for m in doc["members"]]
            now = time.monotonic()
            clients = [
                (m.client_id, m.is_alive(), m.owned, m.error, f"polled {now - m.polled:.1f} s ago")
                for m in members
            ]
            said = [
                line
                for line in listener.stderr.read_text().splitlines()
                if GROUP in line or "[warning" in line or "[error" in line
            ]
            return f"group {group}, clients {clients}, the listener's last warnings {said[-12:]}"

        wait(shows_members, 30, "groups describe to show the two members", seen)
        doc = describe(listener.data)
        by_client = {m["client_id"]: m for m in doc["members"]}
        assert set(by_client) == set(owned)
        for client, partitions in owned.items():
            member = by_client[client]
            assert member["host"] == "/127.0.0.1"
            assert member["member_id"].startswith(client)
            assert member["assignment"] == [{"topic": TOPIC, "partition": p} for p in partitions]
        assert doc["generation"] >= 1
        offsets = {r["partition"]: r for r in doc["offsets"] if r["topic"] == TOPIC}
        assert offsets == {
            p: {
                "topic": TOPIC,
                "partition": p,
                "committed": COMMITTED,
                "hwm": PER_PARTITION,
                "lag": PER_PARTITION - COMMITTED,
            }
            for p in range(PARTITIONS)
        }
        listed = json.loads(cli(listener.data, "groups", "list", "--json").stdout)
        assert {
            "group": GROUP,
            "state": "Stable",
            "generation": doc["generation"],
            "members": 2,
        } in (listed)
        text = cli(listener.data, "groups", "describe", GROUP).stdout
        assert all(client in text for client in owned) and "/127.0.0.1" in text
        refused = cli(
            listener.data,
            "groups",
            "reset-offsets",
            GROUP,
            "--topic",
            TOPIC,
            "--to-earliest",
            "--execute",
            check=False,
        )
        assert refused.returncode != 0 and "live member" in refused.stderr

        # the listener dies without a word: its members must not look alive forever
        listener.kill()
        took = wait(
            lambda: describe(listener.data)["members"] == [],
            PUBLISH_LEASE_MS / 1000 + 30,
            "the killed listener's members to disappear",
        )
        print(f"members gone {took:.1f} s after the listener's kill -9")
        after_kill = describe(listener.data)
        assert after_kill["state"] == "Empty"
        assert [r["committed"] for r in after_kill["offsets"]] == [COMMITTED] * PARTITIONS

        # restarted, the clients rejoin and show again; a clean stop removes them at once
        listener.start()
        took = wait(shows_members, 120, "the members to rejoin the restarted listener", seen)
        print(f"members rejoined {took:.1f} s after the listener's restart")
        listener.stop()
        stopped = describe(listener.data)
        assert stopped["members"] == [] and stopped["state"] == "Empty"
        assert [(r["committed"], r["lag"]) for r in stopped["offsets"]] == [
            (COMMITTED, PER_PARTITION - COMMITTED)
        ] * PARTITIONS
    finally:
        for m in members:
            m.stop.set()
        listener.kill()
        for m in members:
            if m.is_alive():
                m.join(60)
        log.close()
