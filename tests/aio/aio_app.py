"""An app with an ``async def`` policy, for worker processes (``aio_app:app``; the tests put
this directory and ``tests/store`` on ``PYTHONPATH``).

``Echo`` reacts to every ``Incremented`` of a counter: it awaits a 10 ms "remote call"
(at-least-once: counted in ``$AIO_CALLS`` files, one line per call) and then issues one
``SnapCounter`` increment on ``echo-<counter>-<version>`` (exactly once per event, by the
causation check of ``ctx.issue``).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from store_domain import Counter, Incremented, SnapCounter

from eventlane import App, EventContext, Projector, handles

REMOTE_CALL_S = 0.01


def echo_id(counter: str, version: int) -> str:
    return f"echo-{counter}-{version}"


class Echo(Projector):
    name = "echo"
    topics = ("counters",)
    policy = True
    concurrency = 64

    @handles(Incremented)
    async def incremented(self, event: Incremented, ctx: EventContext) -> None:
        await asyncio.sleep(REMOTE_CALL_S)  # the remote call
        calls = os.environ.get("AIO_CALLS")
        if calls:
            with open(calls, "a") as out:
                out.write(f"{ctx.aggregate_id} {ctx.aggregate_version}\n")
        await ctx.issue_async(SnapCounter, echo_id(ctx.aggregate_id, ctx.aggregate_version), _bump)


def _bump(counter: Any) -> None:
    if counter.version == 0:
        counter.increment(1)


app = App("aio", aggregates=[Counter, SnapCounter], projectors=[Echo], partitions=4)
