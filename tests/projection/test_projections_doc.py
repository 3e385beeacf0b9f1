"""docs/projections.md names every projection command of the CLI.

(Its Python examples run with every other doc's in ``tests/test_docs.py``.)
"""

from __future__ import annotations

from pathlib import Path

DOC = Path(__file__).parents[2] / "docs" / "projections.md"


def test_every_projection_command_is_documented() -> None:
    text = DOC.read_text()
    for command in (
        "eventlane project run",
        "eventlane project status",
        "eventlane migrate",
        "eventlane dlq list",
        "eventlane dlq show",
        "eventlane dlq retry",
    ):
        assert command in text, command
