"""The async plan driver's ``answer`` (eventlane/_plans.py, issue 30): a step answered from
memory is not awaited, its answer (or exception) goes into the plan exactly as an awaited
step's would, and every other step is performed once, in order."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any

import pytest

from eventlane import _plans


def plan(steps: list[str]) -> Generator[str, Any, list[Any]]:
    seen: list[Any] = []
    for step in steps:
        try:
            seen.append((yield step))
        except KeyError as exc:
            seen.append(f"caught {exc.args[0]}")
    return seen


def test_answered_steps_are_not_performed_and_their_answers_and_errors_go_in() -> None:
    performed: list[str] = []

    async def perform(step: str) -> str:
        performed.append(step)
        if step == "fails":
            raise KeyError("performed")
        return f"performed {step}"

    def answer(step: str) -> Any:
        if step.startswith("memo"):
            return f"answered {step}"
        if step == "wrong":
            raise KeyError("answered")
        return _plans.ASK

    steps = ["a", "memo-1", "wrong", "fails", "memo-2", "b"]
    seen = asyncio.run(_plans.drive_async(plan(steps), perform, answer))
    assert seen == [
        "performed a",
        "answered memo-1",
        "caught answered",
        "caught performed",
        "answered memo-2",
        "performed b",
    ]
    assert performed == ["a", "fails", "b"]
    # without ``answer`` every step is performed
    performed.clear()
    assert asyncio.run(_plans.drive_async(plan(["memo-1"]), perform)) == ["performed memo-1"]
    assert performed == ["memo-1"]


def test_an_answer_of_none_is_an_answer() -> None:
    async def perform(step: str) -> str:
        raise AssertionError(step)

    assert asyncio.run(_plans.drive_async(plan(["x"]), perform, lambda step: None)) == [None]


def test_a_base_exception_of_an_answer_leaves_the_plan() -> None:
    async def perform(step: str) -> str:
        return step

    def answer(step: str) -> Any:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(_plans.drive_async(plan(["x"]), perform, answer))
