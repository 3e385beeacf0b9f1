"""Kafka error codes for eventlane's errors, taken from ``kafka.errors`` (kafka-python's copy
of Kafka's ``org.apache.kafka.common.protocol.Errors``).

Invariant: the code a client receives tells it what eventlane's error told the listener.
An error that a retry can fix (``retriable``: nothing was written, e.g.
:class:`~eventlane.errors.LogUnavailableError`) maps to a code clients retry
(KAFKA_STORAGE_ERROR, COORDINATOR_NOT_AVAILABLE for group offsets); a write whose outcome is
unknown (``indeterminate``: :class:`~eventlane.errors.OutcomeUnknownError`) maps to
REQUEST_TIMED_OUT, which Kafka's clients also treat as "may or may not be stored" (an
idempotent producer's retry is then deduplicated by its sequence numbers). Permanent errors
map to the permanent code Kafka would give; UNKNOWN_SERVER_ERROR is left for bugs.
"""

from __future__ import annotations

from kafka import errors as Errors  # noqa: N812  (kafka-python's own spelling)

from eventlane.errors import (
    CommitFailedError,
    ConfigError,
    CorruptRecordError,
    FrameworkError,
    InvalidRecordError,
    InvalidTopicError,
    OffsetOutOfRangeError,
    PartitionReadOnlyError,
    PreconditionFailedError,
    ReadOnlyDataError,
    RebalanceInProgressError,
    RecordTooLargeError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
)

__all__ = ["Errors", "errno", "error_for", "group_error_for"]


def errno(error: type[Errors.BrokerResponseError]) -> int:
    """The wire code of one of ``kafka.errors``' classes."""
    return int(error.errno)


_PERMANENT: tuple[tuple[type[BaseException], type[Errors.BrokerResponseError]], ...] = (
    (UnknownTopicError, Errors.UnknownTopicOrPartitionError),
    (UnknownPartitionError, Errors.UnknownTopicOrPartitionError),
    (OffsetOutOfRangeError, Errors.OffsetOutOfRangeError),
    (RecordTooLargeError, Errors.MessageSizeTooLargeError),
    (InvalidTopicError, Errors.InvalidTopicError),
    (TopicExistsError, Errors.TopicAlreadyExistsError),
    (InvalidRecordError, Errors.InvalidRecordError),
    (ConfigError, Errors.InvalidConfigurationError),
    (ReadOnlyDataError, Errors.PolicyViolationError),
    # a conditional write the listener's request asked for was refused: nothing written
    (PreconditionFailedError, Errors.InvalidRequestError),
    (CommitFailedError, Errors.RebalanceInProgressError),
    (RebalanceInProgressError, Errors.RebalanceInProgressError),
    # the stored data cannot be read as written, or the partition was set read-only after
    # such a finding: Kafka's answer for a log directory it cannot serve
    (CorruptRecordError, Errors.KafkaStorageError),
    (PartitionReadOnlyError, Errors.KafkaStorageError),
)


def error_for(exc: BaseException) -> int:
    """The Kafka error code for ``exc`` raised while serving a partition or topic."""
    if isinstance(exc, FrameworkError):
        if exc.indeterminate:
            return errno(Errors.RequestTimedOutError)
        for cls, kafka_error in _PERMANENT:
            if isinstance(exc, cls):
                return int(kafka_error.errno)
        if exc.retriable:
            return errno(Errors.KafkaStorageError)
        return errno(Errors.UnknownError)
    if isinstance(exc, OSError):  # the disk under the log: Kafka's offline log directory
        return errno(Errors.KafkaStorageError)
    return errno(Errors.UnknownError)


def group_error_for(exc: BaseException) -> int:
    """The code for ``exc`` raised by the group coordinator's offset store: a retriable or
    unknown-outcome failure is COORDINATOR_NOT_AVAILABLE (clients look the coordinator up
    again and retry the commit, which is idempotent)."""
    if isinstance(exc, FrameworkError) and (exc.retriable or exc.indeterminate):
        return errno(Errors.CoordinatorNotAvailableError)
    if isinstance(exc, OSError):
        return errno(Errors.CoordinatorNotAvailableError)
    return error_for(exc)
