"""Rich renderings shared by the commands and the demo: topic tables, sizes and durations.

Human output only; every command that prints a table also has a ``--json`` form whose shape
is documented in docs/cli.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.table import Table

from eventlane.log.config import TopicConfig
from eventlane.log.types import TopicDescription

_UNITS_MS = (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000))


def human_ms(ms: int) -> str:
    """A duration for people; ``-1`` means unbounded.

    >>> human_ms(604_800_000), human_ms(90_000), human_ms(-1), human_ms(250)
    ('7d', '90s', 'unbounded', '250ms')
    """
    if ms < 0:
        return "unbounded"
    for unit, size in _UNITS_MS:
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def human_bytes(n: int) -> str:
    """A byte count for people; ``-1`` means unbounded.

    >>> human_bytes(1 << 30), human_bytes(1536), human_bytes(12), human_bytes(-1)
    ('1.0 GiB', '1.5 KiB', '12 B', 'unbounded')
    """
    if n < 0:
        return "unbounded"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def describe_config_value(key: str, value: object) -> str:
    """A config value with its human form where one helps (``604800000 (7d)``)."""
    if isinstance(value, int) and key.endswith("_ms"):
        return f"{value} ({human_ms(value)})" if value != -1 else "-1 (unbounded)"
    if isinstance(value, int) and key.endswith("_bytes"):
        return f"{value} ({human_bytes(value)})" if value != -1 else "-1 (unbounded)"
    return str(value)


def config_table(config: TopicConfig, title: str = "Config") -> Table:
    """Every config key and value; values that differ from the default are bold."""
    defaults = TopicConfig().to_dict()
    table = Table(title=title, title_justify="left")
    table.add_column("key")
    table.add_column("value")
    for key, value in config.to_dict().items():
        style = "bold" if defaults.get(key) != value else None
        table.add_row(key, describe_config_value(key, value), style=style)
    return table


def partitions_table(description: TopicDescription, title: str | None = None) -> Table:
    """One row per partition: low-water mark, high-water mark, log end offset, segments, size."""
    table = Table(title=title or f"Partitions of {description.name}", title_justify="left")
    for name in ("partition", "LWM", "HWM", "LEO", "segments", "bytes"):
        table.add_column(name, justify="right")
    for p in description.partition_details:
        table.add_row(
            str(p.partition),
            str(p.lwm),
            str(p.hwm),
            str(p.leo),
            str(p.segments),
            human_bytes(p.bytes),
        )
    return table


def topics_table(descriptions: Iterable[TopicDescription]) -> Table:
    """The ``topics list`` table."""
    table = Table(title="Topics", title_justify="left")
    table.add_column("topic")
    table.add_column("partitions", justify="right")
    table.add_column("cleanup policy")
    table.add_column("retention")
    table.add_column("size", justify="right")
    for d in descriptions:
        cfg = d.config
        retention = (
            f"{human_ms(cfg.retention_ms)} / {human_bytes(cfg.retention_bytes)}"
            if cfg.delete
            else "-"
        )
        table.add_row(
            d.name,
            str(d.partitions),
            cfg.cleanup_policy,
            retention,
            human_bytes(sum(p.bytes for p in d.partition_details)),
        )
    return table


def simple_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[object]]) -> Table:
    """A titled table of plain values; numeric columns are right-aligned."""
    table = Table(title=title, title_justify="left")
    materialised = [list(row) for row in rows]
    for i, column in enumerate(columns):
        numeric = bool(materialised) and all(
            isinstance(row[i], int | float) for row in materialised
        )
        table.add_column(column, justify="right" if numeric else "left")
    for row in materialised:
        table.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row))
    return table
