"""Item 12: two apps on one data directory: a partition-count mismatch is an error naming
the fix, and ``migrate`` refuses to graft one app's migrations onto another app's read
model."""

from __future__ import annotations

from pathlib import Path

from tests.newcomer.kit import error_line, eventlane, seed

OTHER_APP = """
from sqlite_utils import Database, Migrations

from eventlane import App, Projector

other = Migrations("other.loans")


@other()
def m001_other(db: Database) -> None:
    db.execute("CREATE TABLE other (x TEXT)")


class OtherLoans(Projector):
    name = "loans_view"  # the same projector name as the library's
    topics = ("orders",)
    migrations = other


app = App("shop", projectors=[OtherLoans], partitions=2)
"""

SIX = """
from library.app import app as library
from eventlane import App

app = App("library", aggregates=library.aggregates, projectors=library.projectors.values(),
          registry=library.registry, partitions=6)
"""


def test_a_second_app_cannot_graft_its_migrations(workdir: Path) -> None:
    (workdir / "shop.py").write_text(OTHER_APP)
    assert eventlane("--data", "d", "migrate", "library.app:app", cwd=workdir).returncode == 0
    line = error_line(eventlane("--data", "d", "migrate", "shop:app", cwd=workdir))
    assert "read model 'loans_view' belongs to app 'library', not to app 'shop'" in line
    assert "nothing was applied" in line
    tables = eventlane("--data", "d", "project", "status", "library.app:app", cwd=workdir)
    assert tables.returncode == 0 and "Pending migrations" not in tables.stdout


def test_a_partition_count_mismatch_is_an_error(workdir: Path) -> None:
    (workdir / "six.py").write_text(SIX)
    assert eventlane("--data", "d", "migrate", "library.app:app", cwd=workdir).returncode == 0
    seed(workdir, 3)  # the library created its topics with 2 partitions
    line = error_line(eventlane("--data", "d", "migrate", "six:app", cwd=workdir))
    assert "topic 'members' exists with 2 partition(s), but the app declares 6" in line
    assert "declare partitions={'members': 2}" in line
