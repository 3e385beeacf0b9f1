"""Item 8: a forgotten ``--data`` does not go unnoticed: creating a data directory says
where, and ``project run`` starts with a line naming data, projector, partitions and lag."""

from __future__ import annotations

import time
from pathlib import Path

from tests.newcomer.kit import eventlane, seed, start_workers, stop, wait_until


def test_implicit_data_directory_and_start_up_line(workdir: Path) -> None:
    created = eventlane("topics", "create", "notes", cwd=workdir)  # no --data at all
    assert created.returncode == 0, created.stderr
    where = workdir / "eventlane-data"
    assert f"created data directory {where} (choose another with --data DIR" in created.stderr
    again = eventlane("topics", "create", "more", cwd=workdir)
    assert "created data directory" not in again.stderr  # once: when it is created

    assert eventlane("--data", "d", "migrate", "library.app:app", cwd=workdir).returncode == 0
    seed(workdir, 7)
    run = start_workers(workdir, "loans_view", "--workers", "2")
    log = workdir / "run-loans_view.log"
    try:
        wait_until(lambda: "project run:" in log.read_text(), 60, "the start-up line")
        time.sleep(0.2)
    finally:
        stop(run)
    line = next(x for x in log.read_text().splitlines() if x.startswith("project run:"))
    assert line.startswith(
        f"project run: data {workdir / 'd'}, projector loans_view, 2 partition(s)"
        " (loans-0, loans-1), lag 7, 2 worker(s)"
    ), line
