"""``python -m eventlane.cli ...``: the ``eventlane`` command with this interpreter (what the
projector runner uses to start its worker processes)."""

from eventlane.cli import main

main(prog_name="eventlane")
