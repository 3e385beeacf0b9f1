"""Items 15 and 16 with real worker processes: dead letters carry their traceback; an old
SQLite is reported by `eventlane verify`, never as a warning on a new data directory.
(Item 11, no orphans after kill -9 of the supervisor, is pinned by
tests/newcomer/test_e2e.py.)"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
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

ROOT = Path(__file__).resolve().parents[2]


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


def test_sqlite_is_reported_by_verify_not_on_every_new_data_directory(workdir: Path) -> None:
    outputs = [eventlane("--data", "d", "migrate", "library.app:app", cwd=workdir).stderr]
    seed(workdir, 5)
    proc = start_workers(workdir, "loans_view", "--workers", "2")
    try:
        wait_until(lambda: status(workdir, "loans_view")["lag"] == 0, 60, "lag 0")
    finally:
        stop(proc)
    outputs.append((workdir / "run-loans_view.log").read_text())
    outputs.append(eventlane("--data", "d2", "migrate", "library.app:app", cwd=workdir).stderr)
    assert not [text for text in outputs if "SQLite" in text], outputs
    verified = eventlane("--data", "d", "verify", cwd=workdir)
    assert verified.returncode == 0, verified.stderr
    old = sqlite3.sqlite_version_info < (3, 51, 3)
    assert (f"note: SQLite {sqlite3.sqlite_version} is older than 3.51.3" in verified.stdout) == old
    as_json = json.loads(eventlane("--data", "d", "verify", "--json", cwd=workdir).stdout)
    assert as_json["sqlite"]["version"] == sqlite3.sqlite_version
    assert (as_json["sqlite"]["note"] is not None) == old


def test_the_readme_example_says_nothing_about_sqlite(tmp_path: Path) -> None:
    """The README's example, as a new user runs it: a script in a fresh process."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    code = "\n".join(re.findall(r"^```python\n(.*?)^```", readme, re.S | re.M))
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "SQLite" not in done.stderr and done.stdout == ""
