"""The error tree: the retriable flag, and a write conflict is not a rejected command."""

from __future__ import annotations

import inspect

import eventlane.errors as errors
from eventlane.errors import (
    CommitFailedError,
    ConcurrencyError,
    DomainError,
    FencedError,
    FrameworkError,
    LogUnavailableError,
    MergeConflictError,
    NoExecutorsError,
    OutcomeUnknownError,
    RebalanceInProgressError,
    WaitTimeoutError,
)


def test_retriable_errors_are_exactly_the_retry_cases() -> None:
    classes = [
        c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, FrameworkError)
    ]
    retriable = {c for c in classes if c.retriable}
    assert retriable == {
        ConcurrencyError,
        CommitFailedError,
        RebalanceInProgressError,
        LogUnavailableError,
        WaitTimeoutError,  # a read model behind a position: waiting again may succeed
        NoExecutorsError,  # a Spark cluster without a free worker: it may have one later
        errors.ReadModelBusyError,  # a lock timeout, a deadlock: the batch is applied again
    }
    conflict = ConcurrencyError("stale", expected=1, actual=2, topic="t")
    assert conflict.retriable and not FrameworkError("x").retriable


def test_an_unknown_outcome_is_neither_retriable_nor_permanent() -> None:
    classes = [
        c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, FrameworkError)
    ]
    # a log write's unknown outcome, and a read-model transaction's (PostgreSQL connection lost)
    assert {c for c in classes if c.indeterminate} == {
        OutcomeUnknownError,
        errors.ReadModelUnavailableError,
    }
    unknown = OutcomeUnknownError("publish timed out", topic="t", partition=0)
    assert unknown.indeterminate and not unknown.retriable
    assert not FrameworkError("x").indeterminate


def test_a_write_conflict_is_not_a_domain_error() -> None:
    assert not issubclass(ConcurrencyError, DomainError)
    try:
        raise ConcurrencyError("stale", expected=1, actual=2)
    except DomainError:  # pragma: no cover - the point of the test
        raise AssertionError("except DomainError swallowed a write conflict") from None
    except FrameworkError as err:
        assert "expected version 1, actual 2" in str(err)


def test_every_public_error_lives_in_errors_and_old_paths_still_import() -> None:
    from eventlane.projection import FencedError as fenced  # noqa: PLC0415
    from eventlane.replay import MergeConflictError as merge  # noqa: PLC0415

    assert fenced is FencedError and merge is MergeConflictError
    assert FencedError.__module__ == MergeConflictError.__module__ == "eventlane.errors"
    err = MergeConflictError("clash", table="t", key={"id": 1}, topic="orders")
    assert (err.table, err.key, err.topic) == ("t", {"id": 1}, "orders")


def test_every_error_is_of_one_kind_and_says_what_to_do() -> None:
    """Retriable, indeterminate or permanent: exactly one, from the class flags; the CLI
    line of a retriable or indeterminate error ends with what to do, a permanent one's not."""
    from eventlane.cli import error_message  # noqa: PLC0415
    from eventlane.errors import (  # noqa: PLC0415
        ErrorKind,
        InvalidRecordError,
        MissingRoleError,
        PreconditionFailedError,
        UnknownTopicError,
    )

    classes = [
        c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, FrameworkError)
    ]
    for cls in classes:
        assert not (cls.retriable and cls.indeterminate), cls
    unavailable = LogUnavailableError("no leader", topic="t", partition=0)
    unknown = OutcomeUnknownError("publish timed out", topic="t", partition=0)
    conflict = ConcurrencyError("stale", expected=1, actual=2)
    assert (unavailable.kind, unknown.kind, conflict.kind) == (
        ErrorKind.RETRIABLE,
        ErrorKind.INDETERMINATE,
        ErrorKind.RETRIABLE,
    )
    assert error_message(unavailable).endswith(
        "[retriable: nothing was written; retry once the log is available]"
    )
    assert "[indeterminate: outcome unknown: it may or may not be stored" in error_message(unknown)
    assert "reload and run the command again" in error_message(conflict)
    permanent = [
        UnknownTopicError("no such topic", topic="t"),  # not found
        InvalidRecordError("keyless record on a compacted topic", topic="t"),  # bad input
        PreconditionFailedError("fenced", topic="t", partition=0),  # fenced
        FencedError("a newer generation owns it"),
        MissingRoleError("no keyed reads", engine="E", role="KeyedLog"),
    ]
    for err in permanent:
        assert err.permanent and err.kind is ErrorKind.PERMANENT and err.advice() == ""
        assert error_message(err) == str(err)
