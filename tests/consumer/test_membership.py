"""The group protocol as a pure state machine (Hypothesis), and commit validation.

The state machine drives :mod:`eventlane.consumer.membership` the way member processes do
(each simulated member keeps the set of partitions it believes it owns and synchronises with
the state exactly like ``GroupConsumer._sync``), with joins, graceful leaves, evictions,
static take-overs and topics gaining partitions in any order. It checks that no two members
of the group ever consume one partition at once, that a partition's successive owners hold
it under increasing generations, and that the group always converges to owning everything.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from eventlane.consumer.assignors import ASSIGNORS
from eventlane.consumer.membership import (
    GroupState,
    Member,
    add_member,
    check_invariants,
    needs_release,
    release,
    remove_members,
    take_over,
    to_release,
    update_partitions,
    validate_commit,
)
from eventlane.errors import CommitFailedError
from eventlane.log import TopicPartition


def make_member(
    member_id: str, topics: tuple[str, ...] = ("a", "b"), instance: str | None = None
) -> Member:
    return Member(
        member_id=member_id,
        instance_id=instance,
        client_id="c",
        host="h",
        pid=1,
        slot=0,
        token=1,
        session_timeout_ms=1000,
        topics=topics,
    )


class GroupProtocol(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state = GroupState("g")
        self.local: dict[str, set[TopicPartition]] = {}  # every process, zombies included
        self.counter = 0
        self.used: dict[TopicPartition, tuple[str, int]] = {}  # last owner, generation seen
        self.last_generation = 0

    @initialize(
        assignor=st.sampled_from(sorted(ASSIGNORS)), a=st.integers(1, 6), b=st.integers(0, 4)
    )
    def setup(self, assignor: str, a: int, b: int) -> None:
        self.assignor = assignor
        update_partitions(self.state, {"a": a, "b": b})

    # ------------------------------------------------------------------ membership changes
    @rule()
    def join(self) -> None:
        self.counter += 1
        mid = f"m{self.counter}"
        add_member(self.state, make_member(mid, instance=f"i{self.counter}"), self.assignor)
        self.local[mid] = set()

    @precondition(lambda self: self.state.members)
    @rule(data=st.data())
    def graceful_leave(self, data: st.DataObject) -> None:
        mid = data.draw(st.sampled_from(sorted(self.state.members)))
        self.local.pop(mid).clear()  # on_revoked, stop consuming, then leave
        remove_members(self.state, [mid])

    @precondition(lambda self: self.state.members)
    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        """Its process is frozen: it keeps believing it owns its partitions (a zombie)."""
        mid = data.draw(st.sampled_from(sorted(self.state.members)))
        remove_members(self.state, [mid])

    @precondition(lambda self: self.state.members)
    @rule(data=st.data())
    def static_restart(self, data: st.DataObject) -> None:
        old = data.draw(st.sampled_from(sorted(self.state.members)))
        self.counter += 1
        mid = f"m{self.counter}"
        instance = self.state.members[old].instance_id
        take_over(self.state, old, make_member(mid, instance=instance))
        self.local[mid] = set()

    @rule(topic=st.sampled_from(["a", "b"]), more=st.integers(1, 3))
    def add_partitions(self, topic: str, more: int) -> None:
        update_partitions(self.state, {topic: self.state.partitions.get(topic, 0) + more})

    # ------------------------------------------------------------------ members synchronise
    def sync(self, mid: str) -> None:
        """What ``GroupConsumer._sync`` does for one pass."""
        local = self.local[mid]
        me = self.state.members.get(mid)
        if me is None:  # evicted or replaced: on_lost
            local.clear()
            del self.local[mid]
            return
        for tp in local:  # the member may write tp's output stamped with this generation
            self.used[tp] = (mid, self.state.generation)
        if needs_release(self.state, mid):
            giving_up = to_release(self.state, mid)
            local -= giving_up  # on_revoked, then release
            release(self.state, mid, giving_up)
            return
        for tp, since in me.owned.items():
            if tp not in local:
                # Fencing token: the new owner's generation beats any its predecessor used.
                previous, seen = self.used.get(tp, (mid, -1))
                assert previous == mid or since > seen, (tp, since, previous, seen)
                self.used[tp] = (mid, since)
                local.add(tp)  # on_assigned

    @precondition(lambda self: self.local)
    @rule(data=st.data())
    def sync_one(self, data: st.DataObject) -> None:
        self.sync(data.draw(st.sampled_from(sorted(self.local))))

    @rule()
    def settle(self) -> None:
        """Everyone polls until nothing changes: then the plan is fully in force."""
        for _ in range(4 * (len(self.local) + 2)):
            before = (self.state.to_json(), {m: set(s) for m, s in self.local.items()})
            for mid in sorted(self.local):
                self.sync(mid)
            if before == (self.state.to_json(), {m: set(s) for m, s in self.local.items()}):
                break
        else:
            raise AssertionError("the group did not converge")
        if self.state.members:
            owned = {tp for m in self.state.members.values() for tp in m.owned}
            everything = {
                TopicPartition(t, p)
                for t in ("a", "b")
                for p in range(self.state.partitions.get(t, 0))
            }
            assert owned == everything
            for mid, m in self.state.members.items():
                assert set(m.owned) == set(m.target) == self.local[mid]
            assert self.state.state_name() == "Stable"

    # ------------------------------------------------------------------ invariants
    @invariant()
    def state_is_consistent(self) -> None:
        check_invariants(self.state)
        assert self.state.generation >= self.last_generation
        self.last_generation = self.state.generation

    @invariant()
    def members_consume_only_what_they_own(self) -> None:
        """A live member's local set is within its owned set, and owned sets are disjoint:
        no two live members consume a partition at once (zombies may, until fenced)."""
        for mid, m in self.state.members.items():
            assert self.local[mid] <= set(m.owned), (mid, self.local[mid], m.owned)

    @invariant()
    def commits_are_fenced(self) -> None:
        for mid, local in self.local.items():
            for tp in local:
                if mid in self.state.members:
                    validate_commit(self.state, mid, None, self.state.generation, [tp])
                else:
                    with pytest.raises(CommitFailedError):
                        validate_commit(self.state, mid, None, self.state.generation, [tp])


TestGroupProtocol = GroupProtocol.TestCase
TestGroupProtocol.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


# ---------------------------------------------------------------------- commit validation
def joined(*ids: str, partitions: int = 4, assignor: str = "cooperative-sticky") -> GroupState:
    state = GroupState("orders-view")
    update_partitions(state, {"a": partitions})
    for mid in ids:
        add_member(state, make_member(mid, topics=("a",)), assignor)
    for _ in range(3):
        for mid in ids:
            if needs_release(state, mid):
                release(state, mid, to_release(state, mid))
    return state


def test_commit_of_an_owned_partition_is_accepted() -> None:
    state = joined("m1")
    validate_commit(state, "m1", None, state.generation, [TopicPartition("a", 0)])


def test_commit_by_an_evicted_member_names_group_partition_and_generations() -> None:
    state = joined("m1", "m2")
    gen = state.generation
    remove_members(state, ["m1"])
    with pytest.raises(CommitFailedError) as err:
        validate_commit(state, "m1", None, gen, [TopicPartition("a", 1)])
    text = str(err.value)
    assert "'orders-view'" in text and "m1" in text and f"generation {gen}" in text
    assert f"the group's {state.generation}" in text
    assert err.value.topic == "a" and err.value.partition == 1


def test_commit_for_a_partition_not_owned_is_rejected() -> None:
    state = joined("m1", "m2")
    theirs = state.members["m2"].owned
    tp = next(iter(theirs))
    with pytest.raises(CommitFailedError, match="does not own a-"):
        validate_commit(state, "m1", None, state.generation, [tp])


def test_commit_from_before_the_partition_was_regained_is_stale() -> None:
    """A delayed commit from an earlier ownership period of the same member is rejected."""
    state = joined("m1")
    old_generation = state.generation
    add_member(state, make_member("m2", topics=("a",)), "cooperative-sticky")
    release(state, "m1", to_release(state, "m1"))  # m1 gives two partitions to m2
    remove_members(state, ["m2"])  # ... and gets them back under a new generation
    regained = [tp for tp, since in state.members["m1"].owned.items() if since > old_generation]
    assert regained
    with pytest.raises(CommitFailedError, match="stale generation"):
        validate_commit(state, "m1", None, old_generation, regained)
    kept = [tp for tp, since in state.members["m1"].owned.items() if since <= old_generation]
    validate_commit(state, "m1", None, old_generation, kept)  # owned throughout: accepted


def test_commit_by_a_replaced_static_instance_is_fenced() -> None:
    state = GroupState("g")
    update_partitions(state, {"a": 2})
    add_member(state, make_member("old", topics=("a",), instance="worker-1"), "range")
    take_over(state, "old", make_member("new", topics=("a",), instance="worker-1"))
    with pytest.raises(CommitFailedError, match="is fenced"):
        validate_commit(state, "old", "worker-1", state.generation, [TopicPartition("a", 0)])
    assert set(state.members["new"].owned) == {TopicPartition("a", 0), TopicPartition("a", 1)}


def test_eager_protocol_revokes_everything_before_granting() -> None:
    state = joined("m1", assignor="range")
    add_member(state, make_member("m2", topics=("a",)), "range")
    assert state.members["m2"].owned == {}  # nothing granted before m1 released everything
    assert to_release(state, "m1") == {TopicPartition("a", p) for p in range(4)}
    release(state, "m1", to_release(state, "m1"))
    assert len(state.members["m1"].owned) == len(state.members["m2"].owned) == 2
    # A third member leaves: its partitions wait until both survivors released theirs.
    add_member(state, make_member("m3", topics=("a",)), "range")
    for mid in ("m1", "m2", "m3"):
        release(state, mid, to_release(state, mid))
    before = {mid: set(state.members[mid].owned) for mid in ("m1", "m2")}
    remove_members(state, ["m3"])
    assert {mid: set(state.members[mid].owned) for mid in ("m1", "m2")} == before
    release(state, "m1", to_release(state, "m1"))
    assert state.members["m1"].owned == {}
    assert set(state.members["m2"].owned) == before["m2"]
    release(state, "m2", to_release(state, "m2"))
    assert len(state.members["m1"].owned) == len(state.members["m2"].owned) == 2
