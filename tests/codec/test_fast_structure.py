"""The specialised structure functions agree with the cattrs converter on every input.

``fast_structure_fn`` only takes inputs whose every field is present with its exact JSON
type and hands anything else to the converter, so for any ``data`` both must give an equal
event, or both fail (the codec then renders the converter's own detailed error).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import attrs
import pytest
from attrs import field, frozen
from hypothesis import given
from hypothesis import strategies as st

from eventlane.codec.converter import fast_structure_fn, make_converter


@frozen
class Simple:
    amount: int
    memo: str = ""
    rate: float = 1.0
    ok: bool = False
    note: str | None = None


@frozen
class KwOnly:
    a: int
    b: str = field(kw_only=True)


@frozen
class Validated:
    n: int = field(validator=attrs.validators.ge(0))


@frozen
class Nested:
    at: datetime


@frozen
class Private:
    _x: int


json_values = (
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False)
    | st.text(max_size=3)
)


def _outcome(fn: Any, data: Any, cls: type) -> Any:
    try:
        return fn(data, cls)
    except Exception as exc:
        return type(exc)


@pytest.mark.parametrize("cls", [Simple, KwOnly, Validated])
@given(data=st.data())
def test_fast_structure_agrees_with_cattrs(cls: type, data: st.DataObject) -> None:
    converter = make_converter()
    slow = converter.get_structure_hook(cls)
    fast = fast_structure_fn(cls, slow)
    assert fast is not None
    names = [f.name for f in attrs.fields(cls)]
    doc = data.draw(
        st.dictionaries(st.sampled_from([*names, "extra"]), json_values, max_size=len(names) + 1)
    )
    expected, got = _outcome(slow, doc, cls), _outcome(fast, doc, cls)
    assert got == expected
    if not isinstance(expected, type):
        assert type(got) is cls


def test_fast_path_builds_the_event_without_the_fallback() -> None:
    def refuse(data: Any, cls: type) -> Any:
        raise AssertionError("fallback used")

    fast = fast_structure_fn(Simple, refuse)
    assert fast is not None
    doc = {"amount": 3, "memo": "m", "rate": 2.5, "ok": True, "note": None}
    assert fast(doc, Simple) == Simple(3, "m", 2.5, True, None)


@pytest.mark.parametrize("cls", [Nested, Private, int])
def test_classes_outside_the_fast_path_get_none(cls: type) -> None:
    assert fast_structure_fn(cls, make_converter().get_structure_hook(cls)) is None
