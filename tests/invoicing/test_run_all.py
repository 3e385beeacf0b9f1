"""``eventlane run APP`` (issue 32 item 1) as a real process: the invoicing app's three
projections and its policy, 2 workers each, under one supervisor.

While commands run: kill -9 of one worker (its partitions are owned by the others within
2 s: the supervisor makes its member leave), then SIGHUP (every worker replaced one at a
time: no group ever has fewer than 2 live members, and every old pid is gone), then
SIGTERM (exit 0, every group empty). Oracles: the read models equal folds of the raw log
(a record applied twice or missed changes a sum), and the log holds exactly one
InvoiceIssued per confirmed order (the policy's commands issued once across the roll).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from eventlane.app import Runtime
from eventlane.consumer.coordination import coordination_for
from eventlane.projection import readmodel_path
from example_apps.invoicing.domain import invoice_id_for
from example_apps.invoicing.workload import Workload

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_invoicing_e2e import (
    APP,
    PROJECTORS,
    fold_balances,
    fold_invoices,
    fold_orders,
    lag,
    raw_events,
    runtime,  # noqa: F401  (the fixture)
)

ROOT = Path(__file__).resolve().parents[2]
CLI = "from eventlane.cli import main; main(prog_name='eventlane')"


class Members:
    """Samples every group's live members (pid -> partitions) in a thread."""

    def __init__(self, rt: Runtime, names: tuple[str, ...]) -> None:
        groups = coordination_for(rt.log)
        self.coords = {n: groups.coordinator(rt.names.group(n)) for n in names}
        self.samples: list[dict[str, dict[int, set[Any]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def now(self) -> dict[str, dict[int, set[Any]]]:
        out = {}
        for name, coord in self.coords.items():
            state = coord.current()
            alive = set(coord.alive(state))
            out[name] = {m.pid: set(m.owned) for mid, m in state.members.items() if mid in alive}
        return out

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.now())
            time.sleep(0.02)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        for coord in self.coords.values():
            coord.close()


def wait_for(cond: Any, what: str, timeout: float = 120.0) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"timed out: {what}"
        time.sleep(0.02)
    return time.monotonic() - t0


def settled(members: Members, per_group: int) -> bool:
    now = members.now()
    return all(len(g) == per_group and all(g.values()) for g in now.values())


@pytest.mark.parametrize(
    "names",
    [
        pytest.param(("invoices", "invoicing_policy"), id="a-projection-and-the-policy"),
        pytest.param(PROJECTORS, id="the-whole-app", marks=pytest.mark.soak),
    ],
)
def test_run_all_kill9_and_rolling_restart(
    runtime: Runtime,  # noqa: F811
    tmp_path: Path,
    names: tuple[str, ...],
) -> None:
    data = runtime.log.path
    only = [arg for n in names for arg in ("--only", n)] if names != PROJECTORS else []
    workload = list(Workload(orders=60, seed=5).commands())
    proc = subprocess.Popen(
        [sys.executable, "-c", CLI, "run", APP, "--workers", "2", *only, "--data", str(data)],
        env={**os.environ, "PYTHONPATH": str(ROOT), "EVENTLANE_LOG_LEVEL": "warning"},
        cwd=str(ROOT),
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "run.log").open("wb"),
    )
    members = Members(runtime, names)
    done = 0

    def execute(n: int) -> None:
        nonlocal done
        for command in workload[done : done + n]:
            runtime.execute(
                command.cls, command.aggregate_id, command.action, create=command.create
            )
        done = min(len(workload), done + n)

    try:
        execute(50)
        started = wait_for(lambda: settled(members, 2), "2 members per group")
        print(f"eventlane run: {2 * len(names)} workers joined in {started:.1f} s", file=sys.stderr)
        # kill -9 of one worker of invoices: the others own its partitions within 2 s
        victim = next(iter(members.now()["invoices"]))
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        every = {tp for owned in members.now()["invoices"].values() for tp in owned}
        wait_for(
            lambda: (
                victim not in (g := members.now()["invoices"])
                and {tp for owned in g.values() for tp in owned} == every
            ),
            "the victim's partitions owned by another member",
            timeout=30,
        )
        handover = time.monotonic() - t0
        print(f"eventlane run: kill -9 hand-over {handover:.3f} s", file=sys.stderr)
        assert handover < 2.0
        execute(50)
        wait_for(lambda: settled(members, 2), "the killed worker replaced")
        # SIGHUP: a rolling restart while commands keep coming
        before = {n: set(g) for n, g in members.now().items()}
        members.start()
        proc.send_signal(signal.SIGHUP)
        while done < len(workload):
            execute(20)
        rolled = wait_for(
            lambda: all(
                not (set(g) & before[n]) and len(g) == 2 and all(g.values())
                for n, g in members.now().items()
            ),
            "every worker replaced",
            timeout=240,
        )
        print(
            f"eventlane run: SIGHUP roll of {2 * len(names)} workers {rolled:.1f} s",
            file=sys.stderr,
        )
        members.stop()
        wait_for(lambda: not any(lag(runtime, n) for n in names), "lag 0", timeout=180)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
        if members._thread.is_alive():
            members.stop()
    assert code == 0, (tmp_path / "run.log").read_text()[-3000:]
    # One at a time: from the SIGHUP on, each group always had at least 2 live members.
    for sample in members.samples:
        for name, group in sample.items():
            assert len(group) >= 2, (name, group)
    # SIGTERM: every worker left its group.
    groups = coordination_for(runtime.log)
    for name in names:
        coord = groups.coordinator(runtime.names.group(name))
        try:
            assert coord.current().members == {}, name
        finally:
            coord.close()
    check_folds(runtime, names)


def check_folds(rt: Runtime, names: tuple[str, ...]) -> None:
    data = rt.log.path
    orders = fold_orders(raw_events(rt.log, "orders"))
    invoice_events = raw_events(rt.log, "invoices")
    issued = Counter(e["aggregate_id"] for e in invoice_events if e["type"] == "InvoiceIssued")
    confirmed = {
        e["aggregate_id"] for e in raw_events(rt.log, "orders") if e["type"] == "OrderConfirmed"
    }
    assert issued == Counter({invoice_id_for(o): 1 for o in confirmed})
    invoices = fold_invoices(invoice_events)

    def expect(name: str, sql: str, folded: dict[str, Any]) -> None:
        if name not in names:
            return
        with sqlite3.connect(readmodel_path(data, name)) as db:
            assert db.execute("SELECT count(*) FROM _eventlane_dead_letters").fetchone() == (0,)
            assert {r[0]: tuple(r[1:]) for r in db.execute(sql)} == folded, name

    expect(
        "invoices",
        "SELECT invoice_id, order_id, customer_id, amount_cents, paid_cents, status FROM invoices",
        invoices,
    )
    expect(
        "customer_balances",
        "SELECT customer_id, invoiced_cents, paid_cents, voided_cents, invoices"
        " FROM customer_balances",
        fold_balances(invoices),
    )
    expect(
        "orders_by_status",
        "SELECT order_id, customer_id, status, total_cents, lines FROM orders",
        orders,
    )


def test_run_options_and_the_status_alias(runtime: Runtime) -> None:  # noqa: F811
    from click.testing import CliRunner  # noqa: PLC0415

    from eventlane.cli import main  # noqa: PLC0415

    data = str(runtime.log.path)
    bad = CliRunner().invoke(main, ["run", APP, "--only", "nope", "--data", data])
    assert bad.exit_code == 2 and "no projector or policy named nope" in bad.output
    bad = CliRunner().invoke(main, ["run", APP, "--projector", "invoices", "--data", data])
    assert bad.exit_code == 2 and "is not NAME=N" in bad.output
    status = CliRunner().invoke(main, ["run", APP, "--status", "--data", data])
    assert status.exit_code == 0, status.output
    for name in PROJECTORS:
        assert f"Projector {name}" in status.stdout
