"""Items 15 and 16 with real worker processes: dead letters carry their traceback, the
old-SQLite note appears once per data directory. (Item 11, no orphans after kill -9 of the
supervisor, is pinned by tests/newcomer/test_e2e.py.)"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tests.newcomer.kit import (
    eventlane,
    run_until_caught_up,
    seed,
    start_workers,
    status,
    stop,
    wait_until,
)


def _migrate(workdir: Path) -> None:
    done = eventlane("--data", "d", "migrate", "library.app:app", cwd=workdir)
    assert done.returncode == 0, done.stderr


def test_dead_letters_keep_the_traceback_and_list_fits_80_columns(workdir: Path) -> None:
    _migrate(workdir)
    seed(workdir, 12, prefix="member-with-a-rather-long-identifier")
    doc = run_until_caught_up(workdir, "loans_view", LIBRARY_BUGGY="1")
    assert doc["dead_letters"]["dead"] == 12
    shown = eventlane(
        "--data", "d", "dlq", "show", "library.app:app", "1", "-p", "loans_view", cwd=workdir
    )
    assert shown.returncode == 0, shown.stderr
    source = (workdir / "library" / "projections.py").read_text().splitlines()
    line = 1 + next(i for i, text in enumerate(source) if "int(e.member_id" in text)
    assert f'library/projections.py", line {line}, in requested' in shown.stdout
    assert "int(e.member_id.split" in shown.stdout  # the source line, as Python prints it
    assert "ValueError: invalid literal for int()" in shown.stdout
    assert f"library/projections.py:{line} in requested" in shown.stdout  # "raised at" row
    listed = eventlane(
        "--data",
        "d",
        "dlq",
        "list",
        "library.app:app",
        "-p",
        "loans_view",
        cwd=workdir,
        COLUMNS="80",
    )
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    rows = [line for line in lines if "loans-" in line]
    assert len(rows) == 12, listed.stdout  # one line per letter: nothing wrapped
    assert all("ValueError" in row for row in rows)


def test_the_old_sqlite_note_is_printed_once_per_data_directory(workdir: Path) -> None:
    if sqlite3.sqlite_version_info >= (3, 51, 3):  # pragma: no cover - nothing to note
        return
    outputs = [eventlane("--data", "d", "migrate", "library.app:app", cwd=workdir).stderr]
    seed(workdir, 5)
    proc = start_workers(workdir, "loans_view", "--workers", "2")
    try:
        wait_until(lambda: status(workdir, "loans_view")["lag"] == 0, 60, "lag 0")
    finally:
        stop(proc)
    outputs.append((workdir / "run-loans_view.log").read_text())
    outputs.append(eventlane("--data", "d", "migrate", "library.app:app", cwd=workdir).stderr)
    notes = sum(text.count("older than 3.51.3") for text in outputs)
    assert notes == 1, outputs
    assert "eventlane avoids it" in outputs[0] and "once per data directory" in outputs[0]
    other = eventlane("--data", "d2", "migrate", "library.app:app", cwd=workdir).stderr
    assert other.count("older than 3.51.3") == 1  # a new data directory: noted there too
