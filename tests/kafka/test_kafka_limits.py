"""The listener's resource bounds, measured on a real listener process: total in-flight
request memory capped (4 connections each holding a partial 90 MiB frame keep its RSS growth
under the 256 MiB cap; a gzip/zstd/lz4 Produce request of about a MiB that decompresses to
1 GiB is refused with MESSAGE_TOO_LARGE, RSS growing by at most the request bound, while a normal client keeps working and a large request still
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
import zlib
from collections.abc import Iterator
from pathlib import Path

import crc32c
import lz4.frame
import psutil
import pytest
import zstandard
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from eventlane.log import LogStore
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


GIB = 1 << 30
MESSAGE_TOO_LARGE = 10


def _bomb(codec: str) -> tuple[int, bytes]:
    """A compressed records section of 1 GiB of zeros (about a MiB or less), made from 1 MiB
    pieces: Kafka's codec id and the compressed bytes."""
    zero = bytes(MIB)
    if codec == "gzip":  # 1,024 gzip members of a MiB each (a valid stream, made in 10 ms)
        z = zlib.compressobj(9, zlib.DEFLATED, 31)
        return 1, (z.compress(zero) + z.flush()) * (GIB // MIB)
    if codec == "lz4":
        c = lz4.frame.LZ4FrameCompressor()
        body = c.begin() + b"".join(c.compress(zero) for _ in range(GIB // MIB))
        return 3, body + c.flush()
    return 4, zstandard.ZstdCompressor().compress(zero) * (GIB // MIB)  # 1,024 frames


def _batch(codec_id: int, compressed: bytes) -> bytes:
    """A magic-2 record batch claiming one record, its records section ``compressed``."""
    tail = struct.pack(">hiqqqhii", codec_id, 0, 0, 0, -1, -1, -1, 1) + compressed
    crc = crc32c.crc32c(tail)
    return struct.pack(">qiibI", 0, 9 + len(tail), -1, 2, crc) + tail


@pytest.mark.parametrize("codec", ["gzip", "zstd", "lz4"])
def test_a_compressed_produce_that_decompresses_to_a_gibibyte_is_refused_within_the_cap(
    listener, codec: str
) -> None:
    codec_id, compressed = _bomb(codec)
    assert len(compressed) < 8 * MIB
    log = LogStore(listener_data(listener))
    if not log.topic_exists("bomb"):
        log.create_topic("bomb", 1)
    before = log.offsets("bomb", 0).hwm
    log.close()
    baseline = listener.rss()
    peak = [baseline]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], listener.rss())
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    T = ProduceRequest.TopicProduceData
    request = ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout_ms=30_000,
        topic_data=[
            T(
                name="bomb",
                partition_data=[
                    T.PartitionProduceData(index=0, records=_batch(codec_id, compressed))
                ],
            )
        ],
    )
    with _connect(listener) as sock:
        sock.sendall(encode(request, 8))
        body = recv_frame(sock)
        done.set()
        sampler.join(10)
        assert body is not None, "the listener closed the connection instead of answering"
        answer = ProduceResponse[8].decode(body, header=True).responses[0].partition_responses[0]
        growth = peak[0] - baseline
        print(f"{codec} bomb ({len(compressed)} bytes -> 1 GiB): RSS +{growth / MIB:.0f} MiB")
        assert growth < 400 * MIB, growth / MIB
        assert answer.error_code == MESSAGE_TOO_LARGE, answer
        assert _api_versions_ok(sock)  # the connection is still served
    log = LogStore(listener_data(listener))
    try:
        assert log.offsets("bomb", 0).hwm == before  # nothing stored
    finally:
        log.close()
    producer = KafkaProducer(bootstrap_servers=listener.bootstrap, compression_type=codec)
    producer.send("bomb", value=b"a normal compressed record").get(10)
    producer.close()


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
