"""Power loss: every crash state a small recorded workload may leave keeps every acknowledgement.

See :mod:`tests.powerloss.explore` for how states are recorded, generated and checked, and
``docs/reliability.md`` for the file-system guarantees assumed. The soak (``-m soak``, or
``benchmarks/soak_powerloss.py``) runs a larger workload with many more states.
"""

from __future__ import annotations

import pytest

from tests.powerloss import trace
from tests.powerloss.explore import Figures, Recording, explore, record


@pytest.fixture(scope="module", autouse=True)
def _strace() -> None:
    # Not a skip: `make test` installs strace (test-deps), so a missing one is a broken set-up.
    assert trace.strace_available(), "strace is not installed: run `make test-deps`"


def _report(fig: Figures) -> str:
    lines = [fig.summary()]
    for failure in fig.failures[:10]:
        lines.append(f"  {failure.state}: {'; '.join(failure.problems[:4])}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def recording() -> Recording:
    """One small workload (2 rounds), recorded once for the tests of this module."""
    return record(size=2, seed=7)


def test_power_loss_states_keep_every_acknowledgement(recording: Recording) -> None:
    """Directory entries are durable only after an fsync of their directory (POSIX); this
    also covers ext4's stronger behaviour (``--journaling`` in the soak script)."""
    fig = explore(seed=7, crash_points=24, states_per_point=2, recording=recording)
    assert fig.states >= 40 and fig.acks > 20
    assert fig.relayed_points >= 4, _report(fig)  # the relay's groups, in another process
    assert not fig.failures, _report(fig)


def test_the_oracle_notices_a_disk_that_ignores_flushes(recording: Recording) -> None:
    """The same exploration with segment fsyncs made no-ops must find lost acknowledged data
    (reported by the oracle, or refused by recovery as data loss)."""
    fig = explore(seed=3, crash_points=6, states_per_point=1, lying_disk=True, recording=recording)
    problems = [p for f in fig.failures for p in f.problems]
    assert any("lost" in p or "DataLoss" in p for p in problems), _report(fig)


@pytest.mark.soak
def test_power_loss_soak() -> None:
    fig = explore(size=8, seed=2026, crash_points=400, states_per_point=5, deadline_s=1500)
    print(fig.summary())
    assert fig.states >= 500
    assert not fig.failures, _report(fig)
