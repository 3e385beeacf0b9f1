"""``make demo`` (``eventlane demo invoicing``, without its Spark step): the README's main job,
its worker processes really started and one of them killed with ``kill -9``.

The killed worker's member must leave its group as soon as the demo's runner reaps it (the
runner holds the group, as ``eventlane run`` does), so its partitions move at once: no
member is ever evicted by the session timeout (10 s), and the demo's summary says so. Before
the runners held their groups, the killed member stayed until the timeout evicted it (the
demo then used a 3 s timeout to keep the wait short, and printed the eviction warning).
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from example_apps.invoicing.demo import run_demo


@pytest.mark.timeout(300)
def test_the_demo_hands_a_killed_workers_partitions_over_at_once(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = io.StringIO()
    summary = run_demo(
        tmp_path / "demo",
        orders=1000,
        workers=2,
        spark=False,
        console=Console(file=out, width=120),
        confirm_within_s=3.0,
    )
    err = capfd.readouterr().err
    assert summary["invoices"] == summary["confirmed"] > 0
    assert summary["restarts"] >= 1, out.getvalue()
    assert summary["handed_over"] >= 1, out.getvalue()
    assert "member evicted" not in err, err[-3000:]
    assert set(summary["lag"].values()) == {0}
    assert "their partitions moved at once" in out.getvalue()
