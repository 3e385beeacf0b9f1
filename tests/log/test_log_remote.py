"""Shared pieces of the cluster engines: log URLs, the wake sequence, local servers by PID."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

from eventlane.errors import ConfigError
from eventlane.log.processes import alive, free_ports, stop_pid
from eventlane.log.remote import WakeSequence, parse_log_url


def test_log_urls_parse_hosts_and_known_options_only() -> None:
    options = {"namespace": str, "replicas": int}
    assert parse_log_url("nats://a:1,b:2,?replicas=3&replicas=1", "nats", options) == (
        ["a:1", "b:2"],
        {"replicas": 1},
    )
    for bad in ("kafka://a:1", "nats://", "nats://a:1?colour=red", "nats://a:1?replicas=x"):
        with pytest.raises(ConfigError):
            parse_log_url(bad, "nats", options)


def test_a_waiter_wakes_on_a_bump_from_another_thread_and_times_out_without() -> None:
    seq = WakeSequence()
    seen = seq.current()
    started = time.monotonic()
    seq.wait(seen, 0.05)
    assert time.monotonic() - started >= 0.04  # nothing happened: the timeout
    threading.Timer(0.05, seq.bump).start()
    started = time.monotonic()
    seq.wait(seen, 10.0)
    assert seq.current() == seen + 1
    assert time.monotonic() - started < 5.0


def test_stop_pid_ends_a_process_that_ignores_sigterm() -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        " print('ready', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        assert alive(proc.pid)
        started = time.monotonic()
        stop_pid(proc.pid, signal.SIGTERM, grace=0.5)
        assert not alive(proc.pid)  # (alive reaped it: Popen no longer has its status)
        assert time.monotonic() - started >= 0.5  # SIGTERM was ignored: SIGKILL ended it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ports = free_ports(3)
    assert len(set(ports)) == 3
