"""Item 10: every failure is one ``Error:`` line and exit status 1 (usage errors: 2),
including a bad ``--master`` and an unreachable Spark master (a bounded wait)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from tests.newcomer.kit import error_line, eventlane


def test_bad_master_is_one_error_line(workdir: Path) -> None:
    assert eventlane("--data", "d", "migrate", "library.app:app", cwd=workdir).returncode == 0
    for master in ("local[x]", "local[0]", "spark://", "yarn-cluster"):
        done = eventlane(
            "--data",
            "d",
            "rebuild",
            "library.app:app",
            "-p",
            "loans_view",
            "--master",
            master,
            cwd=workdir,
        )
        line = error_line(done)
        assert f"not a Spark master: {master!r}" in line and "local[N]" in line


def test_unreachable_master_fails_after_a_bounded_wait(workdir: Path) -> None:
    assert eventlane("--data", "d", "migrate", "library.app:app", cwd=workdir).returncode == 0
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    done = eventlane(
        "--data",
        "d",
        "rebuild",
        "library.app:app",
        "-p",
        "loans_view",
        "--master",
        f"spark://127.0.0.1:{port}",
        cwd=workdir,
        EVENTLANE_SPARK_CONNECT_TIMEOUT="2",
    )
    took = time.monotonic() - started
    line = error_line(done)
    assert f"cannot reach Spark master spark://127.0.0.1:{port} after 2 s" in line
    assert took < 40, took  # Spark alone waits ~67 s, then prints pages of Java traces


def test_an_unexpected_exception_is_one_error_line_and_usage_errors_stay_2(
    workdir: Path,
) -> None:
    (workdir / "broken.py").write_text("raise RuntimeError('the app module is broken')\n")
    line = error_line(eventlane("--data", "d", "migrate", "broken:app", cwd=workdir))
    assert "RuntimeError: the app module is broken" in line
    usage = eventlane("--data", "d", "project", "run", cwd=workdir)  # APP missing
    assert usage.returncode == 2 and "Usage:" in usage.stderr
    unknown = eventlane("--data", "d", "topics", "list", "--bogus", cwd=workdir)
    assert unknown.returncode == 2
