"""What the console's message browser and live tail filter records by (:class:`Filters`)."""

from __future__ import annotations

from typing import Any

import orjson

from eventlane.log import Record

__all__ = ["Filters"]


class Filters:
    """What the browser and the live tail filter records by (all optional, AND-ed).

    ``header`` is ``name=value`` (``event-type=OrderPlaced``) or a bare value matched against
    the ``event-type`` header; ``text`` a substring of the value; ``jpath`` a dotted path into
    the JSON value (``data.customer_id``, list items as ``lines.0.sku``), optionally
    ``=value`` (compared with the JSON scalar's text).
    """

    def __init__(
        self,
        *,
        key: str | None = None,
        header: str | None = None,
        text: str | None = None,
        jpath: str | None = None,
    ) -> None:
        self.key = key or None
        self.key_bytes = key.encode() if key else None
        name, sep, value = (header or "").partition("=")
        self.header: tuple[str, bytes] | None = None
        if header:
            self.header = (name.strip(), value.encode()) if sep else ("event-type", name.encode())
        self.text = text.encode() if text else None
        self.jpath: list[str] | None = None
        self.jvalue: str | None = None
        if jpath:
            path, sep, want = jpath.partition("=")
            self.jpath = [p for p in path.strip().removeprefix("$").split(".") if p]
            self.jvalue = want if sep else None

    def active(self) -> bool:
        return any(x is not None for x in (self.key, self.header, self.text, self.jpath))

    def match(self, record: Record) -> bool:
        if self.key_bytes is not None and record.key != self.key_bytes:
            return False
        if self.header is not None and self.header not in [(n, v) for n, v in record.headers]:
            return False
        value = record.value or b""
        if self.text is not None and self.text not in value:
            return False
        if self.jpath is not None:
            try:
                node: Any = orjson.loads(value)
            except orjson.JSONDecodeError:
                return False
            for step in self.jpath:
                if isinstance(node, dict) and step in node:
                    node = node[step]
                elif isinstance(node, list) and step.isdigit() and int(step) < len(node):
                    node = node[int(step)]
                else:
                    return False
            if self.jvalue is not None:
                text = node if isinstance(node, str) else orjson.dumps(node).decode()
                return bool(text == self.jvalue)
        return True

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "header": None if self.header is None else f"{self.header[0]}={self.header[1]!r}",
            "text": None if self.text is None else self.text.decode(),
            "jpath": None if self.jpath is None else ".".join(self.jpath),
        }
