"""The public facade: ``eventlane.__all__`` is the documented list, ``import eventlane`` has no
side effects, and a user's mypy sees the types through ``py.typed``."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import eventlane

ROOT = Path(__file__).resolve().parents[1]
ROW = re.compile(r"^\| `([A-Za-z_]+)` \| `(eventlane[.a-z_]*)` \|", re.M)


def documented() -> list[tuple[str, str]]:
    return ROW.findall((ROOT / "docs" / "api.md").read_text(encoding="utf-8"))


def test_all_is_the_documented_facade_sorted() -> None:
    names = [name for name, _ in documented()]
    assert eventlane.__all__ == names
    assert names == sorted(names)
    assert len(names) == len(set(names))


def test_every_name_resolves_from_the_module_the_docs_name() -> None:
    for name, module in documented():
        value = getattr(eventlane, name)
        assert value is getattr(sys.modules[module], name), name
    assert set(eventlane.__all__) <= set(dir(eventlane))
    with pytest.raises(AttributeError, match="no attribute 'Aggregat'"):
        _ = eventlane.Aggregat  # type: ignore[attr-defined]


def test_version_is_the_installed_distributions() -> None:
    assert eventlane.__version__ == importlib.metadata.version("eventlane")
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", eventlane.__version__)


def test_import_has_no_side_effects() -> None:
    """In a fresh interpreter: no logging configured, no subpackage or heavy library loaded."""
    code = (
        "import sys, eventlane\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('eventlane.'))\n"
        "heavy = sorted(m for m in ('structlog', 'pytest', 'sqlite_utils', 'pyspark', 'click')"
        " if m in sys.modules)\n"
        "import structlog\n"
        "print(loaded, heavy, structlog.is_configured())\n"
        "eventlane.App\n"
        "print(structlog.is_configured())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out == ["[] [] False", "False"]


def test_package_ships_py_typed() -> None:
    assert (ROOT / "eventlane" / "py.typed").is_file()
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'eventlane = \[[^]]*"py\.typed"', pyproject)


USER_APP = """
from eventlane import DomainEvent, EventContext, Projector, event, handles
from attrs import frozen


@event("MemberJoined")
@frozen
class MemberJoined(DomainEvent):
    member_id: str


class Members(Projector):
    name = "members"
    topics = ("members",)

    @handles(MemberJoined)
    def joined(self, e: MemberJoined, ctx: EventContext) -> None:
        ctx.db.execute("INSERT INTO members VALUES (?)", (e.{field},))
"""


def test_user_mypy_sees_the_types_and_fails_on_a_handler_typo(tmp_path: Path) -> None:
    """One mypy run over a correct app and the same app with ``e.memberid``: the only error is
    the typo (without ``py.typed`` the correct one would fail too: "missing library stubs")."""
    (tmp_path / "good_app.py").write_text(USER_APP.format(field="member_id"))
    (tmp_path / "typo_app.py").write_text(USER_APP.format(field="memberid"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MYPYPATH", None)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "good_app.py",
            "typo_app.py",
        ],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in run.stdout.splitlines() if ": error:" in line]
    assert run.returncode == 1, run.stdout + run.stderr
    assert len(errors) == 1, run.stdout
    assert errors[0].startswith("typo_app.py:")
    assert '"MemberJoined" has no attribute "memberid"' in errors[0]
