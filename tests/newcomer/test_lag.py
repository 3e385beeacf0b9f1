"""Item 4: lag is one figure: ``groups describe`` and ``project status`` agree for a
projector's group, also once its workers are idle."""

from __future__ import annotations

import json
from pathlib import Path

from tests.newcomer.kit import eventlane, python, start_workers, status, stop, wait_until


def _group_offsets(workdir: Path) -> dict[str, tuple[int | None, int | None]]:
    done = eventlane("--data", "d", "groups", "describe", "loans_view", "--json", cwd=workdir)
    assert done.returncode == 0, done.stderr
    return {
        f"{r['topic']}-{r['partition']}": (r["committed"], r["lag"])
        for r in json.loads(done.stdout)["offsets"]
    }


def test_groups_describe_and_project_status_agree_when_idle(workdir: Path) -> None:
    assert eventlane("--data", "d", "migrate", "library.app:app", cwd=workdir).returncode == 0
    workers = start_workers(workdir, "loans_view", "--workers", "2")
    try:
        wait_until(
            lambda: sum(m["alive"] for m in status(workdir, "loans_view")["members"]) == 2,
            60,
            "two live members",
        )
        # trickle: batches arrive faster than the group-commit interval (1 s), then stop
        python(
            """
            import time
            from library.app import app
            from library.domain import Loan
            with app.open("d") as rt:
                for burst in range(8):
                    for i in range(5):
                        rt.execute(Loan, f"loan-{burst}-{i}", lambda l: l.request("m-1", "b"),
                                   create=True)
                    time.sleep(0.1)
            """,
            cwd=workdir,
        )
        wait_until(lambda: status(workdir, "loans_view")["lag"] == 0, 60, "project lag 0")

        def agree() -> bool:
            doc = status(workdir, "loans_view")
            group = _group_offsets(workdir)
            mine = {
                f"{r['topic']}-{r['partition']}": (r["position"], r["lag"])
                for r in doc["partitions"]
            }
            return group == mine

        wait_until(agree, 10, "groups describe to agree with project status while idle")
        assert sum(lag for _, lag in _group_offsets(workdir).values()) == 0
    finally:
        assert stop(workers) == 0
