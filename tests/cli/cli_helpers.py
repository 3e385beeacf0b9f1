"""Helpers for the CLI tests: the real ``eventlane`` console script as a child process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EVENTLANE = Path(sys.executable).parent / "eventlane"
"""The console script installed in the virtual environment running the tests."""


def eventlane(
    *args: str,
    data: Path,
    input: bytes | None = None,
    timeout: float = 60,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run the real ``eventlane`` console script in a child process."""
    return subprocess.run(
        [str(EVENTLANE), "--data", str(data), *args],
        input=input,
        capture_output=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **(env or {})},
    )


def popen(*args: str, data: Path, **kwargs: object) -> subprocess.Popen[bytes]:
    """Start the real ``eventlane`` console script with pipes for stdin/stdout/stderr."""
    return subprocess.Popen(  # type: ignore[call-overload,no-any-return]
        [str(EVENTLANE), "--data", str(data), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kwargs,
    )


def tree(path: Path) -> list[str]:
    """Every path under ``path`` (relative), sorted; [] if it does not exist."""
    if not path.exists():
        return []
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))
