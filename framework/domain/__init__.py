"""The domain layer: events and aggregates. Pure: attrs only, no I/O, no codec.

* :class:`DomainEvent` and :func:`event` declare events (frozen attrs classes with a stable
  type name and schema version);
* :class:`Aggregate` and :func:`applies` declare aggregates (command methods record events,
  apply methods change state);
* :class:`Command` and :func:`command` declare commands that are data (stored, scheduled,
  sent; :mod:`framework.domain.commands`);
* :class:`Snapshot` is an aggregate's state captured at a version;
* :func:`personal` and :func:`subject` mark personal-data fields of events (encrypted per
  subject by the codec; see :mod:`framework.domain.privacy`).

Events hold only domain fields; the envelope (aggregate id and version, event id,
timestamp, correlation and causation ids) belongs to :mod:`framework.codec`.
"""

from framework.domain.aggregate import Aggregate, applies
from framework.domain.commands import Command, command, command_name_of
from framework.domain.events import DomainEvent, EventType, event, event_type_of
from framework.domain.privacy import personal, subject
from framework.domain.snapshot import Snapshot

__all__ = [
    "Aggregate",
    "applies",
    "Command",
    "command",
    "command_name_of",
    "DomainEvent",
    "EventType",
    "event",
    "event_type_of",
    "Snapshot",
    "personal",
    "subject",
]
