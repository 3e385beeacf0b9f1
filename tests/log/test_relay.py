"""The relay (eventlane/log/embedded/relay.py): once three processes make conditional appends
on one data directory, one relay process writes them all.

Real processes on a real data directory, checked against a model of the conditional
append's rule: every record carries the expectation it was appended under (a header), so
the oracle replays the rule over the whole partition in log order (each stored record's
expectation is its key's previous record); every acknowledged append is stored once at the
offsets it was told; nothing refused is stored; an append of unknown outcome is stored at
most once. The relay is also killed (``kill -9``) and stopped (SIGSTOP) under load: its
clients append directly with the same expectation, so the same rule must hold.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from eventlane.errors import ConcurrencyError, PartitionReadOnlyError
from eventlane.log import LogStore
from eventlane.log.embedded import relay
from eventlane.log.embedded.relay_server import IDLE_S
from eventlane.log.types import AppendResult

TOPIC = "relayed"
ROOT = Path(__file__).resolve().parents[2]

_CHILD = textwrap.dedent(
    """
    import json, os, random, sys, time
    from eventlane.errors import ConcurrencyError, OutcomeUnknownError
    from eventlane.log import LogStore
    from eventlane.log.types import Expect
    from eventlane.observability import configure_logging

    configure_logging("error")
    data, tag, count, seconds, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(
        sys.argv[4]), int(sys.argv[5])
    rng = random.Random(seed)
    keys = [b"k%d" % i for i in range(6)]
    known = {}
    with LogStore(data) as log:
        warm = b"warm-" + tag.encode()  # registers this writer before the start
        record = (warm, tag.encode() + b":warm", (("exp", b"-"),), None)
        log.append("relayed", 0, [record], expect=Expect(warm, None), atomic=True)
        print(json.dumps({"ready": os.getpid()}), flush=True)
        while not os.path.exists(os.path.join(data, "go")):
            time.sleep(0.005)
        deadline = time.monotonic() + seconds
        i = 0
        while i < count or time.monotonic() < deadline:
            if i >= count and seconds == 0:
                break
            key = rng.choice(keys)
            if rng.random() < 0.75:
                exp = log.key_head("relayed", 0, key)  # fresh (another may still win)
            else:
                exp = rng.choice([None, known.get(key), rng.randrange(0, 50)])
            value = b"%s:%d" % (tag.encode(), i)
            record = (key, value, (("exp", b"-" if exp is None else b"%d" % exp),), None)
            try:
                result = log.append("relayed", 0, [record], expect=Expect(key, exp), atomic=True)
            except ConcurrencyError as exc:
                line = {"i": i, "refused": True, "key": key.decode(), "exp": exp,
                        "expected": exc.expected, "actual": exc.actual, "topic": exc.topic}
            except OutcomeUnknownError:
                line = {"i": i, "unknown": True}
            else:
                known[key] = result.base_offset
                line = {"i": i, "offset": result.base_offset}
            print(json.dumps(line), flush=True)
            i += 1
        relay = log.relay
        print(json.dumps({"relayed": relay.relayed if relay is not None else 0,
                          "looked": relay.looked if relay is not None else 0,
                          "seconds": time.monotonic() - deadline + seconds}), flush=True)
    """
)


def _start(data: Path, tag: str, count: int, seconds: float, seed: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(data), tag, str(count), str(seconds), str(seed)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _run(data: Path, procs: list[subprocess.Popen[str]], during: object = None) -> dict[str, list]:
    """Start the writers together, run ``during`` meanwhile, and collect their outcome lines
    (read as they come: a writer blocked on a full pipe would append nothing)."""
    for proc in procs:
        assert proc.stdout is not None
        assert "ready" in json.loads(proc.stdout.readline())
    if len(procs) >= relay.WRITERS_MIN:  # the third writer started it: let it come up
        deadline = time.monotonic() + 30
        while not (data / relay.SOCKET_NAME).exists():
            assert time.monotonic() < deadline, "no relay started for three writers"
            time.sleep(0.01)
    outputs: list[list[str]] = [[] for _ in procs]
    readers = [
        threading.Thread(target=lambda p=proc, out=out: out.extend(p.stdout or ()))
        for proc, out in zip(procs, outputs, strict=True)
    ]
    for reader in readers:
        reader.start()
    (data / "go").touch()
    if callable(during):
        during()
    lines: dict[str, list] = {}
    for n, (proc, reader) in enumerate(zip(procs, readers, strict=True)):
        assert proc.wait(timeout=180) == 0, f"writer {n} exited with {proc.returncode}"
        reader.join(timeout=30)
        lines[f"w{n}"] = [json.loads(line) for line in outputs[n]]
    return lines


def _check(data: Path, lines: dict[str, list]) -> dict[str, int]:
    """The oracle: the conditional rule replayed over the partition, and every writer's
    outcomes against what it holds. Returns counts of each kind of outcome."""
    stored: dict[bytes, int] = {}
    last: dict[bytes, int] = {}
    of_key: dict[str, set[int]] = {}
    with LogStore(data) as log:
        offset, end = 0, log.offsets(TOPIC, 0).hwm
        while offset < end:
            records, _ = log.read(TOPIC, 0, offset)
            for r in records:
                assert r.offset == offset, f"offset {offset} missing"
                exp = dict(r.headers)["exp"]
                wanted = None if exp == b"-" else int(exp)
                assert wanted == last.get(r.key), (
                    f"offset {r.offset}: {r.value!r} stored under expectation {wanted},"
                    f" but key {r.key!r}'s previous record was at {last.get(r.key)}"
                )
                assert r.value not in stored, f"{r.value!r} stored twice"
                stored[r.value] = r.offset
                last[r.key] = r.offset
                of_key.setdefault(r.key.decode(), set()).add(r.offset)
                offset += 1
    counts = {"ok": 0, "refused": 0, "unknown": 0, "relayed": 0}
    for tag, outcomes in lines.items():
        counts["relayed"] += outcomes[-1]["relayed"]
        for line in outcomes[:-1]:
            value = b"%s:%d" % (tag.encode(), line["i"])
            if "offset" in line:
                counts["ok"] += 1
                assert stored.get(value) == line["offset"], f"{value!r} acknowledged, not there"
            elif "refused" in line:
                counts["refused"] += 1
                assert value not in stored, f"{value!r} refused, yet stored"
                # refused by the rule: the key's last record (one of its records, or none)
                # was not the one expected
                assert line["topic"] == TOPIC and line["expected"] == line["exp"], line
                assert line["actual"] != line["exp"], f"{value!r} refused as expected: {line}"
                assert line["actual"] is None or line["actual"] in of_key[line["key"]], line
            else:
                counts["unknown"] += 1
    return counts


@pytest.fixture
def data(tmp_path: Path) -> Path:
    with LogStore(tmp_path / "data") as log:
        log.create_topic(TOPIC, partitions=1)
    return tmp_path / "data"


def _relay_pid(data: Path, timeout: float = 10.0) -> int:
    """The pid of the relay serving ``data`` (it logs ``relay <pid> serving``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log_file = data / relay.LOG_NAME
        if log_file.exists():
            serving = [ln for ln in log_file.read_text().splitlines() if " serving " in ln]
            for line in reversed(serving):
                pid = int(line.split(" relay ")[1].split()[0])
                if Path(f"/proc/{pid}").exists():
                    return pid
        time.sleep(0.02)
    raise AssertionError(f"no relay process serves the data directory; {_relay_log(data)}")


def _relay_log(data: Path) -> str:
    """What the relay reported (its last lines), for a failure's message."""
    log_file = data / relay.LOG_NAME
    if not log_file.exists():
        return "no relay.log"
    return "relay.log ends: " + " | ".join(log_file.read_text().splitlines()[-8:])


def test_conditional_appends_of_four_processes_through_the_relay_follow_the_rule(
    data: Path,
) -> None:
    procs = [_start(data, f"w{n}", 150, 0, seed=n) for n in range(4)]
    counts = _check(data, _run(data, procs))
    assert counts["ok"] > 50 and counts["refused"] > 20, counts
    assert counts["unknown"] == 0, counts  # the relay lived: every outcome known
    assert counts["relayed"] >= 300, f"the relay wrote only {counts['relayed']} of 600"


def test_two_processes_append_directly(data: Path) -> None:
    """Two writers take the lock in turn (faster than a relay for two): no relay starts, and
    neither looks for one more often than every ``LOOK_S`` (finding the other at the lock
    says nothing new while it counted fewer than three writers: a connection attempt per
    append cost each append ~10 us)."""
    procs = [_start(data, f"w{n}", 200, 0, seed=10 + n) for n in range(2)]
    lines = _run(data, procs)
    counts = _check(data, lines)
    assert counts["relayed"] == 0 and counts["unknown"] == 0, counts
    assert not (data / relay.LOG_NAME).exists()
    for out in lines.values():
        looks, seconds = out[-1]["looked"], out[-1]["seconds"]
        assert looks <= seconds / relay.LOOK_S + 3, f"{looks} looks in {seconds:.2f} s"


@pytest.mark.parametrize(
    ("writers", "kills", "seconds"),
    [(4, 2, 16.0), pytest.param(8, 20, 90.0, marks=pytest.mark.soak, id="soak")],
)
def test_relay_killed_and_stopped_under_load_leaves_the_rule_intact(
    data: Path, writers: int, kills: int, seconds: float
) -> None:
    """kill -9 of the relay (``kills`` times) and a SIGSTOP longer than a client waits: its
    clients append directly with the same expectation (unknown when refused), and a new
    relay starts; the oracle holds over everything."""
    procs = [_start(data, f"w{n}", 0, seconds, seed=20 + n) for n in range(writers)]
    faults: list[str] = []
    between = (seconds - relay.ANSWER_S - 5) / (kills + 1)

    def during() -> None:
        for _ in range(kills):
            time.sleep(between)
            pid = _relay_pid(data)
            os.kill(pid, signal.SIGKILL)
            faults.append(f"killed {pid}")
        time.sleep(between)
        pid = _relay_pid(data)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(relay.ANSWER_S + 1.5)
        os.kill(pid, signal.SIGCONT)
        faults.append(f"stopped {pid}")

    counts = _check(data, _run(data, procs, during))
    print(f"relay faults {faults}: outcomes {counts}", file=sys.stderr)
    assert len(faults) == kills + 1, faults
    assert counts["relayed"] > 100, counts  # served before, between and after the kills
    assert counts["ok"] > 200, counts


def test_an_append_the_relay_wrote_and_never_answered_is_unknown_not_refused(
    data: Path,
) -> None:
    """The relay stops itself right after writing and publishing a batch (its fourth: the
    writers' first appends come before), before the fsync and the answer, holding the
    append lock. Its clients give up waiting and
    append directly with the same expectation once it is killed: the relay's record (in
    flight) refuses theirs, and they must report the outcome as unknown, never refused:
    that record is stored (the next appender's fsync makes it durable)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EVENTLANE_PAUSES": "stop:append.hooks#4"}
    server = subprocess.Popen(
        [sys.executable, "-m", "eventlane.log.embedded.relay_server", str(data)], env=env
    )
    try:
        deadline = time.monotonic() + 20
        while not (data / relay.SOCKET_NAME).exists():
            assert time.monotonic() < deadline and server.poll() is None, "no relay"
            time.sleep(0.01)
        procs = [_start(data, f"w{n}", 12, 0, seed=50 + n) for n in range(3)]

        def during() -> None:
            while _state(server.pid) != "T":
                assert time.monotonic() < deadline, "the relay never stopped"
                time.sleep(0.01)
            time.sleep(relay.ANSWER_S + 2)  # its clients gave up waiting meanwhile
            server.kill()

        counts = _check(data, _run(data, procs, during))
    finally:
        server.kill()
        server.wait()
    assert counts["unknown"] >= 1, counts
    assert counts["ok"] >= 12, counts  # the rest were written directly (or by a new relay)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]
    except FileNotFoundError:
        return "gone"


def test_relay_exits_when_fewer_than_three_use_it_and_when_its_directory_goes(
    data: Path, tmp_path: Path
) -> None:
    procs = [_start(data, f"w{n}", 40, 0, seed=30 + n) for n in range(3)]
    _run(data, procs)
    pid = _relay_pid(data)
    deadline = time.monotonic() + IDLE_S + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), f"the relay outlived its clients ({_state(pid)}); {_relay_log(data)}"
    assert not (data / relay.SOCKET_NAME).exists()

    # a relay whose data directory is deleted exits too (tests delete theirs)
    procs = [_start(data, f"x{n}", 0, 2.0, seed=40 + n) for n in range(3)]
    lines = _run(data, procs)
    ends = [out[-1] for out in lines.values()]
    assert sum(end["relayed"] for end in ends) > 0, f"{ends}; {_relay_log(data)}"
    pid = _relay_pid(data)
    moved = tmp_path / "gone"
    data.rename(moved)
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), f"the relay outlived its data directory ({_state(pid)})"


def _alive(pid: int) -> bool:
    return _state(pid) not in {"Z", "gone"}


def test_the_wire_carries_errors_with_their_fields() -> None:
    error = ConcurrencyError(
        "k changed", expected=3, actual=7, unit="last offset", topic="t", partition=2
    )
    back = relay.outcome(relay.answer(error))
    assert isinstance(back, ConcurrencyError)
    assert (back.expected, back.actual, back.topic, back.partition) == (3, 7, "t", 2)
    assert str(back) == str(error) and back.retriable
    gone = relay.outcome(relay.answer(PartitionReadOnlyError("fsync failed", topic="t")))
    assert isinstance(gone, PartitionReadOnlyError) and gone.topic == "t"
    assert relay.outcome(relay.answer(AppendResult(4, 5, [1, 2]))) == AppendResult(4, 5, [1, 2])
    odd = relay.outcome(relay.answer(KeyError("x")))
    assert odd.__class__.__name__ == "OutcomeUnknownError"


_STORES = textwrap.dedent(
    """
    import os, sys
    from eventlane.log import LogStore
    from eventlane.log.types import Expect

    def append(log, value):
        head = log.key_head("relayed", 0, b"k")
        log.append("relayed", 0, [(b"k", value, (), None)], expect=Expect(b"k", head), atomic=True)

    a, b = LogStore(sys.argv[1]), LogStore(sys.argv[1])
    for n, log in enumerate((a, b, a)):
        append(log, b"%d" % n)
    pid = os.fork()
    if pid == 0:  # the child inherits a's relay: it must register on its own
        append(a, b"child")
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    a.close()
    b.close()
    """
)


def test_several_stores_of_one_process_and_a_forked_child_append(data: Path) -> None:
    """Each store registers as a writer (the second store of a process once waited forever
    for the first one's registration lock)."""
    done = subprocess.run(
        [sys.executable, "-c", _STORES, str(data)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    with LogStore(data) as log:
        records, _ = log.read(TOPIC, 0, 0)
    assert [r.value for r in records] == [b"0", b"1", b"2", b"child"]


def test_a_data_directory_past_the_socket_path_limit_is_served(tmp_path: Path) -> None:
    """A Unix socket's path holds at most 107 bytes: a deeper data directory is reached
    through a descriptor of it (``/proc/self/fd/N/relay.sock``), on both sides."""
    data = tmp_path / ("x" * 120) / "data"
    data.parent.mkdir()
    with LogStore(data) as log:
        log.create_topic(TOPIC, partitions=1)
    assert len(str(data / relay.SOCKET_NAME).encode()) > 107
    procs = [_start(data, f"w{n}", 60, 0, seed=60 + n) for n in range(3)]
    counts = _check(data, _run(data, procs))
    assert counts["relayed"] >= 60 and counts["unknown"] == 0, counts


def test_frames_larger_than_a_read_and_several_in_one_read_are_each_answered(
    data: Path,
) -> None:
    """The relay reads into one buffer of ``_READ_BYTES``: a request longer than that is
    put together over several reads, and requests that arrive in one read are each
    answered, in order (a peer speaking the wire itself, as a client does)."""
    from eventlane.errors import RecordTooLargeError  # noqa: PLC0415
    from eventlane.log.embedded.relay_server import _READ_BYTES  # noqa: PLC0415
    from eventlane.log.types import Expect  # noqa: PLC0415

    server = subprocess.Popen(
        [sys.executable, "-m", "eventlane.log.embedded.relay_server", str(data)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not (data / relay.SOCKET_NAME).exists():
            assert time.monotonic() < deadline and server.poll() is None, "the relay never served"
            time.sleep(0.02)
        import socket  # noqa: PLC0415

        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(30)
        conn.connect(str(data / relay.SOCKET_NAME))

        def ask(*frames: bytes) -> list[object]:
            conn.sendall(b"".join(frames))
            answers = []
            for _ in frames:
                (size,) = relay.LEN.unpack(relay.recv_exactly(conn, relay.LEN.size))
                body = relay.recv_exactly(conn, size)
                answers.append(relay.outcome(relay.marshal.loads(body)[0]))
            return answers

        half = _READ_BYTES // 2 + 1  # three records: more than one read, more than a batch
        big = [(b"big", bytes([n]) * half, (), None) for n in range(3)]
        frame = relay.request(TOPIC, 0, [(big, Expect(b"big", None))])
        assert len(frame) > _READ_BYTES + relay.LEN.size
        (too_large,) = ask(frame)
        assert isinstance(too_large, RecordTooLargeError), too_large
        small = [
            relay.request(TOPIC, 0, [([(b"k", b"%d" % n, (), None)], Expect(b"k", last))])
            for n, last in enumerate([None, 0, 0])  # the third's expectation is stale
        ]
        first, second, stale = ask(*small)
        assert isinstance(first, AppendResult) and first.base_offset == 0
        assert isinstance(second, AppendResult) and second.base_offset == 1
        assert isinstance(stale, ConcurrencyError) and stale.actual == 1
        conn.close()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    with LogStore(data) as log:
        records, _ = log.read(TOPIC, 0, 0)
    assert [r.value for r in records] == [b"0", b"1"]
