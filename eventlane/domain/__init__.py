"""The domain layer: events and aggregates. Pure: attrs only, no I/O, no codec.

* :class:`DomainEvent` and :func:`event` declare events (frozen attrs classes with a stable
  type name and schema version);
* :class:`Aggregate` and :func:`applies` declare aggregates (command methods record events,
  apply methods change state);
* :class:`Command` and :func:`command` declare commands that are data (stored, scheduled,
  sent; :mod:`eventlane.domain.commands`);
* :class:`Snapshot` is an aggregate's state captured at a version;
* :func:`personal` and :func:`subject` mark personal-data fields of events (encrypted per
  subject by the codec; see :mod:`eventlane.domain.privacy`).

Events hold only domain fields; the envelope (aggregate id and version, event id,
timestamp, correlation and causation ids) belongs to :mod:`eventlane.codec`.
"""

from eventlane.domain.aggregate import Aggregate, applies
from eventlane.domain.commands import Command, command, command_name_of
from eventlane.domain.events import DomainEvent, EventType, event, event_type_of
from eventlane.domain.privacy import personal, subject
from eventlane.domain.snapshot import Snapshot

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
