"""The contract kit proves itself: run against deliberately broken engines
(tests/log/broken_engines.py), its run fails, at the named tests and for the stated reason;
an engine with the core role only passes the core kit (nothing skipped); a kit class that
runs fewer or more role kits than its engine has fails; against the real embedded engine,
everything passes.

The kit runs as a user runs it: a test module subclassing :class:`LogContract`, collected
and run by pytest in a child process (one run for all engines), read back from its JUnit
XML report.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# engine class -> {kit test that must fail: a phrase its failure must contain}
CAUGHT: dict[str, dict[str, str]] = {
    "CheckThenAppend": {
        "test_conditional_append_under_contention": "forked history",
        "test_conditional_append_across_processes": "forked history",
    },
    "ThreadLockedExpect": {"test_conditional_append_across_processes": "forked history"},
    "NoOpCompaction": {
        "test_compaction_keeps_each_keys_last_record": "kept",
    },
    "NoOpRetention": {
        "test_size_retention_advances_the_low_water_mark": "did not advance the low-water mark",
    },
    "ForgetsOnReopen": {"test_everything_acknowledged_survives_reopen": "topics lost"},
    "SplitsAtomicBatches": {
        "test_atomic_batch_is_seen_whole_or_not_at_all": "part of an atomic batch was visible",
    },
}
ALL_KITS = "KeyedLogContract, MaintainedLogContract, FencedLogContract"


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, tuple[str, str]]]:
    """{engine: {test: (outcome, message)}} of one pytest run of the kit over every engine."""
    tmp = tmp_path_factory.mktemp("kit")
    # (test class, engine, the kits it runs)
    classes = [(e, e, ALL_KITS) for e in [*CAUGHT, "LogStore"]]
    classes += [
        ("CoreOnly", "CoreOnly", "LogContract"),
        ("CoreOnlyAsKeyed", "CoreOnly", "KeyedLogContract"),  # claims a role it lacks
        ("LogStoreAsCore", "LogStore", "LogContract"),  # leaves roles it has untested
    ]
    module = [
        "from eventlane.log import LogStore",
        "from eventlane.testing.contracts import LogContract, " + ALL_KITS,
        f"from broken_engines import CoreOnly, {', '.join(CAUGHT)}",
    ]
    for name, engine, kits in classes:
        module.append(
            textwrap.dedent(f"""
            class Test{name}({kits}):
                def make_log(self, directory, clock):
                    return {engine}(directory, clock=clock)
            """)
        )
    (tmp / "test_kit_run.py").write_text("\n".join(module) + "\n")
    (tmp / "pytest.ini").write_text("[pytest]\n")
    # broken engines and the real one (the control) run the tests that must catch them; the
    # core-only engine runs the whole core kit; the mismatched classes their role check
    caught = sorted({t for tests in CAUGHT.values() for t in tests})
    targets = [f"test_kit_run.py::Test{e}::{t}" for e, tests in CAUGHT.items() for t in tests]
    targets += [f"test_kit_run.py::TestLogStore::{t}" for t in caught]
    targets.append("test_kit_run.py::TestCoreOnly")
    targets += [
        f"test_kit_run.py::Test{c}::test_claims_exactly_its_roles"
        for c in ("CoreOnlyAsKeyed", "LogStoreAsCore", "LogStore")
    ]
    report = tmp / "report.xml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--timeout=120",  # a kit test that hangs on a broken engine fails, not the run
            f"--junitxml={report}",
            *targets,
        ],
        check=False,
        cwd=tmp,
        env=env,
        capture_output=True,
        timeout=900,
    )
    assert report.exists(), run.stdout.decode()[-3000:] + run.stderr.decode()[-3000:]
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        engine = case.get("classname", "").rsplit(".", 1)[-1].removeprefix("Test")
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = tag
                message = (found.get("message") or "") + "\n" + (found.text or "")
        out.setdefault(engine, {})[case.get("name", "")] = (outcome, message)
    return out


@pytest.mark.parametrize("engine", sorted(CAUGHT))
def test_the_kit_catches_a_broken_engine(outcomes, engine: str) -> None:
    results = outcomes[engine]
    for test, phrase in CAUGHT[engine].items():
        outcome, message = results[test]
        assert outcome == "failure", f"{engine}: {test} did not fail ({outcome})"
        assert phrase in message, f"{engine}: {test} failed for another reason:\n{message[-2000:]}"
    print(engine, "fails:", sorted(t for t, (o, _) in results.items() if o != "passed"))


def test_an_engine_with_the_core_role_only_passes_the_core_kit(outcomes) -> None:
    results = outcomes["CoreOnly"]
    assert {t: o for t, (o, _) in results.items() if o != "passed"} == {}
    assert "test_claims_exactly_its_roles" in results
    assert len(results) >= 25  # the whole core kit ran, nothing skipped


def test_a_kit_class_must_run_exactly_the_roles_of_its_engine(outcomes) -> None:
    outcome, message = outcomes["CoreOnlyAsKeyed"]["test_claims_exactly_its_roles"]
    assert outcome == "failure" and "does not implement KeyedLog" in message, message
    outcome, message = outcomes["LogStoreAsCore"]["test_claims_exactly_its_roles"]
    assert outcome == "failure", message
    assert "implements KeyedLog: run its kit, KeyedLogContract, too" in message, message


def test_the_real_engine_passes_what_catches_the_broken_ones(outcomes) -> None:
    """The control: the same tests pass on the real engine (test_log_contract.py runs the
    whole kit on it)."""
    results = outcomes["LogStore"]
    assert set(results) == {t for tests in CAUGHT.values() for t in tests} | {
        "test_claims_exactly_its_roles"
    }
    assert {t: o for t, (o, _) in results.items() if o != "passed"} == {}
