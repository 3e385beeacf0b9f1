"""Consumers of the log: the free consumer (and, later, consumer groups)."""

from framework.consumer.free import Consumer, OffsetAndTimestamp

__all__ = ["Consumer", "OffsetAndTimestamp"]
