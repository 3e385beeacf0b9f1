"""The one error hierarchy of eventlane.

Every error the framework raises on purpose is a :class:`FrameworkError`. Errors carry the
coordinates of what went wrong as fields (``topic``, ``partition``, ``offset``, ``path``,
``position``), and subclass a builtin where one fits, so ``except ValueError`` still works for
callers that do not know eventlane::

    FrameworkError
    ├── ConfigError (ValueError)                bad argument, bad config key or value
    │   └── MissingRoleError                    the engine lacks a role of the log port
    ├── LogError
    │   ├── InvalidTopicError (ValueError)      topic name breaks Kafka's naming rule
    │   ├── TopicExistsError (FileExistsError)
    │   ├── UnknownTopicError (LookupError)
    │   ├── UnknownPartitionError (LookupError)
    │   ├── RecordTooLargeError (ValueError)
    │   ├── InvalidRecordError (ValueError)     e.g. a keyless record on a compacted topic
    │   ├── OffsetOutOfRangeError (IndexError)  below the low-water mark / above the LEO
    │   ├── CorruptRecordError                  CRC mismatch or malformed batch in durable data
    │   │   └── DataLossError                   acknowledged offsets missing (refuses to open)
    │   ├── PartitionReadOnlyError              an fsync failed: no more appends until reopened
    │   ├── PreconditionFailedError             a conditional append's check refused the write
    │   ├── LogUnavailableError               * no leader / replica cut off / read timed out:
    │   │                                       nothing was written
    │   ├── OutcomeUnknownError               ! a write was sent; it may or may not be stored
    │   └── ReadOnlyDataError (PermissionError) a read-only data directory, and this must write
    ├── ConsumerError
    │   ├── CommitFailedError                 * stale generation, evicted member, unowned partition
    │   ├── RebalanceInProgressError          *
    │   └── NoOffsetForPartitionError           auto_offset_reset="error" with no position
    ├── RuntimeClosedError (RuntimeError)       a call on a runtime closed or closing: not started
    ├── ConcurrencyError                      * expected version != actual version (a write
    │                                           conflict, not a rejected command)
    ├── DomainError                             a command rejected by the domain
    │   └── AggregateNotFoundError (LookupError)
    ├── AggregateError                          a bug in an aggregate class, not a rejected command
    │   ├── MissingApplyError (TypeError)       an event type with no @applies method
    │   └── StateMutationError (AttributeError) state assigned outside an apply method
    ├── SerializationError (ValueError)         carries type_name and version when known
    │   ├── UnknownEventTypeError
    │   │   └── NewerEventVersionError          a known type stored at a newer version: deploy
    │   │                                       the code that wrote it (workers wait for it)
    │   ├── UpcastError
    │   └── StaleSnapshotError                  snapshot schema version != the aggregate's
    ├── ProjectionError
    │   ├── FencedError                         a newer group generation owns the partition
    │   ├── ReadModelBusyError                * the database refused a statement for its own
    │   │                                       reasons (lock timeout, deadlock, cancel, full)
    │   └── ReadModelUnavailableError         ! a PostgreSQL read model's server unreachable
    └── ReplayError
        ├── MergeConflictError                  rows of one key from several partitions, no rule
        └── NoExecutorsError                  * a Spark job without an executor for too long

Every error says what the caller can do next, in one of three ways (:attr:`FrameworkError.kind`):

* ``*`` marks the *retriable* errors (``error.retriable`` is true, Kafka's flag): nothing was
  written, and the same call may succeed when retried, after a pause (the log unavailable),
  after reloading (a write conflict) or re-polling (a rebalance).
* ``!`` marks the *indeterminate* errors (``error.indeterminate`` is true): the outcome of a
  write is unknown. Never report it as refused nor as done, and never retry it blindly:
  re-read (an aggregate's stream, a key's head) to learn whether it landed, then decide.
* Every other error is *permanent* (``error.permanent``): the same call with the same input
  fails again: bad input (the ``ValueError`` ones), something not found (the
  ``LookupError`` ones), a fenced write (:class:`PreconditionFailedError`,
  :class:`FencedError`), damaged data, a missing role of the engine.

:meth:`FrameworkError.advice` says it in words; the CLI appends it to its message, the
Kafka listener maps the three kinds to Kafka's retriable and permanent error codes
(:mod:`eventlane.kafka.codes`) and ``execute`` retries or settles by them
(:mod:`eventlane.store.command`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar


class ErrorKind(enum.Enum):
    """What a caller can do about an error (see the module docstring)."""

    RETRIABLE = "retriable"
    INDETERMINATE = "indeterminate"
    PERMANENT = "permanent"


class FrameworkError(Exception):
    """Base class of every error eventlane raises on purpose.

    ``topic``, ``partition``, ``offset``, ``path`` and ``position`` name where the error
    happened, when known; ``str(error)`` includes them. ``retriable`` (a class attribute) is
    true when retrying the same operation may succeed.
    """

    retriable: ClassVar[bool] = False
    indeterminate: ClassVar[bool] = False
    retry_advice: ClassVar[str] = "a retry may succeed"
    """What :meth:`advice` says of a retriable error of this class."""

    def __init__(
        self,
        message: str,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
        path: str | Path | None = None,
        position: int | None = None,
    ) -> None:
        self.message = message
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.path = None if path is None else str(path)
        self.position = position
        super().__init__(self._render())

    @property
    def kind(self) -> ErrorKind:
        """Retriable, indeterminate or permanent (the module docstring)."""
        if self.indeterminate:
            return ErrorKind.INDETERMINATE
        return ErrorKind.RETRIABLE if self.retriable else ErrorKind.PERMANENT

    @property
    def permanent(self) -> bool:
        """Neither retriable nor indeterminate: the same call with the same input fails
        again."""
        return self.kind is ErrorKind.PERMANENT

    def advice(self) -> str:
        """What to do next, in words; empty for a permanent error (its message says what is
        wrong)."""
        if self.indeterminate:
            return "outcome unknown: it may or may not be stored; read it back before retrying"
        if self.retriable:
            return self.retry_advice
        return ""

    def _render(self) -> str:
        where = [
            f"{name}={value}"
            for name, value in (
                ("topic", self.topic),
                ("partition", self.partition),
                ("offset", self.offset),
                ("file", self.path),
                ("position", self.position),
            )
            if value is not None
        ]
        return f"{self.message} ({', '.join(where)})" if where else self.message


class ConfigError(FrameworkError, ValueError):
    """A bad argument or configuration value; nothing was created or changed."""


class MissingRoleError(ConfigError):
    """The log engine does not implement a role of the port (:mod:`eventlane.log.port`) that
    the caller needs: ``engine`` and ``role`` name them. Permanent: open the application on
    an engine that has the role."""

    def __init__(self, message: str, *, engine: str, role: str) -> None:
        self.engine = engine
        self.role = role
        super().__init__(message)


class LogError(FrameworkError):
    """An error of the log layer."""


class InvalidTopicError(LogError, ValueError):
    """A topic name breaks Kafka's rule: ``[a-zA-Z0-9._-]{1,249}``, not ``.`` or ``..``."""


class TopicExistsError(LogError, FileExistsError):
    """``create_topic`` on a name that already exists."""


class UnknownTopicError(LogError, LookupError):
    """The topic does not exist."""


class UnknownPartitionError(LogError, LookupError):
    """The partition number is outside ``[0, partitions)``."""


class RecordTooLargeError(LogError, ValueError):
    """A record's encoded size exceeds the topic's ``max_record_bytes``."""


class InvalidRecordError(LogError, ValueError):
    """A record the topic cannot accept (e.g. a null key on a compacted topic)."""


class OffsetOutOfRangeError(LogError, IndexError):
    """A fetch offset below the low-water mark or above the log end offset."""

    def __init__(
        self, message: str, *, topic: str, partition: int, offset: int, lwm: int, leo: int
    ) -> None:
        self.lwm = lwm
        self.leo = leo
        super().__init__(message, topic=topic, partition=partition, offset=offset)


class CorruptRecordError(LogError):
    """Durable data failed its CRC or is malformed. Never silently skipped or truncated."""


class DataLossError(CorruptRecordError):
    """Offsets that were acknowledged are missing from the log (a lost tail, a missing
    segment). The partition refuses to open rather than reuse them; the message names the
    range and the repair command, which skips the lost offsets (never reuses them)."""


class PartitionReadOnlyError(LogError):
    """A write to the partition's files failed to reach the disk (fsync/fdatasync error):
    nothing more is acknowledged until the partition is reopened and recovered."""


class PreconditionFailedError(LogError):
    """A conditional append's precondition refused the write; nothing was appended."""


class LogUnavailableError(LogError):
    """The engine cannot serve the request now: no leader for the partition, a replica cut
    off, a read that timed out, a connection lost before the request was sent. Nothing was
    written. Retriable: the same call may succeed once the engine recovers."""

    retriable = True
    retry_advice = "nothing was written; retry once the log is available"


class OutcomeUnknownError(LogError):
    """A write was sent but its outcome is unknown: it may or may not be stored (a timeout
    after the request left, a retried publish whose first copy is still being proposed).

    Neither refused nor done. Never retry it blindly (that may write twice): re-read what
    the write would have changed (an aggregate's stream, a key's head) and decide from what
    is stored. ``execute`` and ``save`` do this for aggregate appends."""

    indeterminate = True


class ReadOnlyDataError(LogError, PermissionError):
    """The data directory cannot be written (a read-only mount), and this needs to write.

    Reading (``topics list/describe``, ``consume``, ``dump``, ``verify``, ``project status``)
    works on a read-only directory; appending, committing offsets, compaction and recovery
    of a partition left by an unclean stop or an earlier boot do not."""


class ConsumerError(FrameworkError):
    """An error of the consumer layer."""


class CommitFailedError(ConsumerError):
    """A commit was rejected: stale generation, evicted member, or a partition not owned.
    Retriable: re-poll (rejoin) and commit again."""

    retriable = True
    retry_advice = "re-poll (rejoin the group) and commit again"


class RebalanceInProgressError(ConsumerError):
    """The group is rebalancing; re-poll to get the new assignment."""

    retriable = True
    retry_advice = "re-poll (rejoin the group) and try again"


class NoOffsetForPartitionError(ConsumerError):
    """No committed offset and ``auto_offset_reset="error"``."""


class DomainError(FrameworkError):
    """A command broke a domain invariant. User aggregates subclass this."""


class ConcurrencyError(FrameworkError):
    """Optimistic concurrency: the aggregate's stored version (or, for a conditional append
    on the log, the key's last offset: ``unit="last offset"``, ``None`` for "no record") is
    not the expected one. Nothing was written.

    A write conflict, not a rejected command: it is not a :class:`DomainError`. Retriable:
    reload the aggregate and run the command again (``execute`` and ``ctx.issue`` do)."""

    retriable = True
    retry_advice = "nothing was written; reload and run the command again"

    def __init__(
        self,
        message: str,
        *,
        expected: int | None,
        actual: int | None,
        unit: str = "version",
        topic: str | None = None,
        partition: int | None = None,
    ) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"{message}: expected {unit} {expected}, actual {actual}",
            topic=topic,
            partition=partition,
        )


class AggregateNotFoundError(DomainError, LookupError):
    """No events are stored for the aggregate id."""


class AggregateError(FrameworkError):
    """An aggregate class or instance was misused: a bug to fix, not a command to reject."""


class MissingApplyError(AggregateError, TypeError):
    """An aggregate was given an event type that none of its ``@applies`` methods handles."""


class StateMutationError(AggregateError, AttributeError):
    """An aggregate's state was assigned outside an apply method (or ``init_state``)."""


class SerializationError(FrameworkError, ValueError):
    """An event could not be encoded or decoded.

    ``type_name`` and ``version`` name the event type and schema version involved, when
    known; ``str(error)`` includes them next to the record's coordinates.
    """

    def __init__(
        self,
        message: str,
        *,
        type_name: str | None = None,
        version: int | None = None,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
        path: str | Path | None = None,
        position: int | None = None,
    ) -> None:
        self.type_name = type_name
        self.version = version
        super().__init__(
            message, topic=topic, partition=partition, offset=offset, path=path, position=position
        )

    def _render(self) -> str:
        rendered = super()._render()
        what = ", ".join(
            f"{name}={value}"
            for name, value in (("type", self.type_name), ("version", self.version))
            if value is not None
        )
        if not what:
            return rendered
        if rendered == self.message:
            return f"{self.message} ({what})"
        # rendered is "<message> (<coordinates>)": put type and version first.
        return f"{self.message} ({what}, {rendered[len(self.message) + 2 :]}"


class UnknownEventTypeError(SerializationError):
    """An event type name or schema version with no registered class or upcaster."""


class NewerEventVersionError(UnknownEventTypeError):
    """An event type this code knows, stored at a schema version newer than its class's
    (``known_version``): written by newer code. Projection workers wait at such a record
    for a worker that knows it instead of dead-lettering it (issue 32)."""

    def __init__(self, message: str, *, known_version: int, **kwargs: Any) -> None:
        self.known_version = known_version
        super().__init__(message, **kwargs)


class UpcastError(SerializationError):
    """An upcaster chain is invalid or failed."""


class StaleSnapshotError(SerializationError):
    """A snapshot was written under another ``snapshot_version``: ignore it and rebuild."""


class RuntimeClosedError(FrameworkError, RuntimeError):
    """A call on a runtime that is closed, or closing: it was not started, nothing of it was
    written. Calls already in flight when ``close()`` began run to their end first."""


class ProjectionError(FrameworkError):
    """A projector or its read model failed."""


class ReadModelBusyError(ProjectionError):
    """The read model's database refused a handler's statement for a reason of its own, not
    the handler's: a lock wait that timed out (another session's ``LOCK TABLE``, ``ALTER``,
    ``CREATE INDEX``), a deadlock, a serialization failure, a statement cancelled by an
    operator, a full disk, SQLite's busy or I/O errors. The batch's transaction was rolled
    back (none of its effects, positions or dead letters were kept) and the event is not
    dead-lettered: it is not poison. Retriable: the worker applies the batch again from the
    stored positions after a pause."""

    retriable = True
    retry_advice = "nothing of the batch was kept; apply it again after a pause"


class ReadModelUnavailableError(ProjectionError):
    """A read model's database server (PostgreSQL) could not be reached, or the connection
    broke. The transaction in hand may or may not have committed: its positions were (or
    were not) committed with it, so a worker that starts again reads them and applies
    exactly what is missing. Never assume either outcome: re-read the positions."""

    indeterminate = True


class WaitTimeoutError(ProjectionError, TimeoutError):
    """A wait for a projection (read-your-writes, a causal wait) ran out of time before the
    projection reached the position; nothing is wrong with what was written. Waiting again
    may succeed."""

    retriable = True


class InvalidPositionError(FrameworkError, ValueError):
    """A position token could not be parsed (not one this version wrote, or damaged), or
    it names a topic, partition or offset this log never had."""


class ReplayError(FrameworkError):
    """A rebuild of a projection failed."""


class FencedError(ProjectionError):
    """The worker's generation is older than the one stored for a partition: it lost it."""


class MergeConflictError(ReplayError):
    """Rows of one key came from several partitions and the table has no rule that merges
    them (or a ``same`` column disagrees). ``table`` and ``key`` name the row."""

    def __init__(self, message: str, *, table: str, key: Mapping[str, Any], **where: Any) -> None:
        self.table = table
        self.key = dict(key)
        super().__init__(message, **where)


class NoExecutorsError(ReplayError):
    """A rebuild's Spark job had no executor for ``EVENTLANE_SPARK_EXECUTOR_WAIT`` seconds
    (:mod:`eventlane.replay.executors`): it was stopped; nothing of the live read model was
    written."""

    retriable = True
    retry_advice = "run the rebuild again once the cluster has a worker with free cores"


def error_chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and the errors behind it, nearest first: its ``error`` attribute where it
    wraps one (as the projection applier wraps a handler's or a decoder's failure), else
    what it was raised from or during. Each error once (a cycle ends the chain)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        yield exc
        seen.add(id(exc))
        inner = getattr(exc, "error", None)
        exc = inner if isinstance(inner, BaseException) else (exc.__cause__ or exc.__context__)
