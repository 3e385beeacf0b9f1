"""A stopped consumer never stops a producer (issue 26: a consumer process frozen by SIGSTOP
held a partition's append lock, and a producer waited on it for 14 minutes).

A real member process (tests/consumer/group_members.py) of a group on the embedded log is
stopped with a real ``SIGSTOP`` at a seam (``EVENTLANE_PAUSES="stop:TEXT"``,
:mod:`eventlane._pauses`): the first time it takes any file lock of the consumed topic, or
in the middle of a read. While it stays stopped, a producer process must append to every
partition of the topic within :data:`APPEND_S` seconds (generous: an append takes
milliseconds). A consumer takes its group's lock and ``__consumer_offsets``' locks (it is
an appender there), never a lock of the topic it reads, on a healthy partition.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from group_members import GROUP, TOPIC, Member, processed, start_member, wait_for

from eventlane.log import LogStore

PARTITIONS = 2
APPEND_S = 30.0
"""The producer must append within this long while the consumer is stopped."""

PRODUCER = """
import sys
from eventlane.log import LogStore
with LogStore(sys.argv[1]) as log:
    for p in range({partitions}):
        log.append({topic!r}, p, [(None, b"after-stop", (), None)])
print("appended", flush=True)
"""


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (``T`` in /proc/PID/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def _produce(data: Path) -> float:
    """Append one record to each partition from another process; seconds it took (fails
    the test if it takes longer than :data:`APPEND_S`)."""
    code = PRODUCER.format(partitions=PARTITIONS, topic=TOPIC)
    started = time.monotonic()
    try:
        out = subprocess.run(
            [sys.executable, "-c", code, str(data)],
            capture_output=True,
            text=True,
            timeout=APPEND_S,
            check=True,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"the producer did not append within {APPEND_S:.0f} s: the stopped consumer"
            " holds a lock it waits for"
        )
    assert out.stdout.strip() == "appended", out
    return time.monotonic() - started


@pytest.mark.parametrize("seam", ["lock", "read"])
def test_a_stopped_consumer_never_blocks_a_producer(
    tmp_path: Path, members: list[Member], seam: str
) -> None:
    data = tmp_path / "data"
    with LogStore(data) as log:
        log.create_topic(TOPIC, PARTITIONS)
        for p in range(PARTITIONS):
            log.append(TOPIC, p, [(None, b"r%d" % i, (), None) for i in range(5)])
        topic_dir = log.partition(TOPIC, 0).dir.parent
    # the first lock of the consumed topic the consumer takes (any partition, any file), or
    # the middle of its first read of a partition
    text = f"locked {topic_dir}/" if seam == "lock" else "partition.read"
    member = start_member(
        "c0",
        tmp_path,
        env={"EVENTLANE_PAUSES": f"stop:{text}"},
        data=str(data),
        group=GROUP,
        topic=TOPIC,
        session_timeout_ms=3000,
    )
    members.append(member)
    everything = {(p, o) for p in range(PARTITIONS) for o in range(5)}
    wait_for(
        lambda: _stopped(member.proc.pid) or everything <= set(processed([member])),
        60,
        "the consumer stopped at its seam or done reading",
        [member],
    )
    if seam == "read":  # every consumer reads: this one is stopped in the middle of it
        assert _stopped(member.proc.pid), member.stderr()
    took = _produce(data)
    print(f"seam {seam}: consumer stopped={_stopped(member.proc.pid)}, appended in {took:.2f} s")
    # resumed, it goes on and reads what was appended meanwhile
    member.signal(signal.SIGCONT)
    after = {(p, 5) for p in range(PARTITIONS)}
    wait_for(
        lambda: after <= set(processed([member])), 60, "the resumed consumer reads on", [member]
    )


KEYED_READER = """
import sys
from eventlane.log import LogStore
with LogStore(sys.argv[1]) as log:  # the index lags: read_key catches it up first
    print(log.read_key("t", 0, b"k1")[-1].offset, flush=True)
"""

WRITER = """
import sys
from eventlane.errors import ConcurrencyError
from eventlane.log import Expect, LogStore

def refused(key, last):
    try:
        log.append("t", 0, [(key, b"stale", (), None)], expect=Expect(key, last))
    except ConcurrencyError:
        return True
    return False

with LogStore(sys.argv[1]) as log:
    for key in (b"new", b"k1"):  # a key with no record yet, and one of the unindexed tail
        head = log.key_head("t", 0, key)
        print(key.decode(), head, flush=True)
        appended = log.append("t", 0, [(key, b"v", (), None)], expect=Expect(key, head))
        assert refused(key, head), "a stale expect was accepted"
        assert log.key_head("t", 0, key) == appended.base_offset
    log.append("t", 0, [(b"k2", b"plain", (), None), (b"k1", b"plain", (), None)])
    print("k1", log.read_key("t", 0, b"k1")[-1].offset, flush=True)
print("appended", flush=True)
"""

RECORDS = 3000


def _model() -> dict[bytes, list[int]]:
    """Offsets of each key after the test's writes: k0..k49 round robin, then the writer's."""
    keys: dict[bytes, list[int]] = {}
    for offset in range(RECORDS):
        keys.setdefault(b"k%d" % (offset % 50), []).append(offset)
    keys[b"new"] = [RECORDS]
    keys[b"k1"].append(RECORDS + 1)
    keys[b"k2"].append(RECORDS + 2)
    keys[b"k1"].append(RECORDS + 3)
    return keys


def test_a_reader_stopped_in_a_key_index_catch_up_never_blocks_a_conditional_append(
    tmp_path: Path,
) -> None:
    """The reader holds ``<p>.keyindex.lock`` while stopped: the writer opens the index,
    reads keys, appends conditionally (a stale ``expect`` still refused) and plainly
    without it; resumed, the reader finishes, and every key reads as the model says."""
    data = tmp_path / "data"
    with LogStore(data) as log:
        log.create_topic("t", 1)
        for _ in range(RECORDS // 100):  # keyed records no key index has seen yet
            log.append("t", 0, [(b"k%d" % (j % 50), b"v", (), None) for j in range(100)])
    reader = subprocess.Popen(
        [sys.executable, "-c", KEYED_READER, str(data)],
        env={**os.environ, "EVENTLANE_PAUSES": "stop:key_index.catch_up"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not _stopped(reader.pid):
            assert reader.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        try:
            out = subprocess.run(
                [sys.executable, "-c", WRITER, str(data)],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            )
        except subprocess.TimeoutExpired:
            pytest.fail("a conditional append waited 10 s for a stopped reader's index lock")
        model = _model()
        assert out.stdout.split("\n") == [
            "new None",
            f"k1 {model[b'k1'][-3]}",
            f"k1 {model[b'k1'][-1]}",
            "appended",
            "",
        ], out
        assert _stopped(reader.pid)  # the writer went on while the reader held the lock
        reader.send_signal(signal.SIGCONT)
        stdout, _ = reader.communicate(timeout=60)
        assert reader.returncode == 0
        assert int(stdout) == model[b"k1"][-1]
    finally:
        reader.send_signal(signal.SIGCONT)
        reader.kill()
        reader.wait()
    with LogStore(data) as log:
        for key, offsets in model.items():
            assert [r.offset for r in log.read_key("t", 0, key)] == offsets, key
            assert log.key_head("t", 0, key) == offsets[-1]
        reports = log.check_keys(["t"])
        assert reports and all(report.ok for report in reports), reports
