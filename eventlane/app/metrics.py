"""Where an application's groups and projections stand, as Prometheus metrics read at each
scrape (:class:`StateCollector`; the instruments live in :mod:`eventlane.metrics`).

A web service embedding eventlane registers one on its own registry::

    from prometheus_client import REGISTRY
    REGISTRY.register(StateCollector(runtime))

Invariant: every figure is read from the same state, by the same functions, as ``eventlane
groups describe`` and ``eventlane project status`` (the log's marks, the groups' shared
state, the read models), so the two never disagree beyond the time between the reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from eventlane.consumer.admin import describe_group, list_groups

if TYPE_CHECKING:
    from eventlane.app.application import Runtime
    from eventlane.log import Log

__all__ = ["StateCollector"]


class StateCollector:
    """Where groups and projections stand, read at each scrape (see the module docstring).

    ``runtime``: the application whose projections to report (``None``: groups only);
    ``log``: the log (the runtime's by default). A scrape that cannot read a piece of state
    (a read model being replaced, a cluster unreachable) skips it and counts the failure in
    ``eventlane_scrape_errors``: the endpoint keeps answering.
    """

    def __init__(self, runtime: Runtime | None = None, log: Log | None = None) -> None:
        if runtime is None and log is None:
            raise ValueError("StateCollector needs a runtime or a log")
        self.runtime = runtime
        self.log: Log = log if log is not None else runtime.log  # type: ignore[union-attr]

    def describe(self) -> list[Any]:
        return []  # unchecked collector: families vary with the groups that exist

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily  # noqa: PLC0415

        errors = 0
        committed = GaugeMetricFamily(
            "eventlane_consumer_group_committed_offset",
            "The group's committed offset (the next record it will read).",
            labels=["group", "topic", "partition"],
        )
        lag = GaugeMetricFamily(
            "eventlane_consumer_group_lag",
            "Records between the committed offset and the high-water mark.",
            labels=["group", "topic", "partition"],
        )
        hwm = GaugeMetricFamily(
            "eventlane_log_high_watermark",
            "The partition's high-water mark (offset after the last readable record).",
            labels=["topic", "partition"],
        )
        members = GaugeMetricFamily(
            "eventlane_consumer_group_members", "Live members of the group.", labels=["group"]
        )
        generation = GaugeMetricFamily(
            "eventlane_consumer_group_generation", "The group's generation.", labels=["group"]
        )
        seen: set[tuple[str, int]] = set()
        try:
            groups = list_groups(self.log)
        except Exception:  # a scrape must answer; counted below
            groups, errors = [], errors + 1
        for entry in groups:
            name = str(entry["group"])
            try:
                doc = describe_group(self.log, name)
            except Exception:  # counted below
                errors += 1
                continue
            members.add_metric([name], len(doc.get("members", [])))
            if doc.get("generation") is not None:
                generation.add_metric([name], float(doc["generation"]))
            for row in doc.get("offsets", []):
                labels = [name, str(row["topic"]), str(row["partition"])]
                if row["committed"] is not None:
                    committed.add_metric(labels, float(row["committed"]))
                if row["lag"] is not None:
                    lag.add_metric(labels, float(row["lag"]))
                key = (str(row["topic"]), int(row["partition"]))
                if key not in seen and row["hwm"] is not None:
                    seen.add(key)
                    hwm.add_metric([key[0], str(key[1])], float(row["hwm"]))
        yield from (committed, lag, hwm, members, generation)
        if self.runtime is not None:
            projection_errors, families = self._projections(self.runtime)
            errors += projection_errors
            yield from families
        failures = GaugeMetricFamily(
            "eventlane_scrape_errors", "Pieces of state this scrape could not read."
        )
        failures.add_metric([], errors)
        yield failures

    def _projections(self, runtime: Runtime) -> tuple[int, list[Any]]:
        from prometheus_client.core import GaugeMetricFamily  # noqa: PLC0415

        position = GaugeMetricFamily(
            "eventlane_projection_position",
            "The next offset the read model will apply, per partition.",
            labels=["projector", "topic", "partition"],
        )
        lag = GaugeMetricFamily(
            "eventlane_projection_lag",
            "Events the read model has not applied yet (as eventlane project status).",
            labels=["projector"],
        )
        letters = GaugeMetricFamily(
            "eventlane_projection_dead_letters",
            "Dead letters in the read model, by status (dead, parked, retried).",
            labels=["projector", "status"],
        )
        breaker = GaugeMetricFamily(
            "eventlane_projection_breaker_open",
            "1 while the projector's poison-rate breaker is tripped, else 0.",
            labels=["projector"],
        )
        waiting = GaugeMetricFamily(
            "eventlane_projection_waiting_partitions",
            "Partitions stopped at an event newer than the workers' code (waiting for a"
            " deploy), by the event type and version they wait for.",
            labels=["projector", "event_type", "version"],
        )
        errors = 0
        for name in sorted(runtime.app.projectors):
            try:
                doc = runtime.status(name)
            except Exception:  # a scrape must answer
                errors += 1
                continue
            lag.add_metric([name], float(doc["lag"]))
            for row in doc["partitions"]:
                if row["position"] is not None:
                    position.add_metric(
                        [name, str(row["topic"]), str(row["partition"])], float(row["position"])
                    )
            for status in ("dead", "parked", "retried"):
                letters.add_metric([name, status], float(doc["dead_letters"].get(status, 0)))
            breaker.add_metric([name], 0.0 if doc.get("breaker") is None else 1.0)
            waits: dict[tuple[str, str], int] = {}
            for w in doc.get("waiting", ()):
                key = (str(w["event_type"]), str(w["version"]))
                waits[key] = waits.get(key, 0) + 1
            for (event_type, version), count in sorted(waits.items()):
                waiting.add_metric([name, event_type, version], float(count))
        return errors, [position, lag, letters, breaker, waiting]
