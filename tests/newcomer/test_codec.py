"""Items 13, 14, 17: a codec without a runtime (golden files), an undeclared aggregate says
what to add to App(...), and a renamed field hints at a version bump and an upcaster."""

from __future__ import annotations

from pathlib import Path

from tests.newcomer.kit import python

GOLDEN_V1 = (
    b'{"type":"MemberRegistered","version":1,"aggregate_id":"member-0000",'
    b'"aggregate_version":1,"event_id":"44e32e1c-3771-48d2-9233-ae055bafed40",'
    b'"timestamp":"2026-11-24T18:28:00.181578+00:00","correlation_id":null,'
    b'"causation_id":null,"data":{"name":"Donald Thompson"}}'
)


def test_golden_file_decodes_without_a_runtime_or_data_directory(workdir: Path) -> None:
    (workdir / "golden.json").write_bytes(GOLDEN_V1)
    out = python(
        """
        from pathlib import Path
        from eventlane.testing import Scenario
        from library.app import app
        from library.domain import Member
        from library.events import MemberRegistered

        codec = app.codec()  # no app.open(): no log, no data directory
        env = codec.decode(None, Path("golden.json").read_bytes())
        print(env.event.first_name, env.event.last_name, env.schema_version)
        Scenario(Member, "m-1", codec=codec).given(MemberRegistered("Ada", "L")).when(
            lambda m: None).then()
        """,
        cwd=workdir,
    )
    assert out.split() == ["Donald", "Thompson", "2"]
    assert sorted(p.name for p in workdir.iterdir()) == ["golden.json", "library"]


def test_an_undeclared_aggregate_says_what_to_add(workdir: Path) -> None:
    out = python(
        """
        from eventlane.errors import ConfigError, UnknownEventTypeError
        from eventlane.codec import EventCodec, EventRegistry, Envelope
        from library.app import app
        from library.domain import Fine
        from library.events import FinePaid

        with app.open("d") as rt:
            for attempt in (
                lambda: rt.execute(Fine, "fine-1", lambda f: f.pay(5), create=True),
                lambda: rt.load(Fine, "fine-1"),
            ):
                try:
                    attempt()
                except ConfigError as err:
                    print(err)
        try:
            EventCodec(EventRegistry()).encode(Envelope(FinePaid(5), "fine-1", 1))
        except UnknownEventTypeError as err:
            print(err)
        """,
        cwd=workdir,
    )
    lines = out.splitlines()
    assert len(lines) == 3, out
    for line in lines[:2]:
        assert "add Fine to App(aggregates=[...])" in line and "it has Member, Loan" in line
    assert "add the aggregate that records it to App(aggregates=[...])" in lines[2]
    assert "add FinePaid to App(events=[...])" in lines[2]


def test_a_renamed_field_hints_at_a_version_bump(workdir: Path) -> None:
    renamed = GOLDEN_V1.replace(b'"version":1', b'"version":2').replace(
        b'{"name":"Donald Thompson"}', b'{"firstname":"Donald","last_name":"Thompson"}'
    )
    (workdir / "renamed.json").write_bytes(renamed)
    out = python(
        """
        from pathlib import Path
        from eventlane.errors import SerializationError
        from library.app import app

        try:
            app.codec().decode(None, Path("renamed.json").read_bytes(), topic="members",
                               partition=0, offset=7)
        except SerializationError as err:
            print(err)
        """,
        cwd=workdir,
    )
    assert "required field missing @ data.first_name" in out
    assert "renamed a field? (stored data has 'firstname')" in out
    assert "bump the version of 'MemberRegistered' and add an upcaster" in out
    assert "offset=7" in out
