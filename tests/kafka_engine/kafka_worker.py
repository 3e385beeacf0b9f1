"""A projector worker process on a Kafka log (not a test module).

The app layer's ``Runtime`` needs the KeyedLog role (its event store), which the Kafka
engine gets in part 2; a *projector* worker needs none of it: the real
:class:`~eventlane.projection.Worker` runs here on a :class:`ProjectorHost`, the part of an
application a projector worker uses (its declaration, codec, names, partition counts), over
a ``kafka://`` log. Its consumer group is Kafka's (``GroupConsumer`` on a Kafka log).

Run: ``python tests/kafka_engine/kafka_worker.py URL DATA NAME SESSION_MS [--self-stop PATH]``
or ``... URL DATA NAME SESSION_MS --app``: the worker on the whole application
(``bankapp.app.open(log)``, its event store on Kafka), which a policy (``invoicing``) needs.
(URL with its ``?namespace=``). SIGTERM stops it cleanly. With ``--self-stop`` it writes the
batch in hand to PATH and SIGSTOPs itself once, between poll and apply (the zombie of the
exactly-once test), then applies that batch on SIGCONT and prints ``ZOMBIE-RESULT applied``
or ``ZOMBIE-RESULT refused`` on stderr.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from eventlane.log.kafka.log import KafkaLog  # noqa: E402
from eventlane.log.local import LocalDir  # noqa: E402
from eventlane.observability import configure_logging  # noqa: E402
from eventlane.projection import Worker  # noqa: E402
from tests.projection import bankapp  # noqa: E402


class ProjectorHost:
    """What a projector worker uses of an application, on a log without the KeyedLog role
    (no command side: a policy handler would fail loudly)."""

    def __init__(self, app: Any, log: KafkaLog) -> None:
        self.app = app
        self.log = log
        self.names = app.names
        self.codec = app.codec(keys=None)

    def partitions_for(self, topic: str) -> int:
        partitions = self.app.partitions
        return partitions if isinstance(partitions, int) else int(partitions.get(topic, 1))

    def __getattr__(self, name: str) -> Any:  # load/save/execute/issue: no event store here
        raise AttributeError(f"a projector host on Kafka has no {name} (part 2)")


def main(argv: list[str]) -> None:
    url, data, name, session_ms = argv[0], argv[1], argv[2], int(argv[3])
    self_stop = Path(argv[5]) if len(argv) > 5 and argv[4] == "--self-stop" else None
    whole_app = argv[4:5] == ["--app"]
    configure_logging(level="info")
    with KafkaLog.from_url(url, local=LocalDir.at(Path(data))) as log:
        host: Any = bankapp.app.open(log) if whole_app else ProjectorHost(bankapp.app, log)
        worker = Worker(
            host,
            name,
            session_timeout_ms=session_ms,
            heartbeat_interval_ms=500,
            max_poll_records=10,
        )
        worker.install_signal_handlers()
        stopped = self_stop is None
        try:
            while not worker.stopping.is_set():
                polled = worker.poll()
                if polled.records and not stopped:
                    stopped = True
                    assert self_stop is not None
                    spans: dict[int, list[int]] = {}
                    for r in polled.records:
                        spans.setdefault(r.partition, []).append(r.offset)
                    body = [[p, min(o), max(o)] for p, o in sorted(spans.items())]
                    self_stop.write_text(
                        json.dumps({"generation": polled.generation, "spans": body})
                    )
                    os.kill(os.getpid(), signal.SIGSTOP)
                    result = worker.apply(polled)
                    sys.stderr.write(
                        f"ZOMBIE-RESULT {'refused' if result is None else 'applied'}\n"
                    )
                    sys.stderr.flush()
                    continue
                worker.apply(polled)
        finally:
            worker.close()


if __name__ == "__main__":
    main(sys.argv[1:])
