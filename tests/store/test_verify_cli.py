"""``eventlane verify`` checks the key indexes against the log; ``--repair`` rebuilds them.

The main flows run the real console script in a child process; the variants run the same
click command in-process (the script starts slowly: about 1.5 s of imports)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner, Result
from store_domain import Counter, make_app

from eventlane.cli import main

EVENTLANE = Path(sys.executable).parent / "eventlane"


def eventlane(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(EVENTLANE), "--data", str(data), "verify", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def verify_here(data: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["--data", str(data), "verify", *args])


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    with make_app(path) as app:
        for i in range(6):
            counter = Counter(f"c{i}")
            for _ in range(30):
                counter.increment()
            app.save(counter)
    return path


def tamper(data: Path, key: bytes) -> Path:
    """Shift ``key``'s rows by one offset, fixing the meta data (a wrong but plausible
    index); return the file."""
    with make_app(data) as app:
        partition = app.store.partition_of("counters", key.decode())
    path = data / "store" / "counters" / f"{partition}.keyindex.sqlite"
    with sqlite3.connect(path, isolation_level=None) as db:
        db.execute("UPDATE entries SET offset = offset + 1 WHERE key = ?", (key,))
        db.execute("UPDATE meta SET value = value + 30 WHERE name = 'checksum'")
    return path


def test_verify_reports_a_healthy_store(data: Path) -> None:
    result = eventlane(data)
    assert result.returncode == 0, result.stderr
    # Indexes exist for the partitions the store has used: both of "counters".
    assert "checked 2 key index(es): consistent with the log" in result.stdout
    report = orjson.loads(eventlane(data, "--json").stdout)
    indexes = report["key_indexes"]
    assert [(r["topic"], r["partition"], r["problem_count"]) for r in indexes] == [
        ("counters", 0, 0),
        ("counters", 1, 0),
    ]
    assert sum(r["entries"] for r in indexes) == 180
    assert all(r["next_offset"] == r["hwm"] for r in indexes)


def test_verify_reports_wrong_rows_and_repair_rebuilds(data: Path) -> None:
    path = tamper(data, b"c3")
    result = eventlane(data)
    assert result.returncode == 1
    lines = [line for line in result.stdout.splitlines() if line.startswith("KEY INDEX")]
    assert lines and all(f"file={path}" in line for line in lines)
    assert any("b'c3'" in line for line in lines)
    assert "differ from the log" in result.stderr
    as_json = verify_here(data, "--json")
    assert as_json.exit_code == 1
    report = orjson.loads(as_json.stdout)
    (bad,) = [r for r in report["key_indexes"] if r["problem_count"]]
    assert (bad["topic"], bad["path"], bad["repaired"]) == ("counters", str(path), False)

    repaired = eventlane(data, "--repair")
    assert repaired.returncode == 0, repaired.stderr
    assert "REPAIRED key index topic=counters" in repaired.stdout
    again = verify_here(data, "counters")
    assert again.exit_code == 0 and "consistent with the log" in again.stdout
    with make_app(data) as app:
        assert app.load(Counter, "c3").value == 30


def test_verify_reports_an_unreadable_index_and_repair_replaces_it(data: Path) -> None:
    path = data / "store" / "counters" / "0.keyindex.sqlite"
    path.write_bytes(os.urandom(path.stat().st_size))
    result = verify_here(data)
    assert result.exit_code == 1
    assert f"KEY INDEX topic=counters partition=0 file={path}: unreadable index" in result.stdout
    assert verify_here(data, "--repair").exit_code == 0
    assert verify_here(data).exit_code == 0


def test_verify_reports_orphan_indexes_and_repair_deletes_them(data: Path) -> None:
    with make_app(data) as app:
        app.log.delete_topic("counters")
    result = verify_here(data)
    assert result.exit_code == 1
    assert "orphan index: the log has no partition 0 of topic 'counters'" in result.stdout
    assert verify_here(data, "--repair").exit_code == 0
    assert list((data / "store" / "counters").iterdir()) == []
    assert verify_here(data).exit_code == 0
