"""Immediate hand-over on a known death (issue 32 item 2), on the embedded log.

A runner that sees its worker exit makes that worker's member leave the group at once
(fenced by the member's id and the generation it joined at); the scenario is in
``handover_kit.py`` (the JetStream twin is tests/jetstream/test_js_handover.py).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from handover_kit import APP, SESSION_MS, fold, kill_one_of_two, lag, owners, read_model, wait
from projection_kit import Producer, child_env

from eventlane.app import Runtime
from eventlane.consumer.coordination import coordination_for
from eventlane.log import TopicPartition
from eventlane.projection import Runner


def test_kill9_of_one_worker_of_two_moves_its_partitions_at_once(
    data: Path, runtime: Runtime, producer: Producer, tmp_path: Path
) -> None:
    figures = kill_one_of_two(
        runtime, data, child_env(), producer.deposits, tmp_path / "workers.log"
    )
    print("hand-over on the embedded log:", figures["handover_s"], "s", file=sys.stderr)
    assert figures["handover_s"] < 2.0, figures  # the session timeout is 20 s
    assert len(figures["handed_over"]) == 1 and figures["handed_over"][0][0] == figures["victim"]
    assert figures["fold_equal"], figures
    assert figures["applied_once"], figures


def test_a_wrong_hand_over_cannot_hurt_a_live_zombie(
    data: Path, runtime: Runtime, producer: Producer, tmp_path: Path
) -> None:
    """A worker only SIGSTOPped, whose member the runner removes as if it had died (a
    mis-tracked process): its partitions move; when it wakes its late batch and commits are
    refused, it rejoins, and nothing is applied twice or missed."""
    coordinator = coordination_for(runtime.log).coordinator(
        runtime.names.group("balances"), wake=runtime.log.wake
    )
    runner = Runner(
        APP,
        "balances",
        data,
        workers=2,
        session_timeout_ms=SESSION_MS,
        env=child_env(),
        log_path=tmp_path / "workers.log",
        coordinator=coordinator,
    )
    every = {TopicPartition("accounts", p) for p in range(runtime.log.partition_count("accounts"))}
    producer.deposits(3_000)
    runner.start()
    try:
        zombie, survivor = runner.procs
        wait(lambda: all(owners(runner).get(w.tag) for w in runner.procs), "members", runner)
        os.kill(zombie.pid, signal.SIGSTOP)
        producer.deposits(1_000)
        runner._hand_over(zombie)  # the runner wrongly believes it dead
        assert [p for p, _ in runner.handed_over] == [zombie.pid]
        # A second, stale hand-over of the same incarnation removes nobody else.
        (member_id,) = [m for _, m in runner.handed_over]
        assert not coordinator.leave(member_id, joined_generation=0)
        wait(lambda: owners(runner).get(survivor.tag) == every, "survivor owns all", runner, 30)
        os.kill(zombie.pid, signal.SIGCONT)
        producer.deposits(1_000)
        wait(
            lambda: len([t for t, o in owners(runner).items() if o]) == 2,
            "the zombie rejoined",
            runner,
        )
        producer.deposits(500)
        wait(lambda: lag(runtime, data) == 0, "lag 0", runner)
        assert zombie.proc.poll() is None  # alive and working again
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
        runner.stop()
        coordinator.close()
    balances, coords = fold(runtime.log)
    got, applied = read_model(data)
    assert got == balances
    assert sorted(applied) == sorted(coords)


def test_leave_on_behalf_is_fenced_by_the_joined_generation(runtime: Runtime) -> None:
    coordinator = coordination_for(runtime.log).coordinator("g-fence")
    try:
        member = coordinator.join(
            topics=("accounts",), assignor="cooperative-sticky", session_timeout_ms=60_000
        )
        assert not coordinator.leave(
            member.member_id, joined_generation=member.joined_generation + 1
        )
        assert member.member_id in coordinator.current().members
        assert coordinator.leave(member.member_id, joined_generation=member.joined_generation)
        assert coordinator.current().members == {}
    finally:
        coordinator.close()
