"""Which Kafka APIs the listener speaks, at which versions, and how a request is decoded.

:data:`SUPPORTED` maps an API key to the (min, max) versions this listener implements; it
is what ApiVersions advertises. Caps below kafka-python's maximum are where a later version
needs something eventlane does not have (topic ids in Produce/Fetch v13+, KIP-848 groups).
Minimum versions are Kafka 4's (KIP-896 removed older ones): Produce v3 and Fetch v4 are the
first that carry record batches v2 (magic 2), the only format the listener reads and writes,
so an older client is told at ApiVersions instead of failing on its first batch.
Error codes are ``kafka.errors``' (see :mod:`eventlane.kafka.codes`).
"""

from __future__ import annotations

import contextvars
import struct
from collections.abc import Callable
from typing import Any

from kafka.protocol.admin import (
    CreateTopicsRequest,
    DeleteGroupsRequest,
    DeleteRecordsRequest,
    DeleteTopicsRequest,
    DescribeConfigsRequest,
    DescribeGroupsRequest,
    ListGroupsRequest,
)
from kafka.protocol.consumer import (
    FetchRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListOffsetsRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest

__all__ = [
    "REQUESTS",
    "SUPPORTED",
    "UnsupportedVersionError",
    "connection_open",
    "decode_request",
]

connection_open: contextvars.ContextVar[Callable[[], bool]] = contextvars.ContextVar(
    "connection_open", default=lambda: True
)
"""Whether the connection of the request being served is still open (the client has not
closed it): set per connection by the server, asked by handlers that wait (a long-poll
Fetch stops waiting for a client that is gone)."""


REQUESTS: dict[int, Any] = {
    cls.API_KEY: cls
    for cls in (
        ProduceRequest,
        FetchRequest,
        ListOffsetsRequest,
        MetadataRequest,
        FindCoordinatorRequest,
        ApiVersionsRequest,
        CreateTopicsRequest,
        DeleteTopicsRequest,
        DeleteRecordsRequest,
        InitProducerIdRequest,
        DescribeConfigsRequest,
        OffsetCommitRequest,
        OffsetFetchRequest,
        JoinGroupRequest,
        HeartbeatRequest,
        LeaveGroupRequest,
        SyncGroupRequest,
        DescribeGroupsRequest,
        ListGroupsRequest,
        DeleteGroupsRequest,
    )
}

_CAPS: dict[int, int] = {
    0: 12,  # Produce: v13 names topics by id
    1: 12,  # Fetch: v13 names topics by id
    3: 12,  # Metadata
    8: 9,  # OffsetCommit: v10 names topics by id
    9: 9,  # OffsetFetch: v10 names topics by id
}

_MIN: dict[int, int] = {
    0: 3,  # Produce: v3 is the first with record batches v2
    1: 4,  # Fetch: v4 is the first with record batches v2
}

SUPPORTED: dict[int, tuple[int, int]] = {
    key: (_MIN.get(key, 0), min(cls.max_version, _CAPS.get(key, cls.max_version)))
    for key, cls in REQUESTS.items()
}


class UnsupportedVersionError(Exception):
    """A request whose API or version this listener does not implement."""


def decode_request(payload: bytes) -> Any:
    """The request object of one frame's payload (header included)."""
    api_key, version = struct.unpack_from(">hh", payload)
    supported = SUPPORTED.get(api_key)
    if supported is None or not supported[0] <= version <= supported[1]:
        raise UnsupportedVersionError(f"api key {api_key} version {version} is not supported")
    return REQUESTS[api_key].decode(payload, version=version, header=True)
