"""Group administration and the ``groups`` CLI: describe/lag, list, reset-offsets, delete,
and ``consume --group`` delivery modes."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from eventlane.cli import main
from eventlane.consumer.admin import delete_group, describe_group, list_groups, reset_offsets
from eventlane.consumer.group import GroupConsumer
from eventlane.consumer.offsets import OffsetAndMetadata, OffsetStore
from eventlane.errors import ConsumerError
from eventlane.log import LogStore, TopicPartition

T = "payments"
T0 = 1_700_000_000_000


@pytest.fixture
def log(tmp_path: Path) -> Iterator[LogStore]:
    store = LogStore(tmp_path / "data")
    store.create_topic(T, 2)
    for p in range(2):  # 10 records per partition, one second apart from T0
        store.append(T, p, [(None, f"{p}:{i}".encode(), (), T0 + 1000 * i) for i in range(10)])
    yield store
    store.close()


def commit_as_admin(log: LogStore, group: str, offsets: dict[int, int]) -> None:
    OffsetStore(log).commit(
        group,
        {TopicPartition(T, p): OffsetAndMetadata(o) for p, o in offsets.items()},
        generation=-1,
        member_id="test",
    )


def committed(log: LogStore, group: str) -> dict[int, int | None]:
    store = OffsetStore(log)
    return {
        p: (e.offset if (e := store.committed(group, TopicPartition(T, p))) else None)
        for p in range(2)
    }


def member(log: LogStore, group: str = "g", **kw: object) -> GroupConsumer:
    c = GroupConsumer(
        log,
        group_id=group,
        topics=[T],
        session_timeout_ms=1000,
        heartbeat_interval_ms=100,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **kw,
    )  # type: ignore[arg-type]
    c.poll(0.2)
    return c


def test_describe_reports_members_assignment_and_lag(log) -> None:
    c = member(log)
    while len(c.poll(0.2)) > 0:
        pass
    c.commit({TopicPartition(T, 0): 4})
    doc = describe_group(log, "g")
    assert doc == {
        "group": "g",
        "state": "Stable",
        "generation": c.generation,
        "members": [
            {
                "member_id": c.member_id,
                "instance_id": None,
                "client_id": "eventlane",
                "host": socket.gethostname(),
                "assignment": [{"topic": T, "partition": 0}, {"topic": T, "partition": 1}],
            }
        ],
        "offsets": [
            {"topic": T, "partition": 0, "committed": 4, "hwm": 10, "lag": 6},
            {"topic": T, "partition": 1, "committed": None, "hwm": 10, "lag": None},
        ],
    }
    assert list_groups(log) == [
        {"group": "g", "state": "Stable", "generation": c.generation, "members": 1}
    ]
    c.close()
    assert describe_group(log, "g")["state"] == "Empty"
    with pytest.raises(ConsumerError, match="does not exist"):
        describe_group(log, "nope")


@pytest.mark.parametrize(
    ("mode", "value", "expected", "requested"),
    [
        ("to-earliest", None, {0: 0, 1: 0}, {}),
        ("to-latest", None, {0: 10, 1: 10}, {}),
        ("to-offset", 7, {0: 7, 1: 7}, {}),
        ("to-offset", 99, {0: 10, 1: 10}, {0: 99, 1: 99}),  # clamped to the high-water mark
        ("to-datetime", "2023-11-14T22:13:23Z", {0: 3, 1: 3}, {}),  # T0 + 3 s (rounded up)
        ("to-datetime", "2030-01-01T00:00:00", {0: 10, 1: 10}, {}),  # after every record
        ("shift-by", -3, {0: 2, 1: 0}, {1: -3}),  # from 5 and from "no commit" (the LWM)
        ("shift-by", 20, {0: 10, 1: 10}, {0: 25, 1: 20}),
    ],
)
def test_reset_offsets_modes(log, mode, value, expected, requested) -> None:
    commit_as_admin(log, "g", {0: 5})
    plan = reset_offsets(log, "g", T, mode, value)
    assert [(r["partition"], r["current"], r["new"]) for r in plan] == [
        (0, 5, expected[0]),
        (1, None, expected[1]),
    ]
    assert {r["partition"]: r["requested"] for r in plan if "requested" in r} == requested
    assert committed(log, "g") == {0: 5, 1: None}  # a dry run changes nothing
    reset_offsets(log, "g", T, mode, value, execute=True)
    assert committed(log, "g") == expected


def test_reset_and_delete_are_refused_while_members_are_alive(log) -> None:
    c = member(log, group_instance_id="w1")  # static: close() keeps it in the group
    commit_as_admin(log, "g", {0: 5})  # (an admin commit needs no membership)
    for attempt in (
        lambda: reset_offsets(log, "g", T, "to-earliest"),
        lambda: reset_offsets(log, "g", T, "to-earliest", execute=True),
        lambda: delete_group(log, "g"),
    ):
        with pytest.raises(ConsumerError, match="live member"):
            attempt()
    assert committed(log, "g") == {0: 5, 1: None}
    c.close()
    with pytest.raises(ConsumerError, match="live member"):  # still within its session
        reset_offsets(log, "g", T, "to-earliest")
    time.sleep(1.3)  # its session expires: a dead member does not block
    reset_offsets(log, "g", T, "to-earliest", execute=True)
    assert committed(log, "g") == {0: 0, 1: 0}
    assert delete_group(log, "g") == 2
    assert committed(log, "g") == {0: None, 1: None}
    assert list_groups(log) == []


# ---------------------------------------------------------------------- the CLI
def run(data: Path, *args: str, input: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["--data", str(data), *args], input=input)
    return result.exit_code, result.stdout, result.stderr


def test_cli_consume_group_commits_after_printing_and_resumes(log) -> None:
    code, out, _ = run(log.path, "consume", T, "--group", "cli")
    assert code == 0
    assert len(out.splitlines()) == 20
    assert committed(log, "cli") == {0: 10, 1: 10}
    log.append(T, 1, [(None, b"late", (), None)])
    code, out, _ = run(log.path, "consume", T, "--group", "cli", "--commit", "before")
    assert code == 0 and [json.loads(line)["value"] for line in out.splitlines()] == ["late"]
    code, out, _ = run(log.path, "consume", T, "--group", "cli")
    assert code == 0 and out == ""


def test_cli_groups_commands(log) -> None:
    commit_as_admin(log, "g", {0: 5})
    code, out, _ = run(log.path, "groups", "list", "--json")
    assert code == 0 and json.loads(out) == [
        {"group": "g", "state": "Empty", "generation": 0, "members": 0}
    ]
    code, out, _ = run(log.path, "groups", "describe", "g", "--json")
    assert code == 0 and json.loads(out) == describe_group(log, "g")
    code, out, _ = run(log.path, "groups", "describe", "g")
    assert code == 0 and "lag" in out and "Empty" in out
    code, out, _ = run(log.path, "groups", "reset-offsets", "g", "--topic", T, "--to-latest")
    assert code == 0 and "dry run" in out and committed(log, "g") == {0: 5, 1: None}
    code, out, _ = run(
        log.path, "groups", "reset-offsets", "g", "--topic", T, "--shift-by", "2", "--execute"
    )
    assert code == 0 and committed(log, "g") == {0: 7, 1: 2}
    code, _, err = run(log.path, "groups", "reset-offsets", "g", "--topic", T)
    assert code == 2 and "exactly one" in err
    code, out, err = run(
        log.path, "groups", "reset-offsets", "g", "--topic", T, "--to-offset", "99", "--json"
    )  # clamped, and said on stderr (stdout stays data)
    assert code == 0 and [r["new"] for r in json.loads(out)["offsets"]] == [10, 10]
    assert err.splitlines() == [
        f"note: offset 99 is outside {T}-{p} (its high-water mark is 10): 10 instead"
        for p in (0, 1)
    ]
    c = member(log)
    code, _, err = run(log.path, "groups", "delete", "g")
    assert code == 1 and "live member" in err and "Traceback" not in err
    c.close()
    code, out, _ = run(log.path, "groups", "delete", "g")
    assert code == 0 and "deleted" in out
    code, _, err = run(log.path, "groups", "describe", "g")
    assert code == 1 and "does not exist" in err
    code, _, err = run(log.path, "consume", T, "--group", "../x")
    assert code == 2 and "illegal" in err
