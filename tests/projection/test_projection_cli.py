"""``eventlane project run|status``, ``eventlane migrate``, ``eventlane dlq list|show|retry``:
real commands on real data directories (the runner and its workers as real processes)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from click.testing import CliRunner
from projection_kit import ROOT, Producer, child_env, fold_accounts, read_balances, wait_caught_up

from eventlane.app import Runtime
from eventlane.cli import main
from tests.projection import bankapp

APP = "tests.projection.bankapp:app"
APP_V2 = "tests.projection.bankapp:app_v2"
CLI = "from eventlane.cli import main; main(prog_name='eventlane')"


def invoke(data: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main, [*args, "--data", str(data)], env=env)


def status_doc(data: Path, name: str = "balances") -> dict[str, Any]:
    result = invoke(data, "project", "status", APP, "--projection", name, "--json")
    assert result.exit_code == 0, result.output
    (doc,) = orjson.loads(result.stdout)["projectors"]
    return doc  # type: ignore[no-any-return]


def start_cli(data: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CLI, *args, "--data", str(data)],
        env=child_env(EVENTLANE_LOG_LEVEL="warning", **env),
        cwd=str(ROOT),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_members(data: Path, count: int, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        doc = status_doc(data)
        alive = [m for m in doc["members"] if m["alive"]]
        if len(alive) == count and all(m["assignment"] for m in alive):
            return doc
        assert time.monotonic() < deadline, doc
        time.sleep(0.1)


def test_run_status_and_graceful_stop(data: Path, runtime: Runtime, producer: Producer) -> None:
    producer.deposits(3_000, accounts=50)
    before = status_doc(data)
    assert before["exists"] is False and before["members"] == []
    assert sum(r["lag"] for r in before["partitions"]) == 3_000
    assert all(r["position"] is None for r in before["partitions"])

    proc = start_cli(
        data,
        "project",
        "run",
        APP,
        "--projection",
        "balances",
        "--workers",
        "2",
        "--no-live",
        "--session-timeout-ms",
        "2000",
    )
    try:
        doc = wait_members(data, 2)
        wait_caught_up(data, "balances")
        doc = status_doc(data)
        assert doc["lag"] == 0
        for row in doc["partitions"]:
            assert row["position"] == row["hwm"] and row["owner"] is not None
        owned = sorted(p for m in doc["members"] for p in m["assignment"])
        assert owned == [f"accounts-{p}" for p in range(6)]
        table = invoke(data, "project", "status", APP)
        assert table.exit_code == 0
        assert "Projector balances" in table.stdout and "Members" in table.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    after = status_doc(data)
    assert after["members"] == []  # the workers left the group on SIGTERM
    assert read_balances(data) == fold_accounts(data).balances


def test_runner_replaces_a_killed_worker(data: Path, runtime: Runtime, producer: Producer) -> None:
    producer.deposits(500)
    proc = start_cli(
        data,
        "project",
        "run",
        APP,
        "--projection",
        "balances",
        "--workers",
        "2",
        "--restart",
        "--no-live",
        "--session-timeout-ms",
        "1000",
    )
    try:
        doc = wait_members(data, 2)
        victim = doc["members"][0]["pid"]
        subprocess.run(["kill", "-9", str(victim)], check=True)
        deadline = time.monotonic() + 30
        while True:
            doc = status_doc(data)
            pids = {m["pid"] for m in doc["members"] if m["alive"] and m["assignment"]}
            if len(pids) == 2 and victim not in pids:
                break
            assert time.monotonic() < deadline, doc
            time.sleep(0.1)
        producer.deposits(500)
        wait_caught_up(data, "balances")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert read_balances(data) == fold_accounts(data).balances


def test_live_view_renders(data: Path, runtime: Runtime, producer: Producer) -> None:
    producer.deposits(200)
    proc = start_cli(data, "project", "run", APP, "--projection", "balances", "--live")
    try:
        wait_caught_up(data, "balances")
        time.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "projector balances" in out and "accounts-0" in out and "worker pid" in out
    assert (data / "readmodels" / "balances.log").exists()  # the workers' logs went there


def test_migrate_and_refusal_to_run_with_pending(
    data: Path, runtime: Runtime, producer: Producer
) -> None:
    producer.deposits(100)
    first = invoke(data, "migrate", APP)
    assert first.exit_code == 0, first.output
    assert "balances: applied bankapp.balances:m001_tables" in first.stdout
    assert "ledger: applied eventlane.read_model:m001_positions_and_dead_letters" in first.stdout
    assert "Nothing to apply" in invoke(data, "migrate", APP).stdout
    # Version 2 of the app adds a migration: its workers refuse to start until migrated.
    refused = start_cli(data, "project", "run", APP_V2, "--projection", "balances", "--no-live")
    _out, err = refused.communicate(timeout=60)
    assert refused.returncode == 1
    assert "pending migrations: m002_balances_owner" in err and "eventlane migrate" in err
    command = ["project", "worker", APP_V2, "balances"]
    worker = subprocess.run(
        [sys.executable, "-m", "eventlane.cli", "--data", str(data), *command],
        env=child_env(),
        cwd=str(ROOT),
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert worker.returncode == 2 and "m002_balances_owner" in worker.stderr
    status = invoke(data, "project", "status", APP_V2, "--projection", "balances", "--json")
    assert orjson.loads(status.stdout)["projectors"][0]["pending_migrations"] == [
        "m002_balances_owner"
    ]
    migrated = invoke(data, "migrate", APP_V2, "--json")
    assert migrated.exit_code == 0, migrated.output
    assert orjson.loads(migrated.stdout)["applied"]["balances"] == [
        "bankapp.balances:m002_balances_owner"
    ]
    ok = start_cli(data, "project", "run", APP_V2, "--projection", "balances", "--no-live")
    try:
        wait_caught_up(data, "balances")
    finally:
        ok.send_signal(signal.SIGTERM)
        ok.communicate(timeout=60)
    assert ok.returncode == 0


def test_dlq_commands(data: Path, runtime: Runtime, producer: Producer) -> None:
    producer.deposits(300, accounts=10, poison=lambda i: i in (3, 13, 40))
    proc = start_cli(data, "project", "run", APP, "--projection", "ledger", "--no-live")
    try:
        wait_caught_up(data, "ledger")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    listed = invoke(data, "dlq", "list", APP, "--projection", "ledger", "--json")
    letters = orjson.loads(listed.stdout)
    dead = [d for d in letters if d["status"] == "dead"]
    parked = [d for d in letters if d["status"] == "parked"]
    assert {d["key"] for d in dead} == {"acc-3", "acc-0"}  # 13 is acc-3 again: parked
    assert parked and {d["key"] for d in parked} <= {"acc-3", "acc-0"}
    table = invoke(data, "dlq", "list", APP, "--projection", "ledger", "--status", "dead")
    assert table.exit_code == 0 and "Dead letters of ledger (dead): 2" in table.stdout
    shown = invoke(data, "dlq", "show", APP, str(dead[0]["id"]), "--projection", "ledger", "--json")
    body = orjson.loads(shown.stdout)
    assert body["error"].startswith("ValueError: cannot apply poison deposit")
    assert body["headers"][0][0] == "event-type"
    missing = invoke(data, "dlq", "show", APP, "99999", "--projection", "ledger")
    assert missing.exit_code == 1 and "no dead letter 99999" in missing.output
    # A parked letter alone is refused (order); the first dead one alone fails (no fix yet).
    later = parked[-1]["id"]
    refused = invoke(data, "dlq", "retry", APP, "--projection", "ledger", "--id", str(later))
    assert refused.exit_code == 1 and "earlier dead letter" in refused.stdout
    fixed = {"BANKAPP_FIXED": "1"}
    acc0 = [d["id"] for d in letters if d["key"] == "acc-0"]
    partial = invoke(
        data,
        "dlq",
        "retry",
        APP,
        "--projection",
        "ledger",
        *[f"--id={i}" for i in acc0],
        "--json",
        env=fixed,
    )
    assert partial.exit_code == 0, partial.output
    assert orjson.loads(partial.stdout) == {"succeeded": acc0, "failed": {}}
    rest = invoke(data, "dlq", "retry", APP, "--projection", "ledger", env=fixed)
    assert rest.exit_code == 0 and "failed: 0" in rest.stdout
    assert (
        "Dead letters of ledger (open): 0"
        in invoke(data, "dlq", "list", APP, "--projection", "ledger", "--status", "open").stdout
    )


def test_bad_arguments(data: Path, runtime: Runtime) -> None:
    unknown = invoke(data, "project", "status", APP, "--projection", "nope")
    assert unknown.exit_code == 1 and "has no projector 'nope'" in unknown.output
    bad_app = invoke(data, "project", "status", "no_such_module:app")
    assert bad_app.exit_code == 1 and "cannot import" in bad_app.output
    no_rm = invoke(data, "dlq", "list", APP, "--projection", "balances")
    assert no_rm.exit_code == 1 and "no read model yet" in no_rm.output
    env_app = CliRunner().invoke(
        main, ["project", "status", "--json", "--data", str(data)], env={"EVENTLANE_APP": APP}
    )
    assert env_app.exit_code == 0, env_app.output


def test_run_fails_when_its_only_worker_dies(data: Path, runtime: Runtime) -> None:
    """Issue 17 #10: a runner whose every worker died with an error exits non-zero."""
    order = bankapp.Order("order-dies")
    order.place(5)
    runtime.save(order)
    proc = start_cli(
        data, "project", "run", APP, "--projection", "invoicing", BANKAPP_CRASH_AFTER_ISSUE="1"
    )
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "every worker of invoicing died" in err and "status -9" in err
