"""The aggregate base class: command methods record events, apply methods change state.

An aggregate is a consistency boundary identified by ``id`` (the log record key). Its state
is the fold of its events, in order, through its apply methods::

    >>> from attrs import frozen
    >>> from eventlane.domain.events import DomainEvent, event
    >>> @event("Deposited")
    ... @frozen
    ... class Deposited(DomainEvent):
    ...     amount: int
    >>> class Account(Aggregate):
    ...     topic: ClassVar[str] = "accounts"
    ...     balance: int
    ...
    ...     def init_state(self) -> None:
    ...         self.balance = 0
    ...
    ...     def deposit(self, amount: int) -> None:
    ...         if amount <= 0:
    ...             raise ValueError("amount must be positive")
    ...         self.record_that(Deposited(amount))
    ...
    ...     @applies(Deposited)
    ...     def _deposited(self, event: Deposited) -> None:
    ...         self.balance += event.amount
    >>> account = Account("acc-1")
    >>> account.deposit(5); account.deposit(7)
    >>> (account.balance, account.version, account.committed_version)
    (12, 2, 0)
    >>> Account.rehydrate("acc-1", account.pending_events).balance
    12

Invariants:

* ``version`` is the number of events applied: 0 for a new aggregate, and event *n* (1, 2,
  3, …) of the history has aggregate version *n*. ``committed_version`` is ``version``
  minus the pending events; it is the expected version for the next conditional append.
* Public state (attributes not starting with ``_``) is assigned only inside
  :meth:`Aggregate.init_state` and apply methods; any other assignment raises
  :class:`~eventlane.errors.StateMutationError`. (In-place mutation of a list held in
  state cannot be intercepted; do that only in apply methods too.)
* Each event class has at most one apply method per aggregate class (subclasses may
  override a parent's); dispatch is on the event's exact class. An event with no apply
  method raises :class:`~eventlane.errors.MissingApplyError`.
* Apply methods must not fail and must not record events: check invariants in command
  methods, before calling :meth:`Aggregate.record_that`.
* Rehydrating from the events (or from a snapshot plus the later events) yields the same
  state as the live object that recorded them.
"""

from __future__ import annotations

import copy
import inspect
import typing
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, overload

from eventlane.domain.dispatch import collect_marked, mark

if TYPE_CHECKING:
    from eventlane.log.position import Position
from eventlane.domain.events import DomainEvent
from eventlane.domain.snapshot import Snapshot
from eventlane.errors import ConfigError, MissingApplyError, StaleSnapshotError, StateMutationError

__all__ = ["Aggregate", "applies"]

A = TypeVar("A", bound="Aggregate")
E = TypeVar("E", bound=DomainEvent)
ApplyMethod = Callable[[A, E], None]

_APPLIES_ATTR = "__eventlane_applies__"


@overload
def applies(event_cls: type[E], /) -> Callable[[ApplyMethod[A, E]], ApplyMethod[A, E]]: ...
@overload
def applies(method: ApplyMethod[A, E], /) -> ApplyMethod[A, E]: ...
def applies(target: Any, /) -> Any:
    """Mark an aggregate method as the apply method of an event class: ``@applies`` takes
    it from the annotation of the method's event parameter, ``@applies(EventClass)`` names it
    (see :mod:`eventlane.domain.dispatch`).

    The method takes the event and mutates ``self``; it is collected when the aggregate
    class is created. Two methods of one class for the same event class are an error.
    """
    return mark(target, _APPLIES_ATTR, "@applies")


class Aggregate:
    """Base class of event-sourced aggregates. See the module docstring for the rules.

    Class-level configuration (``ClassVar``):

    * ``topic``: the log topic holding this aggregate's events (required), given as a class
      keyword (``class Account(Aggregate, topic="accounts")``) or as a ``ClassVar``;
    * ``snapshot_every``: take a snapshot every N events (``None``: never);
    * ``snapshot_version``: schema version of the snapshot state; bump it whenever the
      state attributes change meaning, so stored snapshots of the old shape are ignored.

    State attributes are declared as annotations on the subclass (``balance: int``) and
    given initial values in :meth:`init_state`; :meth:`state_fields` lists them.
    """

    topic: ClassVar[str]
    snapshot_every: ClassVar[int | None] = None
    snapshot_version: ClassVar[int] = 1
    snapshot_subject: ClassVar[str | None] = None
    """Whose personal data the state may hold: a state attribute naming the subject, or
    ``"id"`` (the aggregate itself). With a key store, snapshots of such an aggregate are
    encrypted under that subject's key, so forgetting the subject also erases them."""

    _appliers: ClassVar[Mapping[type[DomainEvent], Callable[[Any, Any], None]]] = MappingProxyType(
        {}
    )
    _state_fields: ClassVar[Mapping[str, Any] | None] = None

    _id: str
    _version: int
    _pending: list[DomainEvent]
    _mutable: bool
    _stored_offset: int | None = None
    """Log offset of the last stored event this object was built from or saved (set by the
    repository; ``None`` when unknown): the expected offset of the next conditional append."""
    _position: Any = None  # a eventlane.log.position.Position (annotated loosely: cattrs
    # and attrs resolve class annotations at run time, and the domain imports no log type)

    @property
    def stored_position(self) -> Position | None:
        """Where this object's stored state ends on the log (set by the repository when it
        loads or saves it; ``None`` when unknown): after ``execute``, the position to wait
        for (``runtime.wait_for(projector, order.stored_position)``; its ``token`` for a
        client)."""
        position: Position | None = self._position
        return position

    def __init_subclass__(cls, *, topic: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if topic is not None:
            if not isinstance(topic, str) or not topic:
                raise ConfigError(f"{cls.__qualname__}: topic must be a non-empty string")
            cls.topic = topic
        cls._appliers = MappingProxyType(collect_marked(cls, _APPLIES_ATTR, "apply", cls._appliers))
        cls._state_fields = None
        every = cls.__dict__.get("snapshot_every")
        if every is not None and (
            isinstance(every, bool) or not isinstance(every, int) or every < 1
        ):
            raise ConfigError(f"{cls.__qualname__}.snapshot_every must be None or an int >= 1")

    def __init__(self, id: str) -> None:
        if not isinstance(id, str) or not id:
            raise ConfigError(f"aggregate id must be a non-empty string, got {id!r}")
        object.__setattr__(self, "_id", id)
        object.__setattr__(self, "_version", 0)
        object.__setattr__(self, "_pending", [])
        object.__setattr__(self, "_mutable", True)
        try:
            self.init_state()
        finally:
            object.__setattr__(self, "_mutable", False)

    def init_state(self) -> None:
        """Assign the initial state of a new aggregate (override; default: nothing)."""

    def __setattr__(self, name: str, value: object) -> None:
        if not self._mutable and not name.startswith("_"):
            raise StateMutationError(
                f"{type(self).__qualname__}.{name} may only be assigned in init_state() or an "
                "apply method: record an event instead"
            )
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if not self._mutable and not name.startswith("_"):
            raise StateMutationError(
                f"{type(self).__qualname__}.{name} may only be deleted in an apply method"
            )
        object.__delattr__(self, name)

    def __repr__(self) -> str:
        return f"{type(self).__qualname__}(id={self._id!r}, version={self._version})"

    # -- identity and version -------------------------------------------------------------

    @property
    def id(self) -> str:
        """The aggregate id; the record key of all its events."""
        return self._id

    @property
    def version(self) -> int:
        """Number of events applied, pending ones included (0 for a new aggregate)."""
        return self._version

    @property
    def committed_version(self) -> int:
        """``version`` before the pending events: the expected version for the next save."""
        return self._version - len(self._pending)

    @property
    def pending_events(self) -> tuple[DomainEvent, ...]:
        """Events recorded but not yet saved, oldest first.

        The i-th (0-based) has aggregate version ``committed_version + i + 1``.
        """
        return tuple(self._pending)

    def mark_committed(self) -> None:
        """Forget the pending events once the store has appended them."""
        self._pending.clear()

    # -- recording and applying -----------------------------------------------------------

    def record_that(self, event: DomainEvent) -> None:
        """Apply ``event`` to this aggregate and append it to the pending events.

        Call it from command methods, after checking invariants. If the apply method
        raises, the event is not recorded.
        """
        if self._mutable:
            raise StateMutationError(
                f"{type(self).__qualname__}: record_that() called from init_state() or an "
                "apply method; apply methods must not record events"
            )
        self._apply(event)
        self._pending.append(event)

    def _apply(self, event: DomainEvent) -> None:
        applier = self._appliers.get(type(event))
        if applier is None:
            raise MissingApplyError(
                f"{type(self).__qualname__} has no apply method for "
                f"{type(event).__qualname__}; add one decorated with "
                f"@applies({type(event).__qualname__})"
            )
        object.__setattr__(self, "_mutable", True)
        try:
            applier(self, event)
        finally:
            object.__setattr__(self, "_mutable", False)
        object.__setattr__(self, "_version", self._version + 1)

    @classmethod
    def rehydrate(
        cls: type[A],
        id: str,
        events: Iterable[DomainEvent],
        *,
        snapshot: Snapshot | None = None,
    ) -> A:
        """Rebuild an aggregate from its stored events, oldest first.

        With ``snapshot``, start from it and apply only ``events`` (those after the
        snapshot's version). The result has no pending events.
        """
        if snapshot is None:
            aggregate = cls(id)
        else:
            if snapshot.aggregate_id != id:
                raise ConfigError(f"snapshot of {snapshot.aggregate_id!r} used to rehydrate {id!r}")
            aggregate = cls.from_snapshot(snapshot)
        apply = aggregate._apply
        for event in events:
            apply(event)
        return aggregate

    @classmethod
    def event_types(cls) -> tuple[type[DomainEvent], ...]:
        """The event classes this aggregate has apply methods for."""
        return tuple(cls._appliers)

    # -- snapshots ------------------------------------------------------------------------

    @classmethod
    def state_fields(cls) -> Mapping[str, Any]:
        """Name → type of the state attributes: public, non-ClassVar annotations.

        Collected from the subclasses of :class:`Aggregate` in the MRO (base first) and
        cached per class. These are what a snapshot captures and restores.
        """
        cached = cls.__dict__.get("_state_fields")
        if cached is not None:
            return typing.cast("Mapping[str, Any]", cached)
        hints = typing.get_type_hints(cls)
        fields: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            if not (isinstance(klass, type) and issubclass(klass, Aggregate)):
                continue
            if klass is Aggregate:
                continue
            for name in inspect.get_annotations(klass):
                hint = hints[name]
                if name.startswith("_") or hint is ClassVar or typing.get_origin(hint) is ClassVar:
                    continue
                fields[name] = hint
        cls._state_fields = MappingProxyType(fields)
        return cls._state_fields

    def take_snapshot(self) -> Snapshot:
        """Capture the state (a deep copy) at the current version."""
        state = {name: getattr(self, name) for name in self.state_fields()}
        return Snapshot(
            aggregate_id=self._id,
            aggregate_version=self._version,
            snapshot_version=self.snapshot_version,
            state=copy.deepcopy(state),
        )

    @classmethod
    def from_snapshot(cls: type[A], snapshot: Snapshot) -> A:
        """Restore an aggregate from ``snapshot``; it has no pending events.

        Raises :class:`~eventlane.errors.StaleSnapshotError` when the snapshot's schema
        version is not ``cls.snapshot_version``, and
        :class:`~eventlane.errors.ConfigError` when its state does not have exactly the
        attributes of :meth:`state_fields`.
        """
        if snapshot.snapshot_version != cls.snapshot_version:
            raise StaleSnapshotError(
                f"snapshot of {cls.__qualname__} {snapshot.aggregate_id!r} has schema "
                f"version {snapshot.snapshot_version}, the class has {cls.snapshot_version}",
                version=snapshot.snapshot_version,
            )
        expected = set(cls.state_fields())
        if set(snapshot.state) != expected:
            raise ConfigError(
                f"snapshot of {cls.__qualname__} has attributes {sorted(snapshot.state)}, "
                f"expected {sorted(expected)}"
            )
        aggregate = cls.__new__(cls)
        object.__setattr__(aggregate, "_id", snapshot.aggregate_id)
        object.__setattr__(aggregate, "_version", snapshot.aggregate_version)
        object.__setattr__(aggregate, "_pending", [])
        object.__setattr__(aggregate, "_mutable", False)
        for name, value in copy.deepcopy(dict(snapshot.state)).items():
            object.__setattr__(aggregate, name, value)
        return aggregate

    @classmethod
    def snapshot_due(cls, before: int, after: int) -> bool:
        """Whether saving versions ``before+1 .. after`` crosses a ``snapshot_every`` mark.

        >>> class Every3(Aggregate):
        ...     topic: ClassVar[str] = "t"
        ...     snapshot_every: ClassVar[int | None] = 3
        >>> [Every3.snapshot_due(0, 2), Every3.snapshot_due(2, 3), Every3.snapshot_due(2, 7)]
        [False, True, True]
        """
        every = cls.snapshot_every
        return every is not None and after // every > before // every
