"""The listener's resource bounds, measured on a real listener process: total in-flight
request memory capped (4 connections each holding a partial 90 MiB frame keep its RSS growth
under the 256 MiB cap, while a normal client keeps working and a large request still
passes), idle and partial-request (slowloris) timeouts, a connection limit; and
DescribeConfigs' defaults and sources."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from framework.log import LogStore
from tests.kafka.conftest import free_port
from tests.kafka.wire import encode, recv_frame

MIB = 1 << 20
CAP = 256 * MIB
LIMITS = {
    "max_request_bytes": 100 * MIB,
    "max_inflight_bytes": CAP,
    "idle_timeout_s": 2.0,
    "request_timeout_s": 6.0,
    "max_connections": 40,
}


class Listener:
    def __init__(self, data: Path, port: int) -> None:
        self.port = port
        self.bootstrap = f"127.0.0.1:{port}"
        self.err = data.parent / f"limits-{port}.log"
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    str(Path(__file__).with_name("serve_limits.py")),
                    str(data),
                    str(port),
                    json.dumps(LIMITS),
                ],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.err.read_text()[-2000:]
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("listener did not start")

    def rss(self) -> int:
        return int(psutil.Process(self.proc.pid).memory_info().rss)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


@pytest.fixture(scope="module")
def listener(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Listener]:
    data = tmp_path_factory.mktemp("limits") / "data"
    LogStore(data).close()
    server = Listener(data, free_port())
    try:
        yield server
    finally:
        server.stop()


def _connect(listener: Listener) -> socket.socket:
    return socket.create_connection(("127.0.0.1", listener.port), timeout=30)


def _api_versions_ok(sock: socket.socket) -> bool:
    sock.sendall(encode(ApiVersionsRequest(), 0))
    body = recv_frame(sock)
    return body is not None and ApiVersionsResponse[0].decode(body, header=True).error_code == 0


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the listener closed ``sock`` (None: still open after ``seconds``)."""
    sock.settimeout(seconds)
    start = time.monotonic()
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return None
    except ConnectionError:
        pass
    return time.monotonic() - start


def test_partial_frames_stay_under_the_memory_cap_and_others_keep_working(listener) -> None:
    baseline = listener.rss()
    frame = 90 * MIB
    socks = [_connect(listener) for _ in range(4)]
    sent = [0] * 4

    def feed(i: int) -> None:  # all but the last KiB of a 90 MiB frame, then hold it
        sock = socks[i]
        chunk = b"\x00" * MIB
        try:
            sock.sendall(struct.pack(">i", frame) + struct.pack(">hhi", 0, 8, 1))
            while sent[i] < frame - 8 - 1024:
                sock.sendall(chunk[: min(MIB, frame - 8 - 1024 - sent[i])])
                sent[i] += MIB
        except OSError:
            pass

    threads = [threading.Thread(target=feed, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    peak = baseline
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        peak = max(peak, listener.rss())
        time.sleep(0.1)
    # meanwhile a normal client works
    producer = KafkaProducer(bootstrap_servers=listener.bootstrap)
    producer.send("normal", value=b"still served").get(10)
    producer.close()
    peak = max(peak, listener.rss())
    for s in socks:
        s.close()
    growth = peak - baseline
    print(
        f"listener RSS {baseline / MIB:.0f} MiB -> peak {peak / MIB:.0f} MiB with 4 x 90 MiB"
        f" partial frames (cap {CAP / MIB:.0f} MiB)"
    )
    assert growth < CAP, growth / MIB
    assert sum(sent) >= 2 * (frame - 8 - 1024) - 4 * MIB  # two frames were taken in whole

    # a large normal request (40 MiB, read in chunks) still passes once they are gone
    log = LogStore(listener_data(listener))
    log.create_topic("large", 1, {"max.record.bytes": 2 * MIB})
    log.close()
    producer = KafkaProducer(
        bootstrap_servers=listener.bootstrap,
        max_request_size=64 * MIB,
        batch_size=48 * MIB,
        linger_ms=500,
    )
    futures = [producer.send("large", value=os.urandom(MIB), partition=0) for _ in range(40)]
    producer.flush(60)
    assert [f.get(1).offset for f in futures] == list(range(40))
    producer.close()


def listener_data(listener: Listener) -> Path:
    return Path(listener.proc.args[2])


def test_idle_and_slowloris_connections_are_closed(listener) -> None:
    idle = _connect(listener)
    closed = _closed_within(idle, 20)
    assert closed is not None and closed < 15, closed  # idle_timeout_s=2, generous slack

    slow = _connect(listener)
    slow.sendall(struct.pack(">i", 1000) + struct.pack(">hhi", 18, 0, 7))
    start = time.monotonic()
    slow.settimeout(1)
    closed_after = None
    while time.monotonic() - start < 40:  # one byte a second, never the whole frame
        try:
            slow.sendall(b"\x00")
            if slow.recv(1) == b"":
                closed_after = time.monotonic() - start
                break
        except TimeoutError:
            continue
        except OSError:
            closed_after = time.monotonic() - start
            break
    slow.close()
    assert closed_after is not None and closed_after < 35, closed_after  # request_timeout_s=6


def test_connections_beyond_the_limit_are_closed(listener) -> None:
    socks = [_connect(listener) for _ in range(LIMITS["max_connections"] + 5)]
    try:
        time.sleep(0.5)
        assert _api_versions_ok(socks[0])
        refused = [s for s in socks[-5:] if _closed_within(s, 5) is not None]
        assert len(refused) == 5
    finally:
        for s in socks:
            s.close()
    time.sleep(0.5)
    again = _connect(listener)
    assert _api_versions_ok(again)  # the slots are freed
    again.close()


def test_describe_configs_reports_defaults_and_sources(kafka) -> None:
    log = LogStore(kafka.data)
    log.create_topic("described", 1, {"retention.ms": 60_000})
    log.close()
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    (future,) = admin.describe_configs([ConfigResource("topic", "described")]).values()
    configs = future.result(20)
    assert configs["retention.ms"].value == "60000"
    assert not configs["retention.ms"].is_default
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["cleanup.policy"].value == "delete"
    assert configs["cleanup.policy"].is_default
    assert configs["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value
    (future,) = admin.describe_configs([ConfigResource("broker", "0")]).values()
    broker = future.result(20)
    assert broker["socket.request.max.bytes"].value == str(100 * MIB)
    assert broker["socket.request.max.bytes"].is_default
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap)
    consumer.assign([TopicPartition("described", 0)])
    consumer.close()
