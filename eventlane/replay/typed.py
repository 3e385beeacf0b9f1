"""Typed event DataFrames: the history of one event type, one column per attrs field.

    orders = event_frame(spark, app, DATA, OrderPlaced, topics=["orders"])   # or a nats:// URL
    orders.groupBy("customer_id").count()

Each row is one event of that type, decoded with the application's codec (so records
stored at an older schema version are upcast first, and renamed types are read through
their aliases), with the envelope's columns first::

    topic, partition, offset, aggregate_id, aggregate_version, event_id, timestamp,
    <the event class's fields, in declaration order>

Column types follow the field annotations (:func:`arrow_type`): ``int`` → bigint,
``float`` → double, ``str`` → string, ``bool`` → boolean, ``bytes`` → binary,
``datetime`` → timestamp, ``date`` → date, ``UUID``/``Decimal``/enums/literals → string,
a nested attrs class → struct, ``tuple[T, ...]``/``list[T]``/sets → array, ``dict[str, T]``
→ map, ``T | None`` → ``T`` (nullable). Anything else becomes a JSON string.

Records are read by the ``eventlane`` data source and decoded in the same Python worker
(``mapInArrow``), batch by batch; the driver holds no records. For several event types of
the same topics, :func:`event_frames` reads and decodes the records once for all of them::

    frames = event_frames(spark, app, DATA, [OrderPlaced, OrderShipped], topics=["orders"])
    frames[OrderShipped].count()
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import types
import typing
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]

from eventlane.app import App
from eventlane.codec import EventCodec, event_type_from_headers
from eventlane.domain import DomainEvent
from eventlane.engine import log_locator
from eventlane.errors import ConfigError, FrameworkError
from eventlane.replay.build import app_codec
from eventlane.replay.ranges import open_store
from eventlane.replay.session import register_source

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["ENVELOPE_FIELDS", "arrow_schema", "arrow_type", "event_frame", "event_frames"]

ENVELOPE_FIELDS: tuple[tuple[str, pa.DataType], ...] = (
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("aggregate_id", pa.string()),
    ("aggregate_version", pa.int64()),
    ("event_id", pa.string()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
)

_SCALARS: Mapping[Any, pa.DataType] = {
    int: pa.int64(),
    float: pa.float64(),
    str: pa.string(),
    bool: pa.bool_(),
    bytes: pa.binary(),
    dt.datetime: pa.timestamp("us", tz="UTC"),
    dt.date: pa.date32(),
    uuid.UUID: pa.string(),
    decimal.Decimal: pa.string(),
}
_JSON = pa.string()


def _strip_optional(tp: Any) -> Any:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return tp


def arrow_type(tp: Any) -> pa.DataType:
    """The Arrow type of a field annotation (see the module docstring).

    >>> arrow_type(int), arrow_type(str | None), arrow_type(tuple[int, ...])
    (DataType(int64), DataType(string), ListType(list<item: int64>))
    """
    tp = _strip_optional(tp)
    if tp in _SCALARS:
        return _SCALARS[tp]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return pa.string()
    if isinstance(tp, type) and attrs.has(tp):
        return pa.struct(_fields(tp))
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return pa.string()
    if origin in (tuple, list, set, frozenset) and args:
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return _JSON  # a fixed-shape tuple: no single element type
        return pa.list_(arrow_type(args[0]))
    if origin in (dict, Mapping) and len(args) == 2 and _strip_optional(args[0]) is str:
        return pa.map_(pa.string(), arrow_type(args[1]))
    return _JSON


def _fields(cls: type) -> list[tuple[str, pa.DataType]]:
    attrs.resolve_types(cls)
    return [(f.name, arrow_type(f.type)) for f in attrs.fields(cls)]


def arrow_schema(event_cls: type[DomainEvent]) -> pa.Schema:
    """Envelope columns, then the event class's fields."""
    own = _fields(event_cls)
    taken = {name for name, _ in ENVELOPE_FIELDS}
    for name, _ in own:
        if name in taken:
            raise ConfigError(
                f"event {event_cls.__qualname__} has a field {name!r}, which is also an"
                " envelope column of typed DataFrames; rename the field or read raw records"
            )
    return pa.schema([*ENVELOPE_FIELDS, *own])


def _value(value: Any, atype: pa.DataType, codec: EventCodec) -> Any:
    """A Python value shaped for ``atype`` (``pa.RecordBatch.from_pylist``)."""
    if value is None:
        return None
    if atype == _JSON and not isinstance(value, str):
        return orjson.dumps(codec.converter.unstructure(value)).decode()
    if pa.types.is_struct(atype):
        return {f.name: _value(getattr(value, f.name), f.type, codec) for f in atype}
    if pa.types.is_map(atype):
        return [(k, _value(v, atype.item_type, codec)) for k, v in value.items()]
    if pa.types.is_list(atype):
        return [_value(v, atype.value_type, codec) for v in value]
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    return value


def decode_batches(
    batches: Iterable[pa.RecordBatch],
    app: App,
    event_cls: type[DomainEvent],
    data: str | Path | None = None,
) -> Iterator[pa.RecordBatch]:
    """Raw record batches (the data source's schema) → typed batches of ``event_cls``.

    ``data`` (the log: its data directory or a ``nats://`` URL) gives the codec the app's
    key store, so personal fields decrypt (or read as erased); without it, events with
    personal fields fail."""
    schema = arrow_schema(event_cls)
    for rows in _typed_rows(batches, app, (event_cls,), data):
        if rows:
            yield pa.RecordBatch.from_pylist([row for _, row in rows], schema=schema)


def union_schema(classes: Sequence[type[DomainEvent]]) -> pa.Schema:
    """The schema of :func:`decode_union`: ``_type`` (the index of the row's class in
    ``classes``), then one struct column ``e<i>`` per class (:func:`arrow_schema`), set only
    in the rows of that class."""
    return pa.schema(
        [("_type", pa.int32())]
        + [(f"e{i}", pa.struct(list(arrow_schema(cls)))) for i, cls in enumerate(classes)]
    )


def decode_union(
    batches: Iterable[pa.RecordBatch],
    app: App,
    classes: Sequence[type[DomainEvent]],
    data: str | Path | None = None,
) -> Iterator[pa.RecordBatch]:
    """:func:`decode_batches` for several event classes in one pass over the records: each
    event of one of ``classes`` becomes a row of :func:`union_schema`."""
    schema = union_schema(classes)
    for rows in _typed_rows(batches, app, classes, data):
        if rows:
            yield pa.RecordBatch.from_pylist(
                [{"_type": i, f"e{i}": row} for i, row in rows], schema=schema
            )


def _typed_rows(
    batches: Iterable[pa.RecordBatch],
    app: App,
    classes: Sequence[type[DomainEvent]],
    data: str | Path | None,
) -> Iterator[list[tuple[int, dict[str, Any]]]]:
    """Per raw batch, ``(index of the class in classes, row)`` for each of its events of one
    of ``classes`` (others are skipped by their type header, before decoding, when they
    have one)."""
    codec = app_codec(app, None if data is None else open_store(data))
    registry = codec.registry
    index = {cls: i for i, cls in enumerate(classes)}
    owns = [
        [(f.name, f.type) for f in arrow_schema(cls)][len(ENVELOPE_FIELDS) :] for cls in classes
    ]
    wanted: dict[tuple[str, int], bool] = {}
    for batch in batches:
        cols = batch.to_pydict()
        rows: list[tuple[int, dict[str, Any]]] = []
        for topic, partition, offset, key, value, headers in zip(
            cols["topic"],
            cols["partition"],
            cols["offset"],
            cols["key"],
            cols["value"],
            cols["headers"],
            strict=True,
        ):
            pairs = [(h["key"], h["value"]) for h in headers or ()]
            stored = event_type_from_headers([(k, v) for k, v in pairs if v is not None])
            if stored is not None:
                hit = wanted.get(stored)
                if hit is None:
                    try:
                        hit = registry.resolve(stored.name, stored.version).cls in index
                    except FrameworkError:
                        hit = False
                    wanted[stored] = hit
                if not hit:
                    continue
            env = codec.decode(key, value, pairs, topic=topic, partition=partition, offset=offset)
            i = index.get(type(env.event))
            if i is None:
                continue
            row = {
                "topic": topic,
                "partition": partition,
                "offset": offset,
                "aggregate_id": env.aggregate_id,
                "aggregate_version": env.aggregate_version,
                "event_id": str(env.event_id),
                "timestamp": env.timestamp,
            }
            for name, atype in owns[i]:
                row[name] = _value(getattr(env.event, name), atype, codec)
            rows.append((i, row))
        yield rows


def event_frame(
    spark: SparkSession,
    app: App,
    data: Path | str,
    event_cls: type[DomainEvent],
    *,
    topics: Iterable[str],
    options: Mapping[str, str] | None = None,
) -> DataFrame:
    """A DataFrame of every ``event_cls`` event on ``topics`` of the log ``data`` (a data
    directory or a ``nats://`` URL; module docstring).

    ``options`` go to the ``eventlane`` data source (``startingOffsets``, ``endingOffsets``,
    ``maxOffsetsPerPartition``).
    """
    # pyspark is an optional extra, imported only when a frame is wanted
    from pyspark.sql.pandas.types import from_arrow_schema  # noqa: PLC0415

    app_codec(app).registry.type_of(event_cls)  # unregistered: fails here, on the driver
    names = ",".join(topics)
    if not names:
        raise ConfigError("event_frame needs at least one topic")
    locator = log_locator(data)
    raw = _records(spark, locator, names, options)
    spark_schema = from_arrow_schema(arrow_schema(event_cls))

    def decode(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return decode_batches(batches, app, event_cls, locator)

    return raw.mapInArrow(decode, spark_schema)


def _records(
    spark: SparkSession, locator: str, topics: str, options: Mapping[str, str] | None
) -> DataFrame:
    """The raw records of ``topics`` through the ``eventlane`` data source (registered on
    ``spark`` here: a session not made by ``spark_session`` may not have it)."""
    register_source(spark)
    reader = spark.read.format("eventlane").option("log", locator).option("topic", topics)
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    return reader.load().select("topic", "partition", "offset", "key", "value", "headers")


def event_frames(
    spark: SparkSession,
    app: App,
    data: Path | str,
    event_classes: Iterable[type[DomainEvent]],
    *,
    topics: Iterable[str],
    options: Mapping[str, str] | None = None,
) -> dict[type[DomainEvent], DataFrame]:
    """:func:`event_frame` of each of ``event_classes``, from one read of ``topics``.

    The records are read and decoded once, into one DataFrame holding the events of every
    class asked for, which is persisted (``DataFrame.persist()``: memory, then disk): the
    first action on any of the frames reads the topics, the others use what it kept.
    ``spark.catalog.clearCache()`` (or ``unpersist()`` on the frame's source) lets it go.
    """
    from pyspark.sql import functions as F  # noqa: PLC0415, N812
    from pyspark.sql.pandas.types import from_arrow_schema  # noqa: PLC0415

    classes = list(dict.fromkeys(event_classes))
    if not classes:
        raise ConfigError("event_frames needs at least one event class")
    registry = app_codec(app).registry
    for cls in classes:
        registry.type_of(cls)  # unregistered: fails here, on the driver
    names = ",".join(topics)
    if not names:
        raise ConfigError("event_frames needs at least one topic")
    locator = log_locator(data)
    raw = _records(spark, locator, names, options)

    def decode(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return decode_union(batches, app, classes, locator)

    union = raw.mapInArrow(decode, from_arrow_schema(union_schema(classes))).persist()
    return {
        cls: union.where(F.col("_type") == i).select(f"e{i}.*") for i, cls in enumerate(classes)
    }
