"""The real ``eventlane`` console script in child processes: pipes, tailing, kill -9."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cli_helpers import EVENTLANE, eventlane, popen

from eventlane.log import LogStore

START_S = 60.0  # a child interpreter may start slowly on a loaded 2-core machine


def read_line(stream, timeout: float = START_S) -> bytes:
    """One line from a child's pipe, failing the test if none comes within ``timeout``."""
    deadline = time.monotonic() + timeout
    buf = b""
    fd = stream.fileno()
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(left, 0))
        if not ready:
            raise AssertionError(f"no line within {timeout} s (got {buf!r})")
        chunk = os.read(fd, 1)
        if not chunk:
            raise AssertionError(f"pipe closed (got {buf!r})")
        buf += chunk
    return buf


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    result = eventlane("topics", "create", "orders", "--partitions", "3", data=path)
    assert result.returncode == 0, result.stderr
    return path


def test_print_offsets_come_before_end_of_input_and_are_durable(data: Path) -> None:
    """Each line is acknowledged while stdin stays open, and is readable once printed."""
    proc = popen("produce", "orders", "--key-separator", ":", "--print-offsets", data=data)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        with LogStore(data) as log:
            for i in range(5):
                proc.stdin.write(f"key-{i}:value-{i}\n".encode())
                proc.stdin.flush()
                partition, offset = map(int, read_line(proc.stdout).split())
                records, _ = log.read("orders", partition, offset)
                assert records[0].offset == offset  # below the HWM: durable and visible
                assert (records[0].key, records[0].value) == (f"key-{i}".encode(),
                                                              f"value-{i}".encode())  # fmt: skip
        proc.stdin.close()
        assert proc.wait(timeout=START_S) == 0
    finally:
        proc.kill()
        proc.wait()


def test_follow_picks_up_a_record_appended_by_another_process(data: Path) -> None:
    consumer = popen("consume", "orders", "--partition", "1", "--follow", "--max", "2", data=data)
    assert consumer.stdout is not None
    try:
        produced = eventlane("produce", "orders", "--partition", "1", data=data, input=b"first\n")
        assert produced.returncode == 0, produced.stderr
        first = json.loads(read_line(consumer.stdout))
        assert (first["partition"], first["offset"], first["value"]) == (1, 0, "first")
        time.sleep(0.2)  # the consumer is now waiting at the high-water mark
        started = time.monotonic()
        eventlane("produce", "orders", "--partition", "1", data=data, input=b"second\n")
        second = json.loads(read_line(consumer.stdout))
        assert (second["offset"], second["value"]) == (1, "second")
        assert consumer.wait(timeout=START_S) == 0  # --max 2 reached: exits by itself
        assert time.monotonic() - started < START_S
    finally:
        consumer.kill()
        consumer.wait()


def test_kill_9_mid_produce_loses_no_acknowledged_record(data: Path) -> None:
    """Every line printed by --print-offsets before a kill -9 is stored, once, in order."""
    acked: list[tuple[int, int, bytes]] = []
    for cycle in range(3):
        proc = popen("produce", "orders", "--key-separator", ":", "--print-offsets", data=data)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        sent: list[bytes] = []
        acked_here = 0
        try:
            for burst in range(4):
                chunk = [f"k{n % 11}:c{cycle}-b{burst}-{n}".encode() for n in range(200)]
                proc.stdin.write(b"".join(line + b"\n" for line in chunk))
                proc.stdin.flush()
                sent.extend(chunk)
                # Acknowledgements come in input order: the i-th printed line is sent[i].
                for _ in range(40 + 20 * cycle):
                    p, o = map(int, read_line(proc.stdout).split())
                    acked.append((p, o, sent[acked_here].split(b":", 1)[1]))
                    acked_here += 1
        finally:
            os.kill(proc.pid, signal.SIGKILL)  # while input is still pending
            proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                stream.close()
    with LogStore(data) as log:
        stored: dict[tuple[int, int], bytes | None] = {}
        for p in range(3):
            records, _ = log.read("orders", p, 0, max_bytes=1 << 30)
            offsets = [r.offset for r in records]
            assert offsets == sorted(set(offsets))  # strictly increasing, no duplicates
            stored.update({(p, r.offset): r.value for r in records})
    for p, o, value in acked:
        assert stored[(p, o)] == value
    values = [v for v in stored.values() if v is not None]
    assert len(values) == len(set(values))  # nothing appended twice
    assert eventlane("verify", data=data).returncode == 0


def test_errors_in_a_real_process_are_one_line_without_traceback(data: Path) -> None:
    result = eventlane("consume", "orders", "--partition", "0", "--offset", "5", data=data)
    assert result.returncode == 1
    assert result.stderr.decode().startswith("Error: offset 5 is out of range")
    assert b"Traceback" not in result.stderr and result.stdout == b""


def test_consume_into_a_closed_pipe_exits_quietly(data: Path) -> None:
    lines = b"".join(b"value %d\n" % i for i in range(20_000))
    assert (
        eventlane("produce", "orders", "--partition", "0", data=data, input=lines).returncode == 0
    )
    proc = subprocess.Popen(
        f"'{EVENTLANE}' --data '{data}' consume orders | head -n 1",
        shell=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = proc.communicate(timeout=START_S)
    assert json.loads(out)["value"] == "value 0"
    assert b"Traceback" not in err and b"BrokenPipe" not in err


def test_demo_runs_as_a_real_process(tmp_path: Path) -> None:
    result = eventlane("demo", "log", data=tmp_path / "demo", timeout=120)
    assert result.returncode == 0, result.stderr
    assert b"Verify" in result.stdout and b"intact" in result.stdout


def test_produce_stops_with_a_clear_error_when_its_acknowledgements_are_not_read(
    data: Path, tmp_path: Path
) -> None:
    lines = tmp_path / "lines.txt"
    lines.write_bytes(b"".join(b"value %d\n" % i for i in range(200_000)))
    proc = subprocess.Popen(
        f"'{EVENTLANE}' --data '{data}' produce orders --print-offsets < '{lines}' | head -n 1;"
        " exit ${PIPESTATUS[0]}",
        shell=True,
        executable="/bin/bash",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = proc.communicate(timeout=START_S)
    assert proc.returncode == 1
    assert out.split()[1] == b"0"  # the first acknowledgement: offset 0
    assert err.startswith(b"Error: standard output was closed") and b"Traceback" not in err
