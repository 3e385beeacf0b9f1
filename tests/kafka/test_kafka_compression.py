"""Every compression codec Kafka clients use: librdkafka producers with gzip, snappy, lz4 and
zstd deliver 100 of 100 records, stored exactly (keys, values, headers), and kafka-python
and aiokafka read them back; kafka-python producers with each codec too."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer
from confluent_kafka import Producer
from kafka import KafkaProducer

from eventlane.log import LogStore

CODECS = ["gzip", "snappy", "lz4", "zstd"]


def _records(codec: str) -> list[tuple[bytes, bytes, tuple]]:
    return [
        (b"k%d" % i, (b"%s-%d-" % (codec.encode(), i)) * (1 + i % 40), (("h", b"%d" % i),))
        for i in range(100)
    ]


@pytest.mark.parametrize("codec", CODECS)
def test_librdkafka_producers_deliver_every_record_with_each_codec(kafka, codec: str) -> None:
    topic = f"z-rd-{codec}"
    LogStore(kafka.data).create_topic(topic, 1)
    producer = Producer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "compression.type": codec,
            "linger.ms": 20,
            "message.timeout.ms": 20000,
        }
    )
    errors: list = []
    for key, value, headers in _records(codec):
        producer.produce(
            topic,
            key=key,
            value=value,
            headers=list(headers),
            partition=0,
            on_delivery=lambda err, msg: errors.append(err),
        )
    assert producer.flush(30) == 0
    assert errors == [None] * 100, {str(e) for e in errors}
    log = LogStore(kafka.data)
    stored, _ = log.read(topic, 0, 0, max_bytes=1 << 24)
    log.close()
    assert [(r.key, r.value, tuple(r.headers)) for r in stored] == _records(codec)


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_producers_with_each_codec_read_back_by_aiokafka(kafka, codec: str) -> None:
    topic = f"z-kp-{codec}"
    producer = KafkaProducer(bootstrap_servers=kafka.bootstrap, compression_type=codec)
    for key, value, headers in _records(codec):
        producer.send(topic, key=key, value=value, headers=list(headers), partition=0)
    producer.flush(20)
    producer.close()

    async def read() -> list:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=kafka.bootstrap, auto_offset_reset="earliest"
        )
        await consumer.start()
        got: list = []
        try:
            while len(got) < 100:
                batch = await asyncio.wait_for(consumer.getmany(timeout_ms=500), 20)
                for msgs in batch.values():
                    got += [(m.key, m.value, tuple(m.headers)) for m in msgs]
        finally:
            await consumer.stop()
        return got

    assert asyncio.run(read()) == _records(codec)
