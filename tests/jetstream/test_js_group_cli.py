"""``eventlane --log nats://... groups list/describe/reset-offsets/delete`` against the cluster
(issue 13): committed offsets and lag per partition come from the cluster's KV, members are
real processes on their own connections, and nothing is written to the local directory."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from eventlane.cli import main
from eventlane.consumer.coordination import coordination_for
from eventlane.consumer.jetstream import JetStreamCoordination
from eventlane.engine import register_engine
from eventlane.errors import ConfigError
from eventlane.log import TopicPartition
from eventlane.log.jetstream.cluster import LocalCluster
from eventlane.log.jetstream.log import JetStreamLog, open_url

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "consumer"))
from group_members import GROUP, TOPIC, Member, produce, start_member, wait_for
from js_group_kit import (
    START_S,
    members_fixture,  # noqa: F401 (the `members` fixture)
)


@pytest.fixture
def js(cluster: LocalCluster, namespace: str) -> Iterator[JetStreamLog]:
    register_engine("nats", open_url)  # what the entry point eventlane.engines:nats does
    with JetStreamLog.from_url(cluster.url, namespace=namespace) as log:
        log.create_topic(TOPIC, 3)
        yield log


def _cli(base: list[str], *args: str, ok: bool = True) -> Any:
    result = CliRunner().invoke(main, [*base, "groups", *args])
    if ok:
        assert result.exit_code == 0, result.output
        return json.loads(result.output) if "--json" in args else result.output
    assert result.exit_code != 0, result.output
    return result.output


def _committed(js: JetStreamLog) -> dict[int, int | None]:
    offsets = coordination_for(js).offsets
    out = {}
    for p in range(3):
        entry = offsets.committed(GROUP, TopicPartition(TOPIC, p))
        out[p] = None if entry is None else entry.offset
    return out


def test_groups_commands_work_against_the_cluster(
    js: JetStreamLog, cluster: LocalCluster, namespace: str, members: list[Member], tmp_path: Path
) -> None:
    assert isinstance(coordination_for(js), JetStreamCoordination)
    local = tmp_path / "local"
    base = ["--data", str(local), "--log", f"{cluster.url}?namespace={namespace}"]
    produce(js, 60, 3)  # type: ignore[arg-type]
    common = {
        "log_url": cluster.url,
        "namespace": namespace,
        "group": GROUP,
        "topic": TOPIC,
        "session_timeout_ms": 10_000,
        "heartbeat_interval_ms": 500,
        "commit": "after",
    }
    members.extend(start_member(f"m{i}", tmp_path, **common) for i in range(2))
    wait_for(lambda: _committed(js) == {0: 20, 1: 20, 2: 20}, START_S, "all committed", members)
    wait_for(
        lambda: (
            [(r["state"], r["members"]) for r in _cli(base, "list", "--json")] == [("Stable", 2)]
        ),
        START_S,
        "2 members, stable",
        members,
    )
    (row,) = _cli(base, "list", "--json")
    assert row["group"] == GROUP and row["members"] == 2 and row["generation"] > 0
    doc = _cli(base, "describe", GROUP, "--json")
    assert len(doc["members"]) == 2
    owned = sorted(a["partition"] for m in doc["members"] for a in m["assignment"])
    assert owned == [0, 1, 2]
    assert [(r["partition"], r["committed"], r["hwm"], r["lag"]) for r in doc["offsets"]] == [
        (p, 20, 20, 0) for p in range(3)
    ]
    refused = _cli(base, "reset-offsets", GROUP, "--topic", TOPIC, "--to-earliest", ok=False)
    assert "live member" in refused

    for m in members:  # graceful leave: the group is empty, its offsets stay
        m.stop()
    produce(js, 30, 3, start=60)  # type: ignore[arg-type]
    doc = _cli(base, "describe", GROUP, "--json")
    assert doc["state"] == "Empty" and doc["members"] == []
    assert [(r["committed"], r["hwm"], r["lag"]) for r in doc["offsets"]] == [(20, 30, 10)] * 3
    text = _cli(base, "describe", GROUP)
    assert "Empty" in text and "lag" in text

    dry = _cli(base, "reset-offsets", GROUP, "--topic", TOPIC, "--shift-by", "-5", "--json")
    assert [(r["current"], r["new"]) for r in dry["offsets"]] == [(20, 15)] * 3
    assert _committed(js) == {0: 20, 1: 20, 2: 20}  # a dry run changes nothing
    _cli(base, "reset-offsets", GROUP, "--topic", TOPIC, "--to-earliest", "--execute")
    assert _committed(js) == {0: 0, 1: 0, 2: 0}
    done = _cli(base, "reset-offsets", GROUP, "--topic", TOPIC, "--to-offset", "25", "--execute")
    assert "New offsets" in done and _committed(js) == {0: 25, 1: 25, 2: 25}

    groups = coordination_for(js)
    groups.claim_home(GROUP, "host-1:/srv/readmodels/workers.sqlite")  # a pinned projection
    groups.claim_home(GROUP, "host-1:/srv/readmodels/workers.sqlite")  # the same home: fine
    with pytest.raises(ConfigError, match="keeps its read model at host-1"):
        groups.claim_home(GROUP, "host-2:/srv/readmodels/workers.sqlite")
    assert "3 committed offset(s) removed" in _cli(base, "delete", GROUP)
    groups.claim_home(GROUP, "host-2:/srv/readmodels/workers.sqlite")  # delete forgot the pin
    assert _cli(base, "list", "--json") == []
    assert _committed(js) == {0: None, 1: None, 2: None}
    assert "does not exist" in _cli(base, "describe", GROUP, ok=False)
    assert not (local / "groups").exists()  # nothing of the group on the local disk
