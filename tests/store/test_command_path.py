"""The command path (``execute``, ``issue``, ``save``) against a stream another writer moved
since this runtime cached it, and against appends whose outcome is unknown.

Defect 1 of issue 26: ``issue`` decided on the stale cached stream on every attempt
(``ConcurrencyError: expected version 1, actual 6``) where ``execute`` recovered."""

from __future__ import annotations

from pathlib import Path

import pytest
from model_app import MODES, Ledger, open_runtime, raw_ledgers
from store_domain import Counter, make_app
from store_helpers import finish, read_line, send, spawn

from eventlane.app import Runtime
from eventlane.errors import (
    AggregateNotFoundError,
    ConcurrencyError,
    LogUnavailableError,
    OutcomeUnknownError,
)


def _increment(counter: Counter) -> None:
    counter.increment(1, "here")


def test_issue_after_another_runtime_wrote(data_dir: Path) -> None:
    with make_app(data_dir) as a, make_app(data_dir) as b:
        a.issue(Counter, "x", _increment, caused_by="cause-1")  # a caches x at v1
        for _ in range(5):
            b.execute(Counter, "x", _increment)  # b moves x to v6
        written = a.issue(Counter, "x", _increment, caused_by="cause-2", attempts=3)
        assert len(written) == 1
        assert a.load(Counter, "x").version == 7
        assert a.issue(Counter, "x", _increment, caused_by="cause-2") == []  # once


def test_issue_after_another_process_wrote(data_dir: Path) -> None:
    with make_app(data_dir) as a:
        a.issue(Counter, "x", _increment, caused_by="cause-1")
        child = spawn("execute", data=str(data_dir), aggregate="x", count=5, writer="child")
        assert read_line(child) == "R"
        send(child, "go")
        assert read_line(child).startswith("D ")
        finish(child)
        a.issue(Counter, "x", _increment, caused_by="cause-2", attempts=3)
        counter = a.load(Counter, "x")
        assert (counter.version, counter.value) == (7, 7)


def test_execute_and_save_after_another_runtime_wrote(data_dir: Path) -> None:
    with make_app(data_dir) as a, make_app(data_dir) as b:
        a.execute(Counter, "y", _increment, create=True)
        b.execute(Counter, "y", _increment)
        assert a.execute(Counter, "y", _increment, attempts=2).version == 3
        b.execute(Counter, "y", _increment)
        stale = a.load(Counter, "y")
        assert stale.version == 4


# ---------------------------------------------------------------- appends of unknown outcome
OPS = ("execute", "issue", "save")


def _command(runtime: Runtime, op: str, aggregate_id: str, tag: str) -> int:
    """One command that enters ``tag`` the way ``op`` runs it; the offset of its record."""
    if op == "execute":
        ledger = runtime.execute(Ledger, aggregate_id, lambda a: a.enter(tag), create=True)
        assert ledger._stored_offset is not None
        return ledger._stored_offset
    if op == "issue":
        written = runtime.issue(Ledger, aggregate_id, lambda a: a.enter(tag), caused_by=tag)
    else:
        try:
            ledger = runtime.load(Ledger, aggregate_id)
        except AggregateNotFoundError:
            ledger = Ledger(aggregate_id)
        ledger.enter(tag)
        written = runtime.save(ledger)
        assert ledger.pending_events == ()
    assert len(written) == 1
    return written[0].offset


def _stream(data: Path, aggregate_id: str) -> list[tuple[int, str, int]]:
    """``(version, tag, offset)`` of the aggregate's events, read raw from the log."""
    return [
        (e.version, e.tag, e.offset) for e in raw_ledgers(data) if e.aggregate_id == aggregate_id
    ]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", OPS)
def test_an_append_of_unknown_outcome_takes_effect_once(data_dir: Path, op: str, mode: str) -> None:
    """Stored or not, landing now or later, or refused for want of a leader: the command
    takes effect once and returns the position of its record. (With the cache off, and
    interleaved with other runtimes: tests/store/test_command_model.py.)"""
    runtime, log = open_runtime(data_dir, 1000)
    with runtime:
        _command(runtime, op, "l", "first")
        log.armed = [mode] * (2 if mode == "unavailable" else 1)
        second = _command(runtime, op, "l", "second")
        assert (log.armed, log.injected) == ([], 2 if mode == "unavailable" else 1)
        _command(runtime, op, "l", "third")
        assert runtime.load(Ledger, "l").tags == ("first", "second", "third")
    log.close()
    stream = _stream(data_dir, "l")
    assert [(v, tag) for v, tag, _ in stream] == [(1, "first"), (2, "second"), (3, "third")]
    assert stream[1][2] == second


@pytest.mark.parametrize("op", OPS)
def test_an_append_that_lands_between_the_look_for_it_and_the_next_decision(
    data_dir: Path, op: str
) -> None:
    """The lost append is not in the log when the command looks for it, and lands before the
    command decides again (seen on a JetStream cluster whose stream leader was cut off: 'a
    command's event was stored twice'): the new decision must not be appended on top of it."""
    runtime, log = open_runtime(data_dir, 1000)
    with runtime:
        _command(runtime, op, "l", "first")
        log.armed = ["racing"]
        second = _command(runtime, op, "l", "second")
        assert (log.armed, log.injected) == ([], 1)
        assert runtime.load(Ledger, "l").tags == ("first", "second")
    log.close()
    stream = _stream(data_dir, "l")
    assert [(v, tag) for v, tag, _ in stream] == [(1, "first"), (2, "second")]
    assert stream[1][2] == second


def test_an_issue_of_unknown_outcome_is_not_issued_again(data_dir: Path) -> None:
    runtime, log = open_runtime(data_dir, 1000)
    with runtime:
        log.armed = ["stored"]
        written = runtime.issue(Ledger, "l", lambda a: a.enter("x"), caused_by="cause")
        assert len(written) == 1
        assert runtime.issue(Ledger, "l", lambda a: a.enter("x"), caused_by="cause") == []
    log.close()
    assert [v for v, _, _ in _stream(data_dir, "l")] == [1]


@pytest.mark.parametrize("op", OPS)
def test_an_outcome_the_log_cannot_tell_is_reported_unknown(data_dir: Path, op: str) -> None:
    """The append lands after the client gave up on it, and every read back fails: neither
    done nor refused, whatever the command."""
    runtime, log = open_runtime(data_dir, 1000)
    with runtime:
        _command(runtime, op, "l", "first")
        ledger = runtime.load(Ledger, "l")
        ledger.enter("second")
        log.armed, log.blind = ["late"], 1_000
        with pytest.raises(OutcomeUnknownError):
            if op == "execute":
                runtime.execute(Ledger, "l", lambda a: a.enter("second"), attempts=3)
            elif op == "issue":
                runtime.issue(Ledger, "l", lambda a: a.enter("second"), caused_by="c", attempts=3)
            else:
                runtime.save(ledger)
        log.blind = 0
        assert runtime.load(Ledger, "l").tags == ("first", "second")  # it landed after all
    log.close()


def test_a_save_whose_lost_append_was_overtaken_is_a_conflict(data_dir: Path) -> None:
    """A lost append, then another writer takes the version: the save's events can never
    land, so it is a plain conflict."""
    runtime, log = open_runtime(data_dir, 1000)
    other, other_log = open_runtime(data_dir, 1000)
    with runtime, other:
        _command(runtime, "save", "l", "first")
        ledger = runtime.load(Ledger, "l")
        ledger.enter("mine")
        log.armed = ["lost"]
        log.on_fault = lambda: other.execute(Ledger, "l", lambda a: a.enter("theirs"))
        with pytest.raises(ConcurrencyError):
            runtime.save(ledger)
        assert runtime.load(Ledger, "l").tags == ("first", "theirs")
    log.close()
    other_log.close()


def test_execute_waits_out_an_unavailable_log_within_its_attempts(data_dir: Path) -> None:
    runtime, log = open_runtime(data_dir, 1000)
    with runtime:
        log.armed = ["unavailable"] * 3
        assert runtime.execute(Ledger, "l", lambda a: a.enter("x"), create=True).version == 1
        log.armed = ["unavailable"] * 3
        with pytest.raises(LogUnavailableError):
            runtime.execute(Ledger, "l", lambda a: a.enter("y"), attempts=3)
        assert runtime.load(Ledger, "l").tags == ("x",)
    log.close()


def test_a_command_that_fails_after_an_unknown_outcome_is_reported_unknown(
    data_dir: Path,
) -> None:
    """The first append's outcome is unknown and not readable in the log yet; the retry's
    command raises: the first append may still land, so the caller hears "unknown"."""
    runtime, log = open_runtime(data_dir, 1000)
    runs = 0

    def once_then_refuse(ledger: Ledger) -> None:
        nonlocal runs
        runs += 1
        if runs > 1:
            raise ValueError("refused on retry")
        ledger.enter("x")

    with runtime:
        log.armed = ["lost"]
        with pytest.raises(OutcomeUnknownError):
            runtime.execute(Ledger, "l", once_then_refuse, create=True)
    log.close()
