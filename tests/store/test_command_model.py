"""Model-based tests of the command path: per-aggregate versions are contiguous and every
command's effect is stored exactly once, whatever the interleaving of ``execute``,
``issue``, ``save`` and loads across runtimes and OS processes, stream caches of any size
(or none), and appends whose outcome is unknown.

The reference model is a dictionary of streams written independently of the store:
aggregate id -> the tags of its events in version order (a command enters one unique tag;
an ``issue`` enters its cause, at most once per aggregate). Two drivers:

* in one process, a Hypothesis rule-based state machine over three runtimes on one data
  directory (caches off, tiny, default; reopened with other sizes), checking each answer
  against the model as it goes and the raw log against it at the end;
* across processes, children (``model_app.py``) run seeded command streams concurrently
  on one data directory; each prints what was acknowledged; afterwards the model built
  from the acknowledgements is compared with the raw topics.

Faults (:class:`model_app.FaultyLog`) are injected on appends: stored or lost with
:class:`OutcomeUnknownError`, landing late (or between a look for it and the next decision),
or :class:`LogUnavailableError`. The soak
variants (``-m soak``) run ``EVENTLANE_MODEL_STEPS`` steps (default 100,000) per property.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter as Multiset
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test
from model_app import MODES, FaultyLog, ledger_class, open_runtime, raw_ledgers

from eventlane.app import Runtime
from eventlane.errors import AggregateNotFoundError, ConcurrencyError, SerializationError

IDS = ("a", "b", "s1", "s2")
"""Aggregates: two ``Ledger``s and two ``SnapLedger``s (``s``: snapshot every 5 events)."""
CAUSES = ("c0", "c1", "c2", "c3")
CACHES = (0, 8, 40, 20_000)
"""Stream cache sizes: off, streams of two events, of ten, the default."""
SOAK_STEPS = int(os.environ.get("EVENTLANE_MODEL_STEPS", "100000"))
CHILD = Path(__file__).with_name("model_app.py")


def raw_streams(data: Path | str) -> dict[str, list[tuple[int, str, int]]]:
    """Aggregate id -> ``(version, tag, schema)`` of its events in log order, read raw."""
    streams: dict[str, list[tuple[int, str, int]]] = {}
    for e in raw_ledgers(data):
        streams.setdefault(e.aggregate_id, []).append((e.version, e.tag, e.schema))
    return streams


def check_contiguous(streams: dict[str, list[tuple[int, str, int]]]) -> None:
    for aggregate_id, events in streams.items():
        versions = [v for v, _, _ in events]
        assert versions == list(range(1, len(events) + 1)), (aggregate_id, versions)
        twice = [tag for tag, n in Multiset(t for _, t, _ in events).items() if n > 1]
        assert not twice, f"{aggregate_id}: effects stored twice: {twice}"


# ---------------------------------------------------------------------- one process
class CommandMachine(RuleBasedStateMachine):
    """Three runtimes on one data directory against a dictionary of streams.

    Runtimes start on release 1 (``Entered`` v1) and may be upgraded, one at a time, to
    release 2 (writes v2, reads v1 through an upcaster). A release-1 runtime that meets a
    v2 event may refuse with a ``SerializationError`` (nothing written); every answer it
    does give must still be the model's."""

    steps = 0
    progress = 0
    """Print the steps done to stderr every ``progress`` runs (0: never; the soak)."""
    runs = 0

    def __init__(self) -> None:
        super().__init__()
        self.data = Path(tempfile.mkdtemp(prefix="eventlane-model-"))
        self.schema = [1, 1, 1]
        self.runtimes: list[tuple[Runtime, FaultyLog]] = [
            open_runtime(self.data, cache) for cache in (0, 40, 20_000)
        ]
        self.model: dict[str, list[tuple[str, int]]] = {}
        """Aggregate id -> (tag, schema) of its events, version 1 first."""
        self.held: dict[tuple[int, str], tuple[Any, int]] = {}
        self.tags = 0

    def _tag(self) -> str:
        self.tags += 1
        return f"t{self.tags}"

    def _arm(self, r: int, fault: str | None) -> Runtime:
        CommandMachine.steps += 1
        runtime, log = self.runtimes[r]
        log.armed = [fault] if fault else []
        return runtime

    def _cls(self, r: int, aggregate_id: str) -> Any:
        return ledger_class(aggregate_id, self.schema[r])

    def _tags(self, aggregate_id: str) -> list[str]:
        return [tag for tag, _ in self.model.get(aggregate_id, [])]

    @contextmanager
    def _newer(self, r: int, aggregate_id: str) -> Iterator[None]:
        """A release-1 runtime may refuse a stream with release-2 events in it."""
        try:
            yield
        except SerializationError:
            stream = self.model.get(aggregate_id, [])
            assert self.schema[r] == 1 and any(schema == 2 for _, schema in stream)

    def _check(self, aggregate_id: str, ledger: Any, upto: int | None = None) -> None:
        stream = self._tags(aggregate_id)
        expected = tuple(stream if upto is None else stream[:upto])
        assert (ledger.version, ledger.tags) == (len(expected), expected)

    runtime = st.integers(0, 2)
    aggregate = st.sampled_from(IDS)
    fault = st.sampled_from((None, None, None, *MODES))

    @rule(r=runtime, aggregate_id=aggregate, fault=fault)
    def execute(self, r: int, aggregate_id: str, fault: str | None) -> None:
        runtime, tag = self._arm(r, fault), self._tag()
        with self._newer(r, aggregate_id):
            ledger = runtime.execute(
                self._cls(r, aggregate_id), aggregate_id, lambda a: a.enter(tag), create=True
            )
            self.model.setdefault(aggregate_id, []).append((tag, self.schema[r]))
            self._check(aggregate_id, ledger)

    @rule(r=runtime, aggregate_id=aggregate, cause=st.sampled_from(CAUSES), fault=fault)
    def issue(self, r: int, aggregate_id: str, cause: str, fault: str | None) -> None:
        runtime = self._arm(r, fault)
        with self._newer(r, aggregate_id):
            written = runtime.issue(
                self._cls(r, aggregate_id), aggregate_id, lambda a: a.enter(cause), caused_by=cause
            )
            if cause in self._tags(aggregate_id):
                assert written == []
            else:
                assert len(written) == 1
                self.model.setdefault(aggregate_id, []).append((cause, self.schema[r]))

    @rule(r=runtime, aggregate_id=aggregate)
    def hold(self, r: int, aggregate_id: str) -> None:
        """Load an aggregate to save later (by then, maybe stale)."""
        runtime = self._arm(r, None)
        cls = self._cls(r, aggregate_id)
        with self._newer(r, aggregate_id):
            try:
                ledger = runtime.load(cls, aggregate_id)
            except AggregateNotFoundError:
                assert not self.model.get(aggregate_id)
                ledger = cls(aggregate_id)
            self._check(aggregate_id, ledger)
            self.held[r, aggregate_id] = ledger, ledger.version

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data(), fault=fault)
    def save(self, data: st.DataObject, fault: str | None) -> None:
        r, aggregate_id = data.draw(st.sampled_from(sorted(self.held)))
        ledger, version = self.held.pop((r, aggregate_id))
        runtime, tag = self._arm(r, fault), self._tag()
        ledger.enter(tag)
        stream = self.model.setdefault(aggregate_id, [])
        if len(stream) != version:
            with pytest.raises(ConcurrencyError):
                runtime.save(ledger)
            return
        written = runtime.save(ledger)
        assert len(written) == 1 and ledger.pending_events == ()
        stream.append((tag, self.schema[r]))
        self.held[r, aggregate_id] = ledger, ledger.version  # saved: current again

    @rule(r=runtime, aggregate_id=aggregate, data=st.data())
    def load(self, r: int, aggregate_id: str, data: st.DataObject) -> None:
        runtime = self._arm(r, None)
        stream = self._tags(aggregate_id)
        version = data.draw(st.none() | st.integers(1, max(1, len(stream))))
        cls = self._cls(r, aggregate_id)
        if not stream:
            with pytest.raises(AggregateNotFoundError):
                runtime.load(cls, aggregate_id, version)
            return
        with self._newer(r, aggregate_id):
            self._check(aggregate_id, runtime.load(cls, aggregate_id, version), version)

    @rule(r=runtime, aggregate_id=aggregate)
    def load_as_of(self, r: int, aggregate_id: str) -> None:
        """Time travel to now sees every event; to the epoch, none."""
        runtime = self._arm(r, None)
        cls = self._cls(r, aggregate_id)
        with pytest.raises(AggregateNotFoundError):
            runtime.load(cls, aggregate_id, as_of=0)
        if self.model.get(aggregate_id):
            now = int(time.time() * 1000) + 1
            with self._newer(r, aggregate_id):
                self._check(aggregate_id, runtime.load(cls, aggregate_id, as_of=now))

    @rule(r=runtime, cache=st.sampled_from(CACHES), upgrade=st.booleans())
    def reopen(self, r: int, cache: int, upgrade: bool) -> None:
        """Close a runtime and open another with a stream cache of ``cache`` events; with
        ``upgrade``, on release 2 (``Entered`` v2, and an upcaster from v1)."""
        CommandMachine.steps += 1
        runtime, log = self.runtimes[r]
        runtime.close()
        log.close()
        if upgrade:
            self.schema[r] = 2
        self.runtimes[r] = open_runtime(self.data, cache, self.schema[r])
        self.held = {k: v for k, v in self.held.items() if k[0] != r}

    def teardown(self) -> None:
        try:
            for runtime, log in self.runtimes:
                runtime.close()
                log.close()
            streams = raw_streams(self.data)
            check_contiguous(streams)
            for aggregate_id, stream in self.model.items():
                stored = [(tag, schema) for _, tag, schema in streams.get(aggregate_id, [])]
                assert stored == stream, aggregate_id
        finally:
            shutil.rmtree(self.data, ignore_errors=True)
            CommandMachine.runs += 1
            if self.progress and CommandMachine.runs % self.progress == 0:
                print(f"model steps: {CommandMachine.steps}", file=sys.stderr, flush=True)


def _run_machine(examples: int, steps: int) -> int:
    CommandMachine.steps = 0
    run_state_machine_as_test(
        CommandMachine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    return CommandMachine.steps


def test_commands_from_several_runtimes_match_the_model() -> None:
    done = _run_machine(examples=12, steps=100)
    print(f"model steps: {done}", file=sys.stderr)
    assert done >= 1000


@pytest.mark.soak
@pytest.mark.timeout(4 * 3600)
def test_commands_from_several_runtimes_match_the_model_soak() -> None:
    started = time.monotonic()
    CommandMachine.progress = 50
    done = 0
    try:
        while done < SOAK_STEPS:  # Hypothesis ends some runs before their step count
            done += _run_machine(examples=max(1, (SOAK_STEPS - done) // 200), steps=200)
    finally:
        CommandMachine.progress = 0
    print(f"model steps: {done} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    assert done >= SOAK_STEPS


# ---------------------------------------------------------------------- several processes
def schema_of(seed: int, proc: int) -> int:
    """The release child ``proc`` runs: one in three still runs release 1."""
    return (2, 1, 2)[(seed + proc) % 3]


def _children(data: Path, seed: int, procs: int, steps: int) -> Iterator[list[str]]:
    """Run ``procs`` children of ``steps`` steps each, concurrently; their stdout lines."""
    children = []
    for proc in range(procs):
        args = {
            "data": str(data),
            "seed": seed * 100 + proc,
            "steps": steps,
            "proc": proc,
            "ids": list(IDS),
            "causes": list(CAUSES),
            "cache_events": (20_000, 40, 0)[(seed + proc) % 3],
            "schema": schema_of(seed, proc),
            "faults": True,
        }
        children.append(
            subprocess.Popen(
                [sys.executable, str(CHILD), json.dumps(args)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for child in children:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line == "R\n", (line, child.stderr.read() if child.stderr else "")
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    for child in children:
        try:
            out, err = child.communicate(timeout=60 + steps * 0.2)
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            raise AssertionError(f"child {child.pid} did not finish: {err[-3000:]}") from None
        assert child.returncode == 0, err[-3000:]
        yield out.splitlines()


def check_processes(data: Path, seed: int, procs: int, steps: int) -> dict[str, int]:
    """Run the children, then compare the model built from what they acknowledged with the
    raw topics. Returns counts of the lines seen by kind."""
    lines = [line for out in _children(data, seed, procs, steps) for line in out if line != "R"]
    streams = raw_streams(data)
    check_contiguous(streams)
    stored = {agg: [tag for _, tag, _ in events] for agg, events in streams.items()}
    for events in streams.values():
        for _, tag, schema in events:  # each release writes its own schema
            if tag.startswith("p"):
                assert schema == schema_of(seed, int(tag[1:].split("-")[0])), tag
    model: dict[str, dict[int, str]] = {}  # aggregate -> version -> tag acknowledged there
    issued: dict[str, set[str]] = {}
    refused: set[str] = set()
    unknown: set[str] = set()
    loads: list[tuple[str, int, tuple[str, ...]]] = []
    kinds: Multiset[str] = Multiset()
    for line in lines:
        kind, *rest = line.split(" ", 4)
        kinds[kind] += 1
        if kind == "A" and rest[0] != "issue":
            _, tag, aggregate_id, version = rest
            assert model.setdefault(aggregate_id, {}).setdefault(int(version), tag) == tag
        elif kind in "AN":
            _, tag, aggregate_id = rest[:3]
            issued.setdefault(aggregate_id, set()).add(tag)
        elif kind == "C" or (kind == "S" and "@" not in rest[0]):
            refused.add(rest[0])  # a save that conflicted, a command release 1 refused
        elif kind == "S":
            pass  # an issue release 1 refused: another process may have issued it
        elif kind == "E":
            unknown.add(rest[0])
        else:
            assert kind == "L", line
            aggregate_id, version = rest[0], int(rest[1])
            tags = tuple(rest[2].split(",")) if len(rest) > 2 else ()
            loads.append((aggregate_id, version, tags))
    for aggregate_id, by_version in model.items():
        for version, tag in by_version.items():
            assert stored[aggregate_id][version - 1] == tag, (aggregate_id, version, tag)
    for aggregate_id, tags in issued.items():
        assert tags <= set(stored[aggregate_id]), (aggregate_id, tags)
    acknowledged = {t for v in model.values() for t in v.values()}
    acknowledged |= {t for v in issued.values() for t in v}
    for aggregate_id, tags in stored.items():
        unacked = set(tags) - acknowledged - unknown
        assert not unacked, f"{aggregate_id}: stored, never acknowledged: {unacked}"
        assert not set(tags) & refused, f"{aggregate_id}: refused, yet stored"
    for aggregate_id, version, tags in loads:
        assert stored[aggregate_id][:version] == list(tags), (aggregate_id, version)
    return dict(kinds)


def test_commands_from_several_processes_match_the_model(tmp_path: Path) -> None:
    kinds = check_processes(tmp_path / "data", seed=0, procs=3, steps=400)
    print(f"process steps: {sum(kinds.values())} {kinds}", file=sys.stderr)
    assert kinds.get("A", 0) > 200 and kinds.get("C", 0) > 0 and kinds.get("L", 0) > 0


@pytest.mark.soak
@pytest.mark.timeout(4 * 3600)
def test_commands_from_several_processes_match_the_model_soak(tmp_path: Path) -> None:
    started = time.monotonic()
    procs, rounds, total = 3, 10, 0
    kinds: Multiset[str] = Multiset()
    steps = -(-SOAK_STEPS // (procs * rounds))  # each child's share, rounded up
    for seed in range(rounds):
        data = tmp_path / f"data-{seed}"
        kinds.update(check_processes(data, seed, procs, steps))
        total += steps * procs
        print(f"process steps: {total} {dict(kinds)}", file=sys.stderr, flush=True)
        shutil.rmtree(data)
    took = time.monotonic() - started
    print(f"process steps: {total} in {took:.0f} s {dict(kinds)}", file=sys.stderr)
    assert total >= SOAK_STEPS
