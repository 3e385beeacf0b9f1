"""The cattrs converter that turns events into JSON-ready values and back.

Built with :func:`cattrs.preconf.orjson.make_converter` (never cattrs' global converter)
and tuned for events. Formats, all exact on round-trip:

=====================  ==================================================================
Python type            JSON
=====================  ==================================================================
``str``/``bool``       string / ``true``, ``false``; structuring is strict: no coercion
``int``                number (signed or unsigned 64-bit range: orjson's limit)
``float``              number (shortest repr); NaN and ±inf are refused on encode
``decimal.Decimal``    string, ``str(d)`` (``"12.50"``, ``"1E+2"``): digits and exponent kept
``datetime``           string, ``isoformat()``: ``2024-05-01T12:00:00.000123+02:00``; the
                       UTC offset is kept to the second (a ``ZoneInfo`` comes back as the
                       equivalent fixed offset; an offset with a fraction of a second is
                       refused); a naive datetime stays naive
``date``               string, ``2024-05-01``
``uuid.UUID``          string, canonical hyphenated lower case
``enum.Enum``          the member's value
``bytes``              string, base85 (orjson preconf)
attrs class            object, one key per field (attribute name; private ``_x`` → ``x``)
``tuple``/``list``     array (a tuple comes back as a tuple)
``dict[str, V]``       object
``X | None``           ``null`` or X
=====================  ==================================================================

Structuring is strict about primitive JSON types (``"5"`` is not an ``int``; ``1.5`` is
not an ``int``; an ``int`` is accepted for a ``float``), so wrong field types are errors,
never silent coercions.

Two converters exist per codec: the fast one (``detailed_validation=False``) decodes;
when it fails, the same data is structured again by a detailed one only to render a
readable message (:func:`describe_structure_error`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from decimal import Decimal, InvalidOperation
from types import NoneType, UnionType
from typing import Any, NoReturn, Union, get_args, get_origin
from uuid import UUID, SafeUUID

import attrs
import cattrs
from cattrs.preconf.orjson import OrjsonConverter
from cattrs.preconf.orjson import make_converter as _make_orjson_converter
from cattrs.v import format_exception

__all__ = [
    "OrjsonConverter",
    "describe_structure_error",
    "fast_structure_fn",
    "make_converter",
    "parse_uuid",
]


def _wrong_type(value: object, expected: str) -> NoReturn:
    raise TypeError(f"expected {expected}, got {type(value).__name__}")


# These hooks also serve subclasses (``IntEnum``, ``str`` enums): the JSON type is checked
# strictly, then a subclass is built by calling it, as cattrs' own primitive hook does.


def _structure_str(value: Any, cls: type) -> Any:
    if value.__class__ is str:
        return value if cls is str else cls(value)
    _wrong_type(value, "a string")


def _structure_int(value: Any, cls: type) -> Any:
    if value.__class__ is int:
        return value if cls is int else cls(value)
    _wrong_type(value, "an integer")


def _structure_float(value: Any, cls: type) -> Any:
    kind = value.__class__
    if kind is float:
        return value if cls is float else cls(value)
    if kind is int:
        return float(value) if cls is float else cls(value)
    _wrong_type(value, "a number")


def _structure_bool(value: Any, _: type) -> bool:
    if value.__class__ is bool:
        return value
    _wrong_type(value, "a boolean")


def _unstructure_float(value: float) -> float:
    if value - value != 0.0:  # NaN or ±inf: orjson would silently write null
        raise ValueError(f"cannot encode non-finite float {value!r} as JSON")
    return value


def _structure_decimal(value: Any, _: type) -> Decimal:
    cls = value.__class__
    if cls is str or cls is int:
        try:
            return Decimal(value)
        except InvalidOperation:
            raise ValueError(f"not a decimal number: {value!r}") from None
    _wrong_type(value, "a decimal string")


_new_object = object.__new__
_set_slot = object.__setattr__
_SAFE_UNKNOWN = SafeUUID.unknown


def parse_uuid(text: str) -> UUID:
    """``UUID(text)``, about 3x faster for the canonical form ``8-4-4-4-12`` hex digits.

    Anything else goes through ``UUID(text)`` itself, with its rules and errors.
    """
    if len(text) == 36 and text[8] == text[13] == text[18] == text[23] == "-":
        digits = text.replace("-", "")
        if len(digits) == 32 and digits.isascii() and digits.isalnum():
            # Built exactly as UUID.__init__ does it: two slots set with object.__setattr__.
            uuid = _new_object(UUID)
            _set_slot(uuid, "int", int(digits, 16))
            _set_slot(uuid, "is_safe", _SAFE_UNKNOWN)
            return uuid
    return UUID(text)


def _structure_uuid(value: Any, _: type) -> UUID:
    if value.__class__ is str:
        return parse_uuid(value)
    _wrong_type(value, "a UUID string")


def _unstructure_datetime(value: datetime) -> str:
    offset = value.utcoffset()
    if offset is not None and offset.microseconds:
        # Python 3.11's fromisoformat misreads such offsets; no real time zone has one.
        raise ValueError(f"cannot encode a UTC offset with fractions of a second: {offset}")
    return value.isoformat()


def _structure_datetime(value: Any, _: type) -> datetime:
    if value.__class__ is str:
        return datetime.fromisoformat(value)
    _wrong_type(value, "an ISO 8601 string")


def make_converter(*, detailed_validation: bool = False) -> OrjsonConverter:
    """A new converter configured as the module docstring describes.

    Structure and unstructure functions for attrs classes are generated (cattrs ``gen``)
    and cached per class on first use; extra keys in input objects are ignored.
    """
    converter = _make_orjson_converter(
        detailed_validation=detailed_validation, forbid_extra_keys=False
    )
    converter.register_structure_hook(str, _structure_str)
    converter.register_structure_hook(int, _structure_int)
    converter.register_structure_hook(float, _structure_float)
    converter.register_structure_hook(bool, _structure_bool)
    converter.register_unstructure_hook(float, _unstructure_float)
    converter.register_unstructure_hook(Decimal, str)
    converter.register_structure_hook(Decimal, _structure_decimal)
    converter.register_structure_hook(UUID, _structure_uuid)
    converter.register_unstructure_hook(datetime, _unstructure_datetime)
    converter.register_structure_hook(datetime, _structure_datetime)
    return converter


_EXACT = (str, int, bool, float)


def _exact_check(var: str, tp: Any) -> str | None:
    """A Python condition true when ``var`` is *not* exactly of JSON-native type ``tp``."""
    if tp in _EXACT:
        return f"{var}.__class__ is not {tp.__name__}"
    if get_origin(tp) in (Union, UnionType):
        members = [m for m in get_args(tp) if m is not NoneType]
        if len(members) == 1 and len(get_args(tp)) == 2 and members[0] in _EXACT:
            return f"({var} is not None and {var}.__class__ is not {members[0].__name__})"
    return None


def fast_structure_fn(
    cls: type, fallback: Callable[[Any, type], Any]
) -> Callable[[Any, type], Any] | None:
    """A structure function for ``cls`` specialised to its fields, or ``None``.

    Made for attrs classes whose every field is a ``str``, ``int``, ``bool``, ``float`` or
    one of those ``| None`` (the common event). It reads each key, checks each value's exact
    JSON type and calls ``cls`` once, with no call per field; any other input (a missing key,
    a value of another type, a float field holding an int) goes to ``fallback`` (the
    converter's generated hook), so results and errors are exactly the converter's own.
    """
    if not attrs.has(cls):
        return None
    try:
        attrs.resolve_types(cls)  # string annotations (PEP 563) become types
    except Exception:  # an annotation that does not resolve: leave it to cattrs
        return None
    fields = attrs.fields(cls)
    reads, checks, args = [], [], []
    for i, f in enumerate(fields):
        if not f.init or f.name.startswith("_") or f.alias != f.name:
            return None
        check = _exact_check(f"v{i}", f.type)
        if check is None:
            return None
        reads.append(f"v{i} = d[{f.name!r}]")
        checks.append(check)
        args.append(f"{f.name}=v{i}" if f.kw_only else f"v{i}")
    if not fields:
        return None
    body = "\n".join(
        [
            "def structure(d, _cls):",
            "    try:",
            *(f"        {r}" for r in reads),
            "    except (KeyError, TypeError):",
            "        return fallback(d, cls)",
            f"    if {' or '.join(checks)}:",
            "        return fallback(d, cls)",
            f"    return cls({', '.join(args)})",
        ]
    )
    namespace: dict[str, Any] = {"cls": cls, "fallback": fallback}
    exec(compile(body, f"<eventlane fast structure {cls.__qualname__}>", "exec"), namespace)
    fn: Callable[[Any, type], Any] = namespace["structure"]
    return fn


def _format_exception(exc: BaseException, type_: type | None) -> str:
    if isinstance(exc, KeyError):
        return "required field missing"
    expected = "" if type_ is None else getattr(type_, "__name__", repr(type_))
    if isinstance(exc, TypeError) and str(exc).startswith("expected "):
        return str(exc)  # raised by this module's strict hooks
    if isinstance(exc, (TypeError, ValueError, ArithmeticError)) and expected:
        return f"invalid value for {expected} ({exc})" if str(exc) else f"expected {expected}"
    return format_exception(exc, type_)


def describe_structure_error(exc: BaseException, *, root: str = "$") -> str:
    """Render a structuring failure as ``"<what> @ <path>; …"`` (via ``transform_error``).

    ``exc`` should come from a converter made with ``detailed_validation=True``, so every
    failing field is listed with its path, e.g.
    ``"expected an integer, got str @ data.quantity; required field missing @ data.sku"``.
    """
    if isinstance(exc, cattrs.BaseValidationError):
        return "; ".join(cattrs.transform_error(exc, root, _format_exception))
    return f"{_format_exception(exc, None)} @ {root}"
