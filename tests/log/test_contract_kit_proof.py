"""The contract kit proves itself: run against deliberately broken engines
(tests/log/broken_engines.py), its run fails, at the named tests and for the stated reason;
against an engine that honestly declares less, the tests of what it lacks are skipped with
the flag named; against the real embedded engine, everything passes.

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
KEY_READ_TESTS = {
    "test_conditional_append",
    "test_conditional_append_under_contention",
    "test_conditional_append_across_processes",
    "test_per_key_reads",
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, tuple[str, str]]]:
    """{engine: {test: (outcome, message)}} of one pytest run of the kit over every engine."""
    tmp = tmp_path_factory.mktemp("kit")
    engines = [*CAUGHT, "DeclaresNoKeyReads", "LogStore"]
    module = [
        "from framework.log import LogStore",
        "from framework.testing.contracts import LogContract",
    ]
    module.append(f"from broken_engines import {', '.join(e for e in engines if e != 'LogStore')}")
    for engine in engines:
        module.append(
            textwrap.dedent(f"""
            class Test{engine}(LogContract):
                def make_log(self, directory, clock):
                    return {engine}(directory, clock=clock)
            """)
        )
    (tmp / "test_kit_run.py").write_text("\n".join(module) + "\n")
    (tmp / "pytest.ini").write_text("[pytest]\n")
    # broken engines and the real one (the control) run the tests that must catch them; the
    # honest engine that declares less runs the whole kit
    caught = sorted({t for tests in CAUGHT.values() for t in tests})
    targets = [f"test_kit_run.py::Test{e}::{t}" for e, tests in CAUGHT.items() for t in tests]
    targets += [f"test_kit_run.py::TestLogStore::{t}" for t in caught]
    targets.append("test_kit_run.py::TestDeclaresNoKeyReads")
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


def test_an_engine_declaring_no_key_reads_is_skipped_there_not_failed(outcomes) -> None:
    results = outcomes["DeclaresNoKeyReads"]
    assert [t for t, (o, _) in results.items() if o in ("failure", "error")] == []
    skipped = {t: m for t, (o, m) in results.items() if o == "skipped"}
    assert set(skipped) == KEY_READ_TESTS
    assert all("capabilities.key_reads" in m for m in skipped.values())


def test_the_real_engine_passes_what_catches_the_broken_ones(outcomes) -> None:
    """The control: the same tests pass on the real engine (test_log_contract.py runs the
    whole kit on it)."""
    results = outcomes["LogStore"]
    assert set(results) == {t for tests in CAUGHT.values() for t in tests}
    assert {t: o for t, (o, _) in results.items() if o != "passed"} == {}
