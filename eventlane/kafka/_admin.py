"""ApiVersions, Metadata, CreateTopics, DeleteTopics, DescribeConfigs, DeleteRecords.

Invariant: every configuration crosses between Kafka's names and eventlane's here
(``eventlane_config``/``kafka_config``); everything is read-only but topic creation and
deletion and record deletion.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from kafka.protocol.admin import (
    CreateTopicsResponse,
    DeleteRecordsResponse,
    DeleteTopicsResponse,
    DescribeConfigsResponse,
)
from kafka.protocol.metadata import ApiVersionsResponse, MetadataResponse

from eventlane.errors import (
    ConfigError,
    TopicExistsError,
)
from eventlane.kafka._base import (
    CLUSTER_ID,
    NODE_ID,
    BrokerState,
    check_topic_name,
    is_internal,
    refuse_internal,
    topic_id,
)
from eventlane.kafka.codes import Errors, errno, error_for
from eventlane.kafka.protocol import SUPPORTED
from eventlane.log import TopicConfig
from eventlane.observability import get_logger

log = get_logger("eventlane.kafka")


_KAFKA_NAMES = {"max_record_bytes": "max.message.bytes", "timestamp_type": "message.timestamp.type"}


_FROM_KAFKA = {kafka: ours for ours, kafka in _KAFKA_NAMES.items()}


IGNORED_CONFIGS = frozenset(
    {
        "min.insync.replicas",
        "unclean.leader.election.enable",
        "compression.type",
        "message.downconversion.enable",
        "preallocate",
        "follower.replication.throttled.replicas",
        "leader.replication.throttled.replicas",
    }
)
"""Kafka topic configs that mean nothing on one node: accepted and ignored (logged)."""


def eventlane_config(values: dict[str, str | None]) -> dict[str, str]:
    """A CreateTopics config under eventlane's names (Kafka's names accepted)."""
    out: dict[str, str] = {}
    for name, value in values.items():
        if value is None:
            continue
        if name in IGNORED_CONFIGS:
            log.info("topic config ignored on one node", config=name, value=value)
            continue
        out[_FROM_KAFKA.get(name, name)] = value
    return out


def _with_defaults(values: dict[str, str], defaults: dict[str, str]) -> dict[str, tuple[str, bool]]:
    return {name: (value, defaults.get(name) == value) for name, value in values.items()}


_BROKER_DEFAULTS = {
    "auto.create.topics.enable": "true",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "socket.request.max.bytes": str(100 << 20),
    "connections.max.idle.ms": "600000",
    "max.connections": str(0x7FFFFFFF),
    "queued.max.request.bytes": "-1",
}
"""Kafka's defaults of the broker configs the listener reports."""


def kafka_config(config: Any) -> dict[str, str]:
    """A topic's configuration under Kafka's names (what DescribeConfigs returns)."""
    out: dict[str, str] = {}
    for name, value in config.to_dict().items():
        kafka = _KAFKA_NAMES.get(name, name.replace("_", "."))
        out[kafka] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


_TOPIC_DEFAULTS = kafka_config(TopicConfig())
"""A topic's configs when nothing was set (eventlane's defaults, which are Kafka's)."""


class AdminApis(BrokerState):
    """The admin APIs (the module docstring)."""

    # -- ApiVersions ---------------------------------------------------------------------
    def _versions(self) -> list[Any]:
        return [
            ApiVersionsResponse.ApiVersion(api_key=key, min_version=lo, max_version=hi)
            for key, (lo, hi) in sorted(SUPPORTED.items())
        ]

    async def api_versions(self, request: Any) -> Any:
        return ApiVersionsResponse(
            error_code=0,
            api_keys=self._versions(),
            throttle_time_ms=0,
            supported_features=[],
            finalized_features_epoch=-1,
            finalized_features=[],
            zk_migration_ready=False,
        )

    def api_versions_error(self, correlation_id: int) -> bytes:
        response = ApiVersionsResponse(
            error_code=errno(Errors.UnsupportedVersionError), api_keys=self._versions()
        )
        response.API_VERSION = 0
        response.with_header(correlation_id=correlation_id)
        return bytes(response.encode(header=True, framed=True))

    # -- Metadata ------------------------------------------------------------------------
    def _topic_metadata(self, name: str) -> Any:
        Topic = MetadataResponse.MetadataResponseTopic
        Partition = Topic.MetadataResponsePartition
        try:
            count = self.log.partition_count(check_topic_name(name))
        except Exception as exc:
            return Topic(
                error_code=error_for(exc),
                name=name,
                topic_id=uuid.UUID(int=0),
                is_internal=False,
                partitions=[],
            )
        return Topic(
            error_code=0,
            name=name,
            topic_id=topic_id(name),
            is_internal=is_internal(name),
            partitions=[
                Partition(
                    error_code=0,
                    partition_index=p,
                    leader_id=NODE_ID,
                    leader_epoch=0,
                    replica_nodes=[NODE_ID],
                    isr_nodes=[NODE_ID],
                    offline_replicas=[],
                )
                for p in range(count)
            ],
        )

    async def metadata(self, request: Any) -> Any:
        if request.topics is None:
            names = await asyncio.to_thread(self.log.list_topics)
        else:
            names = [t.name for t in request.topics]
            if self.auto_create_topics and getattr(request, "allow_auto_topic_creation", True):
                for name in names:
                    await asyncio.to_thread(self._auto_create, name)
        topics = [await asyncio.to_thread(self._topic_metadata, n) for n in names]
        return MetadataResponse(
            throttle_time_ms=0,
            brokers=[
                MetadataResponse.MetadataResponseBroker(
                    node_id=NODE_ID, host=self.host, port=self.port, rack=None
                )
            ],
            cluster_id=CLUSTER_ID,
            controller_id=NODE_ID,
            topics=topics,
            error_code=0,
        )

    def _auto_create(self, name: str) -> None:
        try:
            if name.startswith("__") or self.log.topic_exists(check_topic_name(name)):
                return
            self.log.create_topic(name, self.default_partitions, exist_ok=True)
            log.info("topic auto-created", topic=name, partitions=self.default_partitions)
        except Exception as exc:
            log.warning("topic not auto-created", topic=name, error=str(exc))

    # -- topics ----------------------------------------------------------------------------
    async def create_topics(self, request: Any) -> Any:
        Result = CreateTopicsResponse.CreatableTopicResult
        results = []
        for topic in request.topics:
            code, message = errno(Errors.NoError), None
            configs: list[Any] = []
            partitions = topic.num_partitions if topic.num_partitions > 0 else 1
            if is_internal(topic.name):
                code = errno(Errors.InvalidTopicError)
                message = f"{topic.name} is an internal topic: clients cannot create it"
            elif topic.replication_factor not in (-1, 1):
                code = errno(Errors.InvalidReplicationFactorError)
                message = "eventlane is one broker: replication factor must be 1"
            elif topic.assignments:
                code = errno(Errors.InvalidRequestError)
                message = "manual replica assignment is not supported"
            else:
                try:
                    check_topic_name(topic.name)
                    config = eventlane_config({c.name: c.value for c in topic.configs})
                    if getattr(request, "validate_only", False):
                        if self.log.topic_exists(topic.name):
                            raise TopicExistsError(f"topic {topic.name!r} exists", topic=topic.name)
                    else:
                        await asyncio.to_thread(
                            self.log.create_topic, topic.name, partitions, config
                        )
                        created = await asyncio.to_thread(self.log.topic_config, topic.name)
                        configs = [
                            Result.CreatableTopicConfigs(
                                name=name,
                                value=value,
                                read_only=True,
                                config_source=5 if is_default else 1,
                                is_sensitive=False,
                            )
                            for name, (value, is_default) in sorted(
                                _with_defaults(kafka_config(created), _TOPIC_DEFAULTS).items()
                            )
                        ]
                except Exception as exc:
                    code, message = error_for(exc), str(exc)
            results.append(
                Result(
                    name=topic.name,
                    topic_id=topic_id(topic.name),
                    error_code=code,
                    error_message=message,
                    topic_config_error_code=0,
                    num_partitions=partitions if code == 0 else -1,
                    replication_factor=1 if code == 0 else -1,
                    configs=configs,
                )
            )
        return CreateTopicsResponse(throttle_time_ms=0, topics=results)

    async def delete_topics(self, request: Any) -> Any:
        names = (
            [t.name for t in request.topics]
            if getattr(request, "topics", None)
            else list(request.topic_names or [])
        )
        results = []
        for name in names:
            code, message = errno(Errors.NoError), None
            try:
                refuse_internal(check_topic_name(name), "delete")
                await asyncio.to_thread(self.log.delete_topic, name)
            except Exception as exc:
                code, message = error_for(exc), str(exc)
            results.append(
                DeleteTopicsResponse.DeletableTopicResult(
                    name=name, topic_id=topic_id(name), error_code=code, error_message=message
                )
            )
        return DeleteTopicsResponse(throttle_time_ms=0, responses=results)

    async def describe_configs(self, request: Any) -> Any:
        """Topic configs (Kafka's names) and the broker's; each entry says whether it is the
        default (source DEFAULT_CONFIG, 5) or set (TOPIC_CONFIG 1 / STATIC_BROKER_CONFIG 4).
        Everything is read-only: AlterConfigs is not implemented."""
        Result = DescribeConfigsResponse.DescribeConfigsResult
        Entry = Result.DescribeConfigsResourceResult
        results = []
        for resource in request.resources:
            entries: list[Any] = []
            code, message = errno(Errors.NoError), None
            values: dict[str, tuple[str, bool]] = {}
            set_source = 1
            try:
                if resource.resource_type == 2:  # TOPIC
                    name = check_topic_name(resource.resource_name)
                    config = await asyncio.to_thread(self.log.topic_config, name)
                    values = _with_defaults(kafka_config(config), _TOPIC_DEFAULTS)
                elif resource.resource_type == 4:  # BROKER
                    if resource.resource_name not in ("", str(NODE_ID)):
                        raise ConfigError(f"unknown broker {resource.resource_name!r}")
                    values = _with_defaults(self.broker_configs, _BROKER_DEFAULTS)
                    set_source = 4
                else:
                    code = errno(Errors.InvalidRequestError)
                    message = f"resource type {resource.resource_type} is not supported"
            except Exception as exc:
                code, message, values = error_for(exc), str(exc), {}
                if resource.resource_type == 4:
                    code = errno(Errors.InvalidRequestError)
            wanted = resource.configuration_keys
            for name, (value, is_default) in sorted(values.items()):
                if wanted is None or name in wanted:
                    entries.append(
                        Entry(
                            name=name,
                            value=value,
                            read_only=True,
                            config_source=5 if is_default else set_source,
                            is_default=is_default,
                            is_sensitive=False,
                            synonyms=[],
                            config_type=0,
                            documentation=None,
                        )
                    )
            results.append(
                Result(
                    error_code=code,
                    error_message=message,
                    resource_type=resource.resource_type,
                    resource_name=resource.resource_name,
                    configs=entries,
                )
            )
        return DescribeConfigsResponse(throttle_time_ms=0, results=results)

    @property
    def broker_configs(self) -> dict[str, str]:
        """The broker's configuration under Kafka's names."""
        return {
            "broker.id": str(NODE_ID),
            "node.id": str(NODE_ID),
            "auto.create.topics.enable": str(self.auto_create_topics).lower(),
            "num.partitions": str(self.default_partitions),
            "default.replication.factor": "1",
            "offsets.topic.replication.factor": "1",
            **self.limits,
        }

    async def delete_records(self, request: Any) -> Any:
        TopicR = DeleteRecordsResponse.DeleteRecordsTopicResult
        PartR = TopicR.DeleteRecordsPartitionResult
        topics = []
        for topic in request.topics:
            parts = []
            for p in topic.partitions:
                code, lwm = errno(Errors.NoError), -1
                try:
                    refuse_internal(check_topic_name(topic.name), "delete records of")
                    offset = p.offset
                    if offset == -1:
                        offset = (
                            await asyncio.to_thread(self.log.offsets, topic.name, p.partition_index)
                        ).hwm
                    lwm = await asyncio.to_thread(
                        self.log.delete_records, topic.name, p.partition_index, offset
                    )
                except Exception as exc:
                    code = error_for(exc)
                parts.append(
                    PartR(partition_index=p.partition_index, low_watermark=lwm, error_code=code)
                )
            topics.append(TopicR(name=topic.name, partitions=parts))
        return DeleteRecordsResponse(throttle_time_ms=0, topics=topics)
