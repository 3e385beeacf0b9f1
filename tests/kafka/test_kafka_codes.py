"""The Kafka error code for each eventlane error: clients retry exactly what a retry can fix
(eventlane's ``retriable`` and ``indeterminate`` flags against ``kafka.errors``' own
``retriable`` flag), and nothing but a bug is UNKNOWN_SERVER_ERROR."""

from __future__ import annotations

import inspect

import kafka.errors as kerr
import pytest

import eventlane.errors as fe
from eventlane.kafka.codes import error_for, group_error_for

ERRORS = [
    cls
    for _, cls in inspect.getmembers(fe, inspect.isclass)
    if issubclass(cls, fe.LogError) and cls is not fe.LogError
]


def _make(cls: type[fe.FrameworkError]) -> fe.FrameworkError:
    return cls.__new__(cls)  # the code depends on the class only


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__name__)
def test_log_errors_map_to_codes_clients_retry_as_eventlane_says(cls) -> None:
    code = error_for(_make(cls))
    kafka_error = kerr.for_code(code)
    assert code != kerr.UnknownError.errno, cls
    if cls.indeterminate:
        assert kafka_error is kerr.RequestTimedOutError  # may be stored: Kafka's timeout
    elif cls.retriable:
        assert kafka_error.retriable, (cls, kafka_error)
    group_code = kerr.for_code(group_error_for(_make(cls)))
    if cls.retriable or cls.indeterminate:
        assert group_code is kerr.CoordinatorNotAvailableError


def test_named_errors_and_bugs() -> None:
    assert error_for(_make(fe.UnknownTopicError)) == kerr.UnknownTopicOrPartitionError.errno
    assert error_for(_make(fe.InvalidTopicError)) == kerr.InvalidTopicError.errno
    assert error_for(_make(fe.LogUnavailableError)) == kerr.KafkaStorageError.errno
    assert error_for(_make(fe.OutcomeUnknownError)) == kerr.RequestTimedOutError.errno
    assert error_for(OSError(28, "No space left on device")) == kerr.KafkaStorageError.errno
    assert error_for(KeyError("a bug")) == kerr.UnknownError.errno
