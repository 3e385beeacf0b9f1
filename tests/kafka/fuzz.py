"""A protocol fuzzer for the Kafka listener (seeded, bounded in count and time).

Requests are generated from kafka-python's protocol classes (the schemas of Kafka's
messages): for every advertised API and version, fields get plausible values most of the
time and hostile ones (illegal names, internal topics, negative or huge numbers, garbage or
lying record batches) some of the time; then a share of the encoded frames is mutated byte
by byte (flips, truncation, insertion, a planted int32), re-framed with the right size.

The oracle, per request:

* a frame whose payload decodes (kafka-python's decoder, the listener's own) at an
  advertised version is *well-framed*: it must be answered on its connection with its
  correlation id and a response that decodes (acks=0 Produce excepted: never answered, and
  the connection closed if it failed, as Kafka does; the fuzzer then reconnects); JoinGroup,
  SyncGroup and Fetch may wait (Kafka's long polls) and are then abandoned, not failed;
* a frame that does not decode may be answered or have its connection closed, never hang;
* a Produce partition answered with an error stored nothing: the partition's high-water
  mark (read from the log directly) did not move. An acks=0 Produce is never answered, so
  the fuzzer fences it (an ApiVersions request on the same connection, answered only once
  the listener finished the Produce: requests of a connection are served in order) before
  the next request: no unanswered write can land while a later request is being checked.
  Should the mark move anyway, the failure names the requests whose records were stored
  (record values are random, so they identify their request).

Deterministic: every byte comes from the seeded generator, so ``python -m tests.kafka.fuzz
--seed S --count N`` replays the same N requests (the failure lines carry each request's
number) against a fresh listener.
"""

from __future__ import annotations

import argparse
import random
import socket
import struct
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.record.default_records import DefaultRecordBatchBuilder

from eventlane.kafka.protocol import REQUESTS
from eventlane.kafka.records import parse_batches
from eventlane.log import LogStore
from tests.kafka.conftest import KafkaProcess, free_port
from tests.kafka.wire import encode, recv_frame

TOPICS = ["fuzz-a", "fuzz-b"]  # created with 3 partitions by the caller
EVIL_NAMES = [
    "../../x",
    "t" * 300,
    ".hidden",
    "",
    "a/b",
    "__consumer_offsets",
    "__transaction_state",
    "\u00fcml",
    "fuzz-a\x00",
]
WAITING_APIS = {1, 11, 14}  # Fetch, JoinGroup, SyncGroup: may legitimately wait
INT_RANGES = {"int8": 7, "int16": 15, "int32": 31, "int64": 63, "uint16": 16}


@dataclass
class Stats:
    sent: int = 0
    answered: int = 0
    well_framed: int = 0
    closed_on_malformed: int = 0
    abandoned_waits: int = 0
    acks0: int = 0
    produce_rejections: int = 0
    failures: list[str] = field(default_factory=list)
    by_api: Counter[int] = field(default_factory=Counter)
    by_version: Counter[tuple[int, int]] = field(default_factory=Counter)


class Fuzzer:
    def __init__(
        self,
        bootstrap: str,
        data: Path,
        seed: int,
        byte_share: float = 0.35,
        *,
        fence_acks0: bool = True,
    ) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.address = (host, int(port))
        self.rng = random.Random(seed)
        self.byte_share = byte_share
        self.fence_acks0 = fence_acks0
        self.sent_values: dict[bytes, list[int]] = {}
        """Record value -> the numbers of the Produce requests that carried it (recent ones)."""
        self.log = LogStore(data)
        self.sock: socket.socket | None = None
        self.correlation = 0
        self.stats = Stats()
        self.versions = self._advertised()
        self.pairs = [
            (api, v) for api, (lo, hi) in sorted(self.versions.items()) for v in range(lo, hi + 1)
        ]
        """Every advertised (API, version), visited in turn: a run of len(pairs) requests
        covers them all."""

    # -- connection ------------------------------------------------------------------
    def _connect(self) -> socket.socket:
        if self.sock is None:
            self.sock = socket.create_connection(self.address, timeout=10)
        return self.sock

    def _drop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _advertised(self) -> dict[int, tuple[int, int]]:
        sock = self._connect()
        sock.sendall(encode(ApiVersionsRequest(), 0))
        body = recv_frame(sock)
        assert body is not None
        resp = ApiVersionsResponse[0].decode(body, header=True)
        return {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}

    def close(self) -> None:
        self._drop()
        self.log.close()

    # -- generation ------------------------------------------------------------------
    def _int(self, name: str, type_str: str) -> int:
        r = self.rng
        bits = INT_RANGES.get(type_str, 31)
        lo, hi = (
            (0, (1 << bits) - 1) if type_str.startswith("u") else (-(1 << bits), (1 << bits) - 1)
        )
        hostile = r.random() < 0.1
        if hostile:
            value = r.choice([lo, hi, -1, -2, 0, r.randint(lo, hi)])
        elif "partition" in name or name == "index":
            value = r.choice([0, 0, 1, 2, 3])
        elif "offset" in name:
            value = r.choice([0, 1, 5, -1, -2, 100])
        elif name == "timestamp":
            value = r.choice([-1, -2, -3, 0, int(time.time() * 1000)])
        elif name == "max_wait_ms":
            value = r.choice([0, 10, 100])
        elif "timeout" in name:
            value = r.choice([0, 100, 6000, 10000])
        elif name == "acks":
            value = r.choice([-1, 1, 1, 0])
        elif name == "num_partitions":
            value = r.choice([1, 2, -1, 0, 10001])
        elif name == "replication_factor":
            value = r.choice([1, -1, 3])
        elif name == "key_type":
            value = r.choice([0, 0, 1])
        elif name == "resource_type":
            value = r.choice([2, 2, 4, 0])
        elif "generation" in name:
            value = r.choice([-1, 0, 1, 2])
        elif "max_bytes" in name:
            value = r.choice([1 << 20, 1024, 0])
        elif "epoch" in name or name in ("producer_id", "replica_id"):
            value = -1
        else:
            value = r.choice([0, 1, -1])
        return max(lo, min(hi, value))

    def _string(self, name: str, api: int) -> str:
        r = self.rng
        if r.random() < 0.12:
            return r.choice(EVIL_NAMES)
        if api == 20:  # DeleteTopics: only its own topics, never the producers'
            return f"fuzz-del-{r.randint(0, 3)}"
        if api == 19 and name == "name":
            return r.choice([f"fuzz-del-{r.randint(0, 3)}", *TOPICS])
        if "group" in name or name in ("key", "coordinator_keys"):
            return r.choice(["fuzz-g1", "fuzz-g2"])
        if "member" in name or "instance" in name:
            return r.choice(["", "member-1", "raw-" + str(uuid.UUID(int=r.getrandbits(128)))])
        if "protocol_type" in name:
            return "consumer"
        if "protocol" in name:
            return r.choice(["range", "roundrobin"])
        if name in ("name", "topic", "resource_name"):
            return r.choice([*TOPICS, *TOPICS, "fuzz-new"])
        if "state" in name:
            return r.choice(["Stable", "Empty"])
        return r.choice(["", "x", "cleanup.policy", "retention.ms"])

    def _records(self) -> bytes:
        r = self.rng
        codec = r.choice([0, 0, 1, 2, 3, 4])
        pid = -1
        builder = DefaultRecordBatchBuilder(2, codec, False, pid, -1, -1, 1 << 20)
        for i in range(r.randint(1, 5)):
            builder.append(
                i,
                timestamp=None,
                key=r.choice([None, b"k"]),
                value=r.randbytes(r.randint(0, 64)),
                headers=[],
            )
        batch = bytearray(builder.build())
        if r.random() < 0.1:  # a lying batch: corrupt a byte past the header (CRC no longer
            batch[r.randrange(61, len(batch))] ^= 0xFF  # matches) or its count (CRC redone)
        return bytes(batch)

    def _value(self, name: str, f: Any, version: int, api: int) -> Any:
        r = self.rng
        if f.nullable_for_version_q(version) and r.random() < 0.05:
            return None
        if f.is_struct_array():
            return [
                f.data_class(**self._fields(f.fields, version, api))
                for _ in range(r.choice([0, 1, 1, 1, 2, 3]))
            ]
        if f.is_struct():
            return f.data_class(**self._fields(f.fields, version, api))
        t = f.type_str
        if t.startswith("[]"):
            return [self._scalar(name, t[2:], api) for _ in range(r.choice([0, 1, 1, 2]))]
        return self._scalar(name, t, api)

    def _scalar(self, name: str, t: str, api: int) -> Any:
        r = self.rng
        if t in INT_RANGES:
            return self._int(name, t)
        if t == "string":
            return self._string(name, api)
        if t == "bool":
            return r.random() < 0.3
        if t == "records":
            return self._records()
        if t == "bytes":
            return r.randbytes(r.choice([0, 4, 20]))
        if t == "uuid":
            return r.choice([None, uuid.UUID(int=0), uuid.UUID(int=r.getrandbits(128))])
        if t == "float64":
            return r.random()
        raise ValueError(f"field type {t}")

    def _fields(self, fields: dict[str, Any], version: int, api: int) -> dict[str, Any]:
        return {
            n: self._value(n, f, version, api)
            for n, f in fields.items()
            if f.for_version_q(version)
        }

    def request(self) -> tuple[int, int, bytes]:
        """(api key, version, framed bytes) of one generated, perhaps mutated, request."""
        api, version = self.pairs[self.stats.sent % len(self.pairs)]
        while True:
            cls = REQUESTS[api]
            try:
                req = cls(**self._fields(cls._struct.fields, version, api))
                self.correlation += 1
                frame = encode(req, version, self.correlation)
            except Exception:  # a value the codec cannot encode at this version: redraw
                continue
            if self.rng.random() < self.byte_share:
                frame = self._mutate(frame)
            return api, version, frame

    def _mutate(self, frame: bytes) -> bytes:
        r = self.rng
        body = bytearray(frame[4:])
        keep = 8  # api key, version, correlation id: the answer must be matched
        if len(body) <= keep:
            return frame
        op = r.choice(["flip", "flip", "truncate", "insert", "int32"])
        if op == "flip":
            for _ in range(r.randint(1, 4)):
                body[r.randrange(keep, len(body))] ^= 1 << r.randrange(8)
        elif op == "truncate":
            del body[r.randrange(keep, len(body)) :]
        elif op == "insert":
            at = r.randrange(keep, len(body) + 1)
            body[at:at] = r.randbytes(r.randint(1, 8))
        else:
            at = r.randrange(keep, max(keep + 1, len(body) - 3))
            body[at : at + 4] = struct.pack(">i", r.choice([-1, 0, 1 << 30, -(1 << 31), 7]))
        return struct.pack(">i", len(body)) + bytes(body)

    # -- one exchange ----------------------------------------------------------------
    def _hwms(self, decoded: Any) -> dict[tuple[str, int], int]:
        out = {}
        for t in decoded.topic_data or []:
            for p in t.partition_data or []:
                try:
                    out[(t.name, p.index)] = self.log.offsets(t.name, p.index).hwm
                except Exception:
                    continue
        return out

    def step(self) -> None:
        api, version, frame = self.request()
        st = self.stats
        st.sent += 1
        number = st.sent  # the request's number in this seed's sequence (1-based)
        st.by_api[api] += 1
        st.by_version[(api, version)] += 1
        payload = frame[4:]
        try:
            decoded = REQUESTS[api].decode(payload, version=version, header=True)
        except Exception:
            decoded = None
        acks0 = decoded is not None and api == 0 and decoded.acks == 0
        if decoded is not None and api == 0:
            self._remember_values(decoded, number)
        before = self._hwms(decoded) if decoded is not None and api == 0 and not acks0 else {}
        sock = self._connect()
        try:
            sock.sendall(frame)
        except OSError:
            self._drop()
            sock = self._connect()
            sock.sendall(frame)
        if decoded is not None:
            st.well_framed += 1
        if acks0:  # never answered; a failed one closes the connection (Kafka's way)
            st.acks0 += 1
            if self.fence_acks0:
                self._fence(sock, number)
            self._drop()
            return
        sock.settimeout(3 if api in WAITING_APIS else 15)
        try:
            body = recv_frame(sock)
        except TimeoutError:
            self._drop()
            if api in WAITING_APIS:
                st.abandoned_waits += 1
            else:
                st.failures.append(f"#{number} hung: api {api} v{version} {frame[:80]!r}")
            return
        except ConnectionError:
            body = None
        if body is None:
            self._drop()
            if decoded is not None:
                st.failures.append(
                    f"#{number} unanswered well-framed: api {api} v{version} {decoded!r:.300}"
                )
            else:
                st.closed_on_malformed += 1
            return
        st.answered += 1
        (correlation,) = struct.unpack_from(">i", body)
        if correlation != self.correlation:
            st.failures.append(
                f"#{number} correlation {correlation} != {self.correlation} (api {api})"
            )
            self._drop()
            return
        if decoded is None:
            return
        response_cls = type(decoded).__name__.replace("Request", "Response")
        module = __import__(REQUESTS[api].__module__, fromlist=[response_cls])
        try:
            response = getattr(module, response_cls)[version].decode(body, header=True)
        except Exception as exc:
            st.failures.append(f"#{number} undecodable response: api {api} v{version}: {exc}")
            return
        if api == 0:
            self._check_produce(decoded, response, before, number)

    def _fence(self, sock: socket.socket, number: int) -> None:
        """Wait until the listener has served the acks=0 Produce just sent on ``sock``: an
        ApiVersions request behind it is answered only after it (or the connection is
        closed, Kafka's answer to a failed acks=0 Produce, once the Produce is done)."""
        self.correlation += 1
        try:
            sock.sendall(encode(ApiVersionsRequest(), 0, self.correlation))
            sock.settimeout(15)
            body = recv_frame(sock)
        except TimeoutError:
            self.stats.failures.append(f"#{number} hung: acks=0 produce never served")
            return
        except OSError:
            return  # closed by the listener: the failed Produce is over
        if body is not None:
            (correlation,) = struct.unpack_from(">i", body)
            if correlation != self.correlation:
                self.stats.failures.append(f"#{number} fence answered {correlation}")

    def _remember_values(self, decoded: Any, number: int) -> None:
        for t in decoded.topic_data or []:
            for p in t.partition_data or []:
                try:
                    batches = parse_batches(bytes(p.records or b""))
                except Exception:
                    continue
                for batch in batches:
                    for record in batch.records:
                        if record[1]:
                            self.sent_values.setdefault(record[1], []).append(number)
        if len(self.sent_values) > 5000:  # keep the recent ones
            for value in list(self.sent_values)[:1000]:
                del self.sent_values[value]

    def _stored_by(self, tp: tuple[str, int], start: int, end: int) -> str:
        """Which requests the records at ``[start, end)`` of ``tp`` came from (their values)."""
        try:
            records, _ = self.log.read(*tp, start, upto=end)
        except Exception as exc:
            return f"unreadable: {exc}"
        numbers = sorted({n for r in records for n in self.sent_values.get(r.value or b"", [])})
        return f"records from request(s) {numbers or 'unknown'}"

    def _check_produce(self, decoded: Any, response: Any, before: dict, number: int) -> None:
        accepted, rejected = set(), set()
        for t in response.responses:
            for p in t.partition_responses:
                (accepted if p.error_code == 0 else rejected).add((t.name, p.index))
        self.stats.produce_rejections += len(rejected)
        for tp in rejected - accepted:
            if tp in before:
                after = self.log.offsets(*tp).hwm
                if after != before[tp]:
                    self.stats.failures.append(
                        f"#{number} records stored from a rejected produce: {tp}"
                        f" {before[tp]} -> {after} ({self._stored_by(tp, before[tp], after)})"
                    )

    def run(self, count: int, seconds: float) -> Stats:
        deadline = time.monotonic() + seconds
        for _ in range(count):
            if time.monotonic() > deadline:
                break
            self.step()
        return self.stats


def main() -> None:
    """Replay a seed against a fresh listener (``--count``: up to request N; ``--no-fence``:
    the oracle without its acks=0 fence, as before it had one)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=3600)
    parser.add_argument("--no-fence", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        kafka = KafkaProcess(Path(tmp) / "data", free_port())
        kafka.start()
        try:
            log = LogStore(kafka.data)
            for name in TOPICS:
                log.create_topic(name, 3, exist_ok=True)
            log.close()
            fuzzer = Fuzzer(kafka.bootstrap, kafka.data, args.seed, fence_acks0=not args.no_fence)
            start = time.monotonic()
            try:
                stats = fuzzer.run(args.count, args.seconds)
            finally:
                fuzzer.close()
        finally:
            kafka.stop()
    print(
        f"seed {args.seed}: {stats.sent} requests in {time.monotonic() - start:.0f} s,"
        f" {stats.acks0} acks=0, {stats.produce_rejections} produce partitions rejected,"
        f" {len(stats.failures)} failures",
        file=sys.stderr,
    )
    for failure in stats.failures:
        print(failure)
    sys.exit(1 if stats.failures else 0)


if __name__ == "__main__":
    main()
