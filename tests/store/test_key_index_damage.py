"""A damaged key index is derived data (issue 17 #5): whatever the damage, loads and saves
keep working (the index is rebuilt from the log), ``verify`` reports the damage without a
traceback and ``verify --repair`` repairs it. Real SQLite files, damaged on disk."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from store_domain import Counter, make_app
from test_verify_cli import eventlane, verify_here

COUNTERS = [f"c{i}" for i in range(6)]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    with make_app(path) as app:
        for name in COUNTERS:
            counter = Counter(name)
            for _ in range(5):
                counter.increment()
            app.save(counter)
    for index in (path / "store" / "counters").glob("*.keyindex.sqlite"):
        with sqlite3.connect(index) as db:  # fold the WAL in, so damage hits the file
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


def _indexes(data: Path) -> list[Path]:
    return sorted((data / "store" / "counters").glob("*.keyindex.sqlite"))


def _undecodable_text(path: Path) -> None:
    """Bytes that make SQLite return a text value that is not UTF-8 (the red team's case)."""
    raw = bytearray(path.read_bytes())
    at = raw.find(b"stream")
    assert at > 0
    raw[at : at + 6] = b"\xff\xfe\xfd\xfc\xfb\xfa"
    path.write_bytes(bytes(raw))


def _wrong_types(path: Path) -> None:
    with sqlite3.connect(path, isolation_level=None) as db:
        db.execute("UPDATE meta SET value = 'x\u00ff' WHERE name IN ('next_offset', 'rows')")


def _random_bytes(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    rng = random.Random(len(raw))
    for _ in range(64):
        at = rng.randrange(100, len(raw))
        raw[at] = rng.randrange(256)
    path.write_bytes(bytes(raw))


DAMAGE: dict[str, Callable[[Path], None]] = {
    "undecodable text": _undecodable_text,
    "values of the wrong type": _wrong_types,
    "random bytes": _random_bytes,
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_key_index_is_rebuilt_and_repaired(data: Path, damage: str) -> None:
    for index in _indexes(data):
        DAMAGE[damage](index)
    with make_app(data) as app:  # loads and saves of every stream keep working
        for name in COUNTERS:
            counter = app.load(Counter, name)
            assert (counter.value, counter.version) == (5, 5)
            counter.increment()
            app.save(counter)
        assert [app.load(Counter, name).value for name in COUNTERS] == [6] * 6
    for index in _indexes(data):
        DAMAGE[damage](index)
    found = eventlane(data)
    assert "Traceback" not in found.stderr, found.stderr
    assert found.returncode == 1 and "KEY INDEX" in found.stdout, found.stderr
    assert "unreadable index" in found.stdout or "rows" in found.stdout, found.stdout
    repaired = verify_here(data, "--repair")
    assert repaired.exception is None or isinstance(repaired.exception, SystemExit)
    clean = verify_here(data)
    assert clean.exit_code == 0, clean.output
    assert "consistent with the log" in clean.stdout
