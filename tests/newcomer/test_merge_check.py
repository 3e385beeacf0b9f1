"""Item 9: a projector that will need merge rules is flagged before a Spark rebuild:
``eventlane rebuild APP -p NAME --check`` runs the partitioned build and merge in-process."""

from __future__ import annotations

from pathlib import Path

from tests.newcomer.kit import error_line, eventlane, seed

COUNTS = '''
from typing import ClassVar

from sqlite_utils import Database

from eventlane import App, EventContext, Projector, handles
from library.app import app as library
from library.events import LoanRequested


class BookLoans(Projector):
    """Counts loans per book: a book's row is written from every partition of loans."""

    name = "book_loans"
    topics = ("loans",)
    merge_rules: ClassVar[dict[str, str]] = {RULES}

    def setup(self, db: Database) -> None:
        db.execute("CREATE TABLE IF NOT EXISTS book_loans (book_id TEXT PRIMARY KEY, n INT)")

    @handles(LoanRequested)
    def requested(self, e: LoanRequested, ctx: EventContext) -> None:
        ctx.conn.execute(
            "INSERT INTO book_loans VALUES (?, 1) ON CONFLICT(book_id) DO UPDATE SET n = n + 1",
            (e.book_id,),
        )


app = App("library", aggregates=library.aggregates, projectors=[BookLoans],
          registry=library.registry, partitions=2)
'''


def test_rebuild_check_flags_missing_merge_rules(workdir: Path) -> None:
    assert eventlane("--data", "d", "migrate", "library.app:app", cwd=workdir).returncode == 0
    seed(workdir, 12)  # 12 loans of book-1, spread over both partitions of loans
    (workdir / "counts.py").write_text(COUNTS.replace("{RULES}", "{}"))
    args = ("--data", "d", "rebuild", "counts:app", "-p", "book_loans", "--check")
    line = error_line(eventlane(*args, cwd=workdir))
    assert "table 'book_loans'" in line and "book_id='book-1'" in line
    assert "loans/0" in line and "loans/1" in line and "merge_rules" in line
    (workdir / "counts.py").write_text(COUNTS.replace("{RULES}", '{"book_loans": "n=sum"}'))
    done = eventlane(*args, cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert "merge check of book_loans: 2 partition partial(s) merge without conflict" in done.stdout
    assert sorted(p.name for p in (workdir / "d" / "readmodels").glob("*book_loans*")) == []
