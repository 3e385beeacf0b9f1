"""``python -m framework.cli ...``: the ``eventlane`` command with this interpreter (what the
projector runner uses to start its worker processes)."""

from framework.cli import main

main(prog_name="eventlane")
