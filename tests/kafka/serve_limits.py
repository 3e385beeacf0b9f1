"""``python serve_limits.py DATA PORT LIMITS_JSON``: a Kafka listener with the given
:class:`eventlane.kafka.Limits` (the CLI serves the defaults), until SIGTERM."""

from __future__ import annotations

import json
import signal
import sys

from eventlane.kafka import Limits, serve
from eventlane.log import LogStore


def main() -> None:
    data, port, limits = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve(LogStore(data), "127.0.0.1", port, limits=Limits(**limits))


if __name__ == "__main__":
    main()
