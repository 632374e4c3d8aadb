#!/usr/bin/env python3
"""Ferry's protocol from Python: submit a `test` task, follow it, revert it.

Speaks only Kafka and a Confluent-compatible schema registry, as any client may
(docs/PROTOCOL.md): the command is a CommandEnvelope framed by confluent-kafka's
AvroSerializer, its spec a TestTaskSpec framed the same way inside the envelope's `spec`
bytes; the ProgressEvents are read back with the AvroDeserializer.

Subjects follow Ferry's RecordNameStrategy (the record's full name, e.g.
`io.ferry.v1.CommandEnvelope`), and the serializers only look schemas up (no
auto-registration): a Ferry worker started with `--schema-registry URL` has registered
them, and a registry locked to writes stays untouched.

Prints one line per event; exits 0 when the task Succeeded and then Reverted.
"""

import argparse
import os
import sys
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient, record_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

# Ferry's namespace for task ids derived from idempotency keys (docs/PROTOCOL.md).
IDEMPOTENCY_NAMESPACE = uuid.UUID("6f8c1c7e-1d8a-4b52-9a77-52a1f3e0c0de")
FINAL = {"Succeeded", "Failed", "Cancelled", "Reverted", "RevertFailed", "Rejected"}
SCHEMAS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "schemas")


class ExampleError(Exception):
    """What went wrong, said for the person running the example."""


def uuid7() -> uuid.UUID:
    """A time-ordered UUID v7 (Python 3.11 has no uuid.uuid7)."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & (2**48 - 1)) << 80 | 0x7 << 76 | ((rand >> 62) & 0xFFF) << 64 | 0b10 << 62 | (rand & (2**62 - 1))
    return uuid.UUID(int=value)


def task_id(kind: str, idempotency_key: str | None) -> str:
    """`tsk_` and 32 hex digits: UUID v7 for a fresh task, v5 of `<kind>/<key>` with a key."""
    if idempotency_key is None:
        return "tsk_" + uuid7().hex
    return "tsk_" + uuid.uuid5(IDEMPOTENCY_NAMESPACE, f"{kind}/{idempotency_key}").hex


def schema(name: str) -> str:
    with open(os.path.join(SCHEMAS, name), encoding="utf-8") as f:
        return f.read()


def kafka_conf(args: argparse.Namespace) -> dict:
    conf = {"bootstrap.servers": args.bootstrap}
    for prop in args.kafka_property:
        key, _, value = prop.partition("=")
        conf[key] = value
    return conf


class Serdes:
    """The registry-aware serializers of a `test` command and the events' deserializer."""

    def __init__(self, args: argparse.Namespace):
        registry_conf = {"url": args.registry}
        user, password = os.environ.get("FERRY_SCHEMA_REGISTRY_USER"), os.environ.get("FERRY_SCHEMA_REGISTRY_PASSWORD")
        if user is not None and password is not None:
            registry_conf["basic.auth.user.info"] = f"{user}:{password}"
        if os.environ.get("FERRY_SCHEMA_REGISTRY_CA"):
            registry_conf["ssl.ca.location"] = os.environ["FERRY_SCHEMA_REGISTRY_CA"]
        registry = SchemaRegistryClient(registry_conf)
        # Look up, never register: the ids are the ones Ferry's workers use.
        serde_conf = {"auto.register.schemas": False, "subject.name.strategy": record_subject_name_strategy}
        self.envelope = AvroSerializer(registry, schema("CommandEnvelope.v3.avsc"), conf=serde_conf)
        self.spec = AvroSerializer(registry, schema("TestTaskSpec.v2.avsc"), conf=serde_conf)
        self.events = AvroDeserializer(registry, conf={"subject.name.strategy": record_subject_name_strategy})
        self.command_topic = f"{args.topic_prefix}ferry.commands.test"
        self.progress_topic = f"{args.topic_prefix}ferry.progress"

    def command(self, tid: str, action: str, subject: str, key: str | None, spec: dict | None) -> bytes:
        """A framed CommandEnvelope; the spec, if any, framed on its own inside it."""
        ctx = SerializationContext(self.command_topic, MessageField.VALUE)
        spec_bytes = b"" if spec is None else self.spec(spec, ctx)
        return self.envelope(envelope(tid, action, subject, key, spec_bytes), ctx)


class Ferry(Serdes):
    """One connection to Ferry's topics and the registry."""

    def __init__(self, args: argparse.Namespace):
        super().__init__(args)
        self.timeout = args.timeout
        self.producer = Producer(kafka_conf(args) | {"enable.idempotence": True, "acks": "all"})
        # No consumer group: the example reads every partition from its end, set before
        # the command is sent, so it sees all of its task's events and nothing older.
        self.consumer = Consumer(kafka_conf(args) | {"group.id": "ferry-python-example", "enable.auto.commit": False})
        self.seen: set[tuple[str, int]] = set()
        self._start_at_end()

    def _start_at_end(self) -> None:
        meta = self.consumer.list_topics(self.progress_topic, timeout=self.timeout)
        topic = meta.topics.get(self.progress_topic)
        if topic is None or topic.error is not None or not topic.partitions:
            raise ExampleError(f"topic {self.progress_topic} is not there ({topic.error if topic else 'unknown'}): is Ferry set up on {meta.orig_broker_name}?")
        partitions = []
        for p in sorted(topic.partitions):
            _, high = self.consumer.get_watermark_offsets(TopicPartition(self.progress_topic, p), timeout=self.timeout)
            partitions.append(TopicPartition(self.progress_topic, p, high))
        self.consumer.assign(partitions)

    def send(self, subject: str, command: bytes) -> None:
        """Writes a command, keyed by its subject, and waits for the broker's ack."""
        errors = []
        self.producer.produce(
            self.command_topic,
            key=subject.encode(),
            value=command,
            on_delivery=lambda err, _msg: errors.append(err) if err is not None else None,
        )
        if self.producer.flush(self.timeout) > 0:
            raise ExampleError(f"the command to {self.command_topic} was not acknowledged within {self.timeout} s")
        if errors:
            raise ExampleError(f"writing to {self.command_topic}: {errors[0]}")

    def follow(self, tid: str, after_seq: int, until: set[str]) -> dict:
        """Prints the task's events after `after_seq` until one in `until` (or a final one)."""
        ctx = SerializationContext(self.progress_topic, MessageField.VALUE)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            msg = self.consumer.poll(min(1.0, max(0.0, deadline - time.monotonic())))
            if msg is None:
                continue
            if msg.error() is not None:
                raise ExampleError(f"reading {self.progress_topic}: {msg.error()}")
            if msg.key() != tid.encode():
                continue
            event = self.events(msg.value(), ctx)
            # Dedupe by (task_id, seq): after a worker moves, an event may come twice.
            if (event["task_id"], event["seq"]) in self.seen:
                continue
            self.seen.add((event["task_id"], event["seq"]))
            print_event(event)
            if event["event"] == "Rejected" and event["seq"] == 0:
                raise ExampleError(f"the command was refused: {event['message']}")
            if event["seq"] > after_seq and (event["event"] in until or event["event"] in FINAL):
                return event
        raise ExampleError(f"task {tid}: no {'/'.join(sorted(until))} within {self.timeout} s")


def print_event(event: dict) -> None:
    parts = [f"seq={event['seq']}", f"event={event['event']}"]
    if event.get("step") is not None:
        parts.append(f"step={event['step']}:{event.get('step_name') or ''}")
    if event.get("percent") is not None:
        parts.append(f"percent={event['percent']}")
    if event.get("message"):
        parts.append(f"message={event['message']!r}")
    print(f"{event['task_id']} " + " ".join(parts), flush=True)


def envelope(tid: str, action: str, subject: str, key: str | None, spec: bytes) -> dict:
    return {
        "task_id": tid,
        "kind": "test",
        "action": action,
        "subject": subject,
        "idempotency_key": key,
        "requested_by": "python-example",
        "created_at_ms": time.time_ns() // 1_000_000,
        "deadline_ms": None,
        "keep_partial": False,
        "reason": None if action == "Start" else "reverted by the Python example",
        "spec": spec,
        "signal": None,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", default=os.environ.get("FERRY_KAFKA_BROKERS", "127.0.0.1:9092"))
    p.add_argument("--registry", default=os.environ.get("FERRY_SCHEMA_REGISTRY", "http://127.0.0.1:8081"), help="the registry's URL (credentials: FERRY_SCHEMA_REGISTRY_USER/PASSWORD)")
    p.add_argument("--topic-prefix", default="")
    p.add_argument("--subject", default="python-example", help="the task's subject (also the record key)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--idempotency-key", help="the same key is the same task")
    p.add_argument("--kafka-property", action="append", default=[], metavar="KEY=VALUE", help="any librdkafka property (SASL, TLS)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each phase")
    p.add_argument("--emit-command", metavar="FILE", help="only write the framed Start command to FILE (for kcat -P), touching no broker")
    args = p.parse_args()

    tid = task_id("test", args.idempotency_key)
    spec = {"steps": args.steps, "fail_at": None, "fail_transient": 0, "step_ms": 10, "block_at": None, "undo_fail_at": None}
    if args.emit_command:
        serdes = Serdes(args)
        with open(args.emit_command, "wb") as f:
            f.write(serdes.command(tid, "Start", args.subject, args.idempotency_key, spec))
        print(f"wrote {tid} to {args.emit_command}; send it with: kcat -P -b BROKER -t {serdes.command_topic} -k {args.subject} {args.emit_command}")
        return 0

    ferry = Ferry(args)
    print(f"submitting {tid} (subject {args.subject!r}, {args.steps} steps) to {ferry.command_topic}", flush=True)
    ferry.send(args.subject, ferry.command(tid, "Start", args.subject, args.idempotency_key, spec))
    done = ferry.follow(tid, 0, {"Succeeded"})
    if done["event"] != "Succeeded":
        raise ExampleError(f"task {tid} ended {done['event']}: {done.get('message')}")

    print(f"reverting {tid}", flush=True)
    # Revert carries the task's id and subject, and an empty spec.
    ferry.send(args.subject, ferry.command(tid, "Revert", args.subject, None, None))
    reverted = ferry.follow(tid, done["seq"], {"Reverted"})
    if reverted["event"] != "Reverted":
        raise ExampleError(f"revert of {tid} ended {reverted['event']}: {reverted.get('message')}")
    print(f"result: {tid} Succeeded, then Reverted", flush=True)
    ferry.consumer.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except ExampleError as e:
        print(f"ferry_example: {e}", file=sys.stderr)
        sys.exit(1)
