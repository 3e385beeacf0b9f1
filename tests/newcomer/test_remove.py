"""Item 6: retiring or renaming a projector leaves nothing behind: ``project remove``
deletes its group, read model, dead letters and dead-letter topic (``--dry-run`` lists)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.newcomer.kit import error_line, eventlane, seed, start_workers, status, stop, wait_until


def _leftovers(workdir: Path) -> tuple[str, str, list[str]]:
    groups = eventlane("--data", "d", "groups", "list", cwd=workdir).stdout
    topics = eventlane("--data", "d", "topics", "list", cwd=workdir).stdout
    files = sorted(  # SQLite's -wal/-shm come and go with any reader
        p.name
        for p in (workdir / "d" / "readmodels").glob("loans_view*")
        if not p.name.endswith(("-wal", "-shm"))
    )
    return groups, topics, files


def test_project_remove_deletes_everything_a_projector_left(workdir: Path) -> None:
    assert eventlane("--data", "d", "migrate", "library.app:app", cwd=workdir).returncode == 0
    seed(workdir, 20, prefix="m")
    seed(workdir, 2, prefix="member-vip")  # two dead letters
    run = start_workers(workdir, "loans_view", LIBRARY_BUGGY="1")
    try:
        wait_until(lambda: status(workdir, "loans_view")["lag"] == 0, 60, "lag 0")
        refused = error_line(
            eventlane("--data", "d", "project", "remove", "loans_view", cwd=workdir)
        )
        assert "live worker(s)" in refused and "stop them first" in refused
    finally:
        assert stop(run) == 0
    groups, topics, files = _leftovers(workdir)
    assert "loans_view" in groups and "loans_view.dlq" in topics and "loans_view.sqlite" in files

    dry = eventlane(
        "--data", "d", "project", "remove", "loans_view", "--dry-run", "--json", cwd=workdir
    )
    assert dry.returncode == 0, dry.stderr
    report = json.loads(dry.stdout)
    assert report["group"] and report["dlq_topic"] == "loans_view.dlq"
    assert report["dead_letters"] == 2 and report["dry_run"]
    assert _leftovers(workdir) == (groups, topics, files)  # a dry run removes nothing

    done = eventlane("--data", "d", "project", "remove", "loans_view", cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert "removed: consumer group loans_view" in done.stdout
    assert "removed: 2 dead letter(s) with the read model" in done.stdout
    groups, topics, files = _leftovers(workdir)
    assert "loans_view" not in groups and "loans_view.dlq" not in topics and files == []
    again = error_line(eventlane("--data", "d", "project", "remove", "loans_view", cwd=workdir))
    assert "nothing to remove" in again
