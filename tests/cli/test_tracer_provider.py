"""``tracer()`` asks the OpenTelemetry API for its provider once, then reads the API's
global: a provider set later (or named by the environment) is still picked up at once."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import opentelemetry.trace as trace
    from opentelemetry.sdk.trace import TracerProvider
    from eventlane.tracing import tracer
    calls = []
    real = trace.get_tracer_provider
    trace.get_tracer_provider = lambda: calls.append(1) or real()
    assert [tracer() for _ in range(100)] == [None] * 100
    assert len(calls) == 1, calls
    trace.set_tracer_provider(TracerProvider())
    assert tracer() is not None and tracer() is tracer()
    print("ok")
    """
)

ENV_CHILD = textwrap.dedent(
    """
    from opentelemetry import trace
    from eventlane.tracing import tracer
    assert tracer() is not None, "the provider the environment names"
    print("ok")
    """
)


def _run(code: str, **env: str) -> str:
    import os  # noqa: PLC0415

    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_the_provider_is_asked_once_and_a_later_one_is_seen() -> None:
    assert _run(CHILD) == "ok"


def test_a_provider_named_by_the_environment_is_used() -> None:
    assert _run(ENV_CHILD, OTEL_PYTHON_TRACER_PROVIDER="sdk_tracer_provider") == "ok"
