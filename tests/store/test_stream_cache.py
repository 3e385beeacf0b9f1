"""The stream cache: a load reads only what changed since the stream was last read or saved,
and never returns less than a fresh read would, whoever appended (another runtime, another
OS process); personal data is never held; a stale entry cannot make a save go wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from attrs import frozen
from store_domain import Counter, CountingLog, Incremented, make_app, raw_streams
from store_helpers import finish, read_line, send, spawn

from eventlane import App, DomainEvent, event, personal, replay
from eventlane.app import Runtime
from eventlane.codec import Envelope
from eventlane.domain import Aggregate, applies
from eventlane.errors import ConcurrencyError
from eventlane.store.stream_cache import StreamCache


@pytest.fixture
def counting(tmp_path: Path) -> CountingLog:
    return CountingLog(tmp_path / "data")


def bump(app: Runtime, aggregate_id: str, times: int) -> None:
    for _ in range(times):
        app.execute(Counter, aggregate_id, lambda c: c.increment(), create=True)


def test_a_load_reads_only_what_changed(counting: CountingLog) -> None:
    with make_app(counting) as app:  # type: ignore[arg-type]
        bump(app, "c", 20)
        counting.reset_counts()
        counter = app.load(Counter, "c")
        assert (counter.version, counter.value) == (20, 20)
        assert counting.records_read == 0, "saved by this runtime: served from the cache"

        with make_app(counting.path) as other:  # another runtime: its own log and cache
            bump(other, "c", 3)
        counting.reset_counts()
        counter = app.load(Counter, "c")
        assert (counter.version, counter.value) == (23, 23)
        assert counting.records_read == 3, "only the records appended since are read"
        assert app.load(Counter, "c", version=7).value == 7
        assert counting.records_read == 3


def test_another_process_appends_and_the_next_load_sees_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with make_app(data) as app:
        bump(app, "hot", 5)
        assert app.load(Counter, "hot").version == 5  # cached
        proc = spawn("execute", data=str(data), aggregate="hot", count=40, writer="child")
        assert read_line(proc) == "R"
        send(proc, "GO")
        assert read_line(proc).split()[0] == "D"
        finish(proc)
        counter = app.load(Counter, "hot")
        assert (counter.version, counter.value) == (45, 45)
        # and a command on the cached stream continues it, exactly once
        bump(app, "hot", 1)
        versions = [d["aggregate_version"] for d in raw_streams(app.log, "counters")["hot"]]
    assert versions == list(range(1, 47))


def test_a_save_from_a_stale_load_is_refused_and_the_retry_sees_the_change(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with make_app(data) as app, make_app(data) as other:
        bump(app, "c", 2)
        stale = app.load(Counter, "c")
        bump(other, "c", 1)  # app's cache still holds version 2
        stale.increment()
        with pytest.raises(ConcurrencyError):
            app.save(stale)
        assert app.execute(Counter, "c", lambda c: c.increment()).version == 4
        assert other.load(Counter, "c").value == 4
        versions = [d["aggregate_version"] for d in raw_streams(app.log, "counters")["c"]]
    assert versions == [1, 2, 3, 4]


def test_a_recreated_topic_is_not_served_from_the_cache(tmp_path: Path) -> None:
    with make_app(tmp_path / "data") as app:
        bump(app, "c", 3)
        assert app.load(Counter, "c").value == 3
        app.log.delete_topic("counters")
        app.log.create_topic("counters", 2, {"retention_ms": -1})
        bump(app, "c", 1)
        counter = app.load(Counter, "c")
    assert (counter.version, counter.value) == (1, 1)


@event("CacheLaterType")
@frozen
class LaterType(DomainEvent):
    note: str


def test_a_registry_change_empties_the_cache(counting: CountingLog) -> None:
    """Upcasters, aliases or types added after a stream was cached may decode its records
    differently: the next load decodes them again."""
    with make_app(counting) as app:  # type: ignore[arg-type]
        bump(app, "c", 4)
        assert app.load(Counter, "c").value == 4
        app.registry.register(LaterType)
        counting.reset_counts()
        assert app.load(Counter, "c").value == 4
        assert counting.records_read == 4


def test_cache_off_reads_every_time(counting: CountingLog) -> None:
    with make_app(counting, cache_events=0) as app:  # type: ignore[arg-type]
        bump(app, "c", 5)
        counting.reset_counts()
        assert app.load(Counter, "c").value == 5
        assert counting.records_read == 5
        assert app.store.cache is None


# ---------------------------------------------------------------- personal data
@event("CacheMemberJoined")
@frozen
class Joined(DomainEvent):
    name: str = personal(erased="(forgotten)")


class Member(Aggregate):
    topic = "cache_members"
    name: str

    def init_state(self) -> None:
        self.name = ""

    @applies
    def _joined(self, e: Joined) -> None:
        self.name = e.name


def test_personal_data_is_never_cached_and_forget_shows_at_once(tmp_path: Path) -> None:
    app = App("cachepriv", aggregates=[Member], partitions=1)
    with app.open(tmp_path / "data") as rt:
        member = Member("m-1")
        member.record_that(Joined("Ada Lovelace"))
        rt.save(member)
        assert rt.load(Member, "m-1").name == "Ada Lovelace"
        assert rt.store.cache is not None and len(rt.store.cache) == 0
        replay.forget(rt, ["m-1"], scan=False, rebuild_readmodels=False)
        assert rt.load(Member, "m-1").name == "(forgotten)"


# ---------------------------------------------------------------- the cache alone
def envelopes(aggregate_id: str, count: int) -> list[Envelope[Incremented]]:
    return [Envelope(Incremented(1), aggregate_id, v) for v in range(1, count + 1)]


def test_the_cache_is_bounded_by_events_least_recently_used_first_out() -> None:
    cache = StreamCache(max_events=40)
    for name in ("a", "b", "c"):
        cache.put("t", name, envelopes(name, 10), range(10), 0)
    assert cache.get("t", "a", 0) is not None  # a is now the most recently used
    cache.put("t", "d", envelopes("d", 10), range(100, 110), 0)
    cache.put("t", "e", envelopes("e", 10), range(200, 210), 0)
    assert [n for n in "abcde" if cache.get("t", n, 0) is not None] == ["a", "c", "d", "e"]
    cache.put("t", "long", envelopes("long", 11), range(11), 0)  # > max_events / 4
    assert cache.get("t", "long", 0) is None
    assert cache.get("t", "a", 1) is None, "another registry generation empties it"
    assert len(cache) == 0


def test_extend_adds_only_to_the_stream_it_continues() -> None:
    cache = StreamCache()
    cache.put("t", "a", envelopes("a", 3), [5, 9, 12], 0)
    more = [Envelope(Incremented(1), "a", 4)]
    cache.extend("t", "a", 3, 12, more, [20], 0)
    entry = cache.get("t", "a", 0)
    assert entry is not None and entry.offsets == (5, 9, 12, 20)
    cache.extend("t", "a", 3, 12, more, [30], 0)  # built on version 3 again: a fork
    assert cache.get("t", "a", 0) is None
