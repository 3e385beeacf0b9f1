"""Test kits that ship with eventlane.

* :mod:`.scenario`: given-when-then tests of an aggregate, no storage (:class:`Scenario`);
* :mod:`.projection`: given events → a projector's rows and a policy's commands, no worker
  (:class:`ProjectorFixture`);
* :mod:`.contracts`: the log port's contract kits, one per role (:class:`~.contracts.LogContract`
  for the core, ``KeyedLogContract``, ``MaintainedLogContract``, ``FencedLogContract``);
  an engine subclasses those of the roles it implements to prove itself (imports pytest:
  import it explicitly);
* :mod:`.clock`: :class:`~.clock.FakeClock`, a clock that moves only when told;
* :mod:`.logs`: :func:`~.logs.capture_logs`, eventlane's log records as dicts.
"""

from eventlane.testing.clock import FakeClock
from eventlane.testing.projection import Issued, ProjectorFixture, Scheduled
from eventlane.testing.scenario import Scenario

__all__ = ["FakeClock", "Issued", "ProjectorFixture", "Scenario", "Scheduled"]
