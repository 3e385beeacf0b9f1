"""Speak Kafka: a Kafka wire-protocol listener in front of the embedded log.

``eventlane serve --kafka 127.0.0.1:9092`` lets Kafka clients (librdkafka/confluent-kafka,
kafka-python, aiokafka, kcat, Spark's Kafka source) produce to and fetch from an eventlane
log, with the log's guarantees unchanged. See ``docs/kafka-protocol.md``.

Request and response bodies are encoded and decoded by kafka-python's generated protocol
classes (built from Kafka's own message schemas), record batches by its record module; this
package maps them onto the log port.
"""

from eventlane.kafka.server import KafkaServer, Limits, serve

__all__ = ["KafkaServer", "Limits", "serve"]
