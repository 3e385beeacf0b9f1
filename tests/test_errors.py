"""The error tree: the retriable flag, and a write conflict is not a rejected command."""

from __future__ import annotations

import inspect

import framework.errors as errors
from framework.errors import (
    CommitFailedError,
    ConcurrencyError,
    DomainError,
    FencedError,
    FrameworkError,
    LogUnavailableError,
    MergeConflictError,
    OutcomeUnknownError,
    RebalanceInProgressError,
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
    }
    conflict = ConcurrencyError("stale", expected=1, actual=2, topic="t")
    assert conflict.retriable and not FrameworkError("x").retriable


def test_an_unknown_outcome_is_neither_retriable_nor_permanent() -> None:
    classes = [
        c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, FrameworkError)
    ]
    assert {c for c in classes if c.indeterminate} == {OutcomeUnknownError}
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
    from framework.projection import FencedError as fenced  # noqa: PLC0415
    from framework.replay import MergeConflictError as merge  # noqa: PLC0415

    assert fenced is FencedError and merge is MergeConflictError
    assert FencedError.__module__ == MergeConflictError.__module__ == "framework.errors"
    err = MergeConflictError("clash", table="t", key={"id": 1}, topic="orders")
    assert (err.table, err.key, err.topic) == ("t", {"id": 1}, "orders")
