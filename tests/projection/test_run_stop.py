"""``eventlane run`` stops within one grace however many workers are frozen (adversarial
review, 2026-11-29): SIGTERM reaches every worker of every projector at once, and the
workers still running when ``--stop-grace`` ends are killed, each named on stderr. Real
processes, real SIGSTOP. Seen failing before: 2 frozen workers of 2 projectors took 62 s
(30 s each, one projector after the other, the healthy ones signalled only after), silently.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
CLI = "from eventlane.cli import main; main(prog_name='eventlane')"
APP = "example_apps.invoicing:app"
GRACE = 3.0


def test_sigterm_stops_every_worker_within_one_grace(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EVENTLANE_LOG_LEVEL": "warning"}
    base = [sys.executable, "-c", CLI, "--data", str(data)]
    subprocess.run([*base, "migrate", APP], env=env, cwd=ROOT, check=True, capture_output=True)
    err = tmp_path / "run.err"
    proc = subprocess.Popen(
        [*base, "run", APP, "--stop-grace", str(GRACE)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=err.open("wb"),
    )
    frozen: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120
        workers: dict[str, psutil.Process] = {}
        while len(workers) < 5:  # the invoicing app's five projectors and policies
            assert time.monotonic() < deadline and proc.poll() is None, err.read_text()[-2000:]
            for child in psutil.Process(proc.pid).children():
                argv = child.cmdline()  # ... project worker APP NAME [options]
                if "worker" in argv and len(argv) > argv.index("worker") + 2:
                    workers.setdefault(argv[argv.index("worker") + 2], child)
            time.sleep(0.2)
        frozen = [workers["customer_balances"], workers["orders_by_status"]]
        for worker in frozen:
            worker.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0, err.read_text()[-3000:]
        took = time.monotonic() - started
    finally:
        for worker in frozen:
            if worker.is_running():
                worker.send_signal(signal.SIGCONT)
                worker.kill()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert took < 2 * GRACE + 5, f"stopped {took:.1f} s after SIGTERM (grace {GRACE} s)"
    killed = [line for line in err.read_text().splitlines() if "did not stop" in line]
    assert len(killed) == 2, killed
    for worker, projector in zip(frozen, ("customer_balances", "orders_by_status"), strict=True):
        assert any(f"pid={worker.pid}" in line and projector in line for line in killed), killed
