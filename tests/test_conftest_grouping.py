"""The suite's two workers keep together what must share one worker (tests/conftest.py).

A real ``pytest -n 2 --dist loadgroup`` run, with this suite's conftest as a plugin, of a small
module whose tests share a module-scoped fixture: every one of them must run on the same
worker, where the fixture is set up once. (With pytest 9 and pytest-xdist 3.8 the grouping was
silently lost: each worker started its own clusters and SparkSession.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROBE = """
import os
import pytest

@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    with open(os.environ["PROBE_OUT"], "a") as out:
        out.write("setup " + os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")
    return 1

@pytest.mark.parametrize("i", range(8))
def test_uses_the_shared_fixture(shared, i):
    with open(os.environ["PROBE_OUT"], "a") as out:
        out.write("test " + os.environ.get("PYTEST_XDIST_WORKER", "main") + "\\n")

@pytest.mark.parametrize("i", range(8))
def test_alone(i):
    pass
"""


def test_tests_of_a_module_fixture_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_probe.py").write_text(PROBE)
    out = tmp_path / "probe.txt"
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PROBE_OUT": str(out), "PYTHONPATH": str(root)}
    env.pop("PYTEST_XDIST_WORKER", None)

    def pytest(*options: str) -> None:
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", *options,
             "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path / "test_probe.py")],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    pytest("-p", "no:randomly")  # without workers the grouping hook must stay out of the way
    out.unlink()
    pytest("-n", "2", "--dist", "loadgroup")
    lines = out.read_text().splitlines()
    assert len([x for x in lines if x.startswith("test ")]) == 8
    workers = {x.split()[1] for x in lines}
    setups = [x for x in lines if x.startswith("setup ")]
    assert len(workers) == 1 and len(setups) == 1, lines
