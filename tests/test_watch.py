"""The watcher: formats, plan locations, filters and semver (in-process), then the consumer loop against a real
broker with an injected run-one-plan function (the CLI end to end is in test_watch_cli.py)."""

import io
import json
import os
import re
import threading
import time
import uuid

import pytest

import xzatoma_watch as w
from conftest import wait_for

# ---- messages: each format and plan location ----

PLAN = {"goal": "Count the files", "instructions": ["list the directory", "count"]}
STEPS_PLAN = {"name": "release-notes", "description": "Write release notes", "version": "1.4.2",
              "action": "docs.release", "tasks": [{"name": "collect", "action": "list merged PRs"}]}


def xzepr_event(event_id="01HXZ", payload=None, data_plan=None, success=True, **attrs):
    doc = {"success": success, "id": event_id, "specversion": "1.0.1", "type": "deployment.success",
           "source": "xzepr.event.receiver.01H", "api_version": "v1", "name": "deployment.success",
           "version": "2.1.0", "release": "2.1.0-rc.1", "platform_id": "kubernetes", "package": "myapp",
           "data": {"events": [{"id": event_id, "name": "deployment.success", "payload": payload or {}}],
                    "event_receivers": [], "event_receiver_groups": []}}
    if data_plan is not None:
        doc["data"]["plan"] = data_plan
    doc.update(attrs)
    return json.dumps(doc).encode()


def cloudevent(event_id="ce-1", data=None, **attrs):
    doc = {"specversion": "1.0", "id": event_id, "source": "ci/builds", "type": "build.succeeded",
           "datacontenttype": "application/json", "data": data}
    doc.update(attrs)
    return json.dumps(doc).encode()


BINARY_HEADERS = [("ce_specversion", b"1.0"), ("ce_id", b"bin-1"), ("ce_source", b"ci"), ("ce_type", b"build.done")]

FORMAT_CASES = [
    # (name, key, value, headers, format, id, plan location, goal)
    ("xzepr payload.plan", None, xzepr_event(payload={"plan": PLAN}), [], "xzepr", "01HXZ",
     "data.events[0].payload.plan", "Count the files"),
    ("xzepr payload.plan as YAML text", None, xzepr_event(payload={"plan": "goal: From YAML\ninstructions: [a]\n"}),
     [], "xzepr", "01HXZ", "data.events[0].payload.plan", "From YAML"),
    ("xzepr payload.plan as Markdown", None,
     xzepr_event(payload={"plan": "# Task: From Markdown\n\n## Steps\n- a\n"}), [], "xzepr", "01HXZ",
     "data.events[0].payload.plan", "From Markdown"),
    ("xzepr data.plan", None, xzepr_event(payload={"cluster": "prod"}, data_plan=PLAN), [], "xzepr", "01HXZ",
     "data.plan", "Count the files"),
    ("xzepr payload is the plan", None, xzepr_event(payload=STEPS_PLAN), [], "xzepr", "01HXZ",
     "data.events[0].payload", "Write release notes"),
    ("cloudevents data.plan", None, cloudevent(data={"plan": PLAN}), [], "cloudevents", "ce-1", "data.plan",
     "Count the files"),
    ("cloudevents data is the plan", None, cloudevent(data=PLAN), [], "cloudevents", "ce-1", "data",
     "Count the files"),
    ("cloudevents data.plan as JSON text", None, cloudevent(data={"plan": json.dumps(PLAN)}), [], "cloudevents",
     "ce-1", "data.plan", "Count the files"),
    ("binary cloudevent, YAML data", None, b"goal: Binary YAML\ninstructions: [a]\n",
     BINARY_HEADERS + [("content-type", b"application/yaml")], "cloudevents", "bin-1", "data", "Binary YAML"),
    ("binary cloudevent, JSON data.plan", None, json.dumps({"plan": PLAN}).encode(),
     BINARY_HEADERS + [("content-type", b"application/json")], "cloudevents", "bin-1", "data.plan",
     "Count the files"),
    ("bare YAML plan with a key", b"job-7", b"goal: Bare\ninstructions:\n  - a\n", [], "plan", "job-7", "value",
     "Bare"),
    ("bare JSON steps plan, no key", None, json.dumps(STEPS_PLAN).encode(), [], "plan", "t:0:9@1795740118983", "value",
     "Write release notes"),
    # Markdown that is no YAML ("Fix the build: it fails" is a mapping key YAML cannot end) was rejected under
    # --format auto, while `run --plan` read it (found by an attack round)
    ("bare Markdown plan that is no YAML", b"md-1",
     b"# Task: Fix the build\n\n## Goal\nFix the build: it fails on main.\n\n## Steps\n- run it\n- fix it\n", [],
     "plan", "md-1", "value", "Fix the build: it fails on main."),
]


@pytest.mark.parametrize("name,key,value,headers,fmt,event_id,where,goal", FORMAT_CASES,
                         ids=[c[0] for c in FORMAT_CASES])
def test_formats_and_plan_locations(name, key, value, headers, fmt, event_id, where, goal):
    ev = w.decode_message("t", 0, 9, key, value, headers, timestamp=1795740118983)
    assert (ev.format, ev.id, ev.plan_location) == (fmt, event_id, where)
    assert ev.plan is not None and ev.plan.goal == goal and ev.plan_error is None
    assert ev.plan.to_prompt().startswith("You are assisting with the following task:")


def test_publish_carries_what_yaml_plans_hold_as_strict_json():
    """`run --plan` reads plans with dates, times, sets, binary and NaN; publish failed on them ("Object of type
    date is not JSON serializable", exit 1 as if the broker refused) and sent NaN (attack round 16a)."""
    text = ("goal: Ship it\ncontext:\n  deadline: 2024-06-01\n  at: 2024-06-01T10:00:00Z\n  2024-01-01: new year\n"
            "  tags: !!set {a, b}\n  blob: !!binary aGVsbG8=\n  ratio: .nan\n  top: .inf\ninstructions: [check]\n")
    data, plan = w.plan_payload(text, "plan.yaml")
    value = w._encode(w.build_event(data, plan))
    doc = json.loads(value, parse_constant=lambda name: pytest.fail("not JSON: " + name))
    ctx = doc["data"]["plan"]["context"]
    assert ctx == {"deadline": "2024-06-01", "at": "2024-06-01T10:00:00+00:00", "2024-01-01": "new year",
                   "tags": ["a", "b"], "blob": "aGVsbG8=", "ratio": ".nan", "top": ".inf"}
    ev = w.decode_message("plans", 0, 1, None, value)
    assert ev.plan is not None and ev.plan.goal == "Ship it" and ev.plan_error is None


def test_a_yaml_plan_that_begins_like_json_is_read_as_yaml_whatever_its_commas():
    """Round 17d: a block YAML plan whose first key is quoted is tried as JSON first, and the count of JSON values
    on its text (100,002 commas in one instruction) refused it, YAML never tried; the count is exact only for JSON."""
    text = '"goal": G\ninstructions:\n  - ' + ",".join(["id"] * 100002) + "\n"
    ev = w.decode_message("t", 0, 5, b"k", text.encode())
    assert ev.plan is not None and ev.plan.goal == "G" and ev.plan.instructions[0].count(",") == 100001


def test_a_keyless_bare_plan_is_named_by_its_place_and_time():
    """Offsets start again at 0 on a topic made anew (or a broker keeping them in memory, restarted): named by its
    place alone, a new plan there was a "duplicate" of an old one and never ran (found by an attack round). A
    record read again keeps its timestamp, so it is still the same event."""
    plan = json.dumps(STEPS_PLAN).encode()
    first = w.decode_message("t", 0, 9, None, plan, timestamp=1795740118983)
    assert first.id == "t:0:9@1795740118983"
    assert w.decode_message("t", 0, 9, None, plan, timestamp=1795740118983).id == first.id  # read again
    assert w.decode_message("t", 0, 9, None, plan, timestamp=1795740200000).id != first.id  # the topic anew
    assert w.decode_message("t", 0, 9, b"job-7", plan, timestamp=1795740118983).id == "job-7"  # a key names it
    untimed = w.decode_message("t", 0, 9, None, plan, timestamp=-1).id  # a record without a time: what it holds
    assert untimed.startswith("t:0:9#") and w.decode_message("t", 0, 9, None, plan, timestamp=-1).id == untimed
    other = json.dumps(dict(STEPS_PLAN, name="another")).encode()
    assert w.decode_message("t", 0, 9, None, other, timestamp=-1).id != untimed


def test_xzepr_attributes_and_forced_formats():
    ev = w.decode_message("t", 0, 1, None, xzepr_event(payload={"plan": PLAN}, success=False))
    assert (ev.platform_id, ev.package, ev.api_version, ev.success, ev.version) == \
        ("kubernetes", "myapp", "v1", False, "2.1.0")
    # --format cloudevents reads an XZepr event as a plain CloudEvent: data.plan only
    ev = w.decode_message("t", 0, 1, None, xzepr_event(payload={"plan": PLAN}), fmt="cloudevents")
    assert ev.format == "cloudevents" and ev.plan is None and "data.plan" in ev.plan_error
    # --format plan takes the whole value as the plan, even when it looks like an event
    ev = w.decode_message("t", 0, 1, b"k", cloudevent(data={"plan": PLAN}), fmt="plan")
    assert ev.format == "plan" and ev.plan is None and "missing required key 'goal'" in ev.plan_error
    with pytest.raises(w.BadMessage, match="no 'specversion'"):
        w.decode_message("t", 0, 1, None, json.dumps(PLAN).encode(), fmt="xzepr")


@pytest.mark.parametrize("value,headers,reason,event_id", [
    (b"\xff\xfe garbage", [], "not UTF-8", None),
    (b"", [], "empty message", None),
    (b"{{{: [", [], "neither JSON nor YAML", None),
    (cloudevent(source=""), [], "missing required CloudEvents attribute 'source'", "ce-1"),
    (json.dumps({"specversion": "1.0", "source": "s", "type": "t"}).encode(), [], "attribute 'id'", None),
    (cloudevent(specversion="0.3"), [], "unsupported CloudEvents specversion", "ce-1"),
    (b"{}", [("ce_specversion", b"1.0"), ("ce_id", b"x")], "attribute 'source'", "x"),
])
def test_malformed_messages(value, headers, reason, event_id):
    with pytest.raises(w.BadMessage) as exc:
        w.decode_message("t", 0, 1, None, value, headers)
    assert reason in exc.value.reason and exc.value.event_id == event_id


def test_a_cloudevent_without_a_string_id_is_answered_under_its_number_or_its_key():
    """CloudEvents ids are strings: an event with the number 123, or none, is rejected, but answered (found by an
    attack round: both went unanswered, though a body that could not be read at all was answered under its key)."""
    doc = {"specversion": "1.0", "source": "s", "type": "t", "data": {"plan": PLAN}}
    for event_id, key, answered in ((123, None, "123"), (123, b"k", "123"), (None, b"k", "k"), (True, b"k", "k"),
                                    ([1], b"k", "k"), (1.5, None, None), (1.5, b"k", "k"),
                                    (10 ** 30, None, "1" + "0" * 30), (10 ** 1024, b"k", "k")):
        with pytest.raises(w.BadMessage) as bad:
            w.decode_message("t", 0, 1, key, json.dumps(dict(doc, id=event_id)).encode())
        assert bad.value.event_id == answered, (event_id, key)
        assert "must be a string" in bad.value.reason or event_id is None, bad.value.reason
    # said as what it is, never "missing" (found by an attack round: 1.5, 5.0 and 10**18 had no id, it said)
    for event_id, said in ((7, "not the number 7"), (5.0, "not the number 5.0"), (True, "not a boolean"),
                           ({}, "not an object"), (10 ** 1024, "not the number of 1025 digits")):
        with pytest.raises(w.BadMessage, match="must be a string \\(CloudEvents\\), %s" % said):
            w.decode_message("t", 0, 1, None, json.dumps(dict(doc, id=event_id)).encode())


def test_a_surrogate_id_a_binary_image_a_structured_event_with_ce_headers_and_a_blank_ce_id():
    """Found by an attack round. A JSON id of half a character is no id (mended to '?' it took another event's id);
    a binary CloudEvent whose data is not text is an event without a plan, which the filters decide about (it was
    rejected as "not UTF-8"); `content-type: application/cloudevents+json` is structured whatever ce_* headers come
    with it (the Kafka binding: it was read as binary, "no plan"); a blank ce_id is answered under the key."""
    surrogate = b'{"specversion": "1.0", "id": "p-q\\ud800", "source": "s", "type": "t", "data": {}}'
    with pytest.raises(w.BadMessage, match="half a character") as bad:
        w.decode_message("t", 0, 1, b"k", surrogate)
    assert bad.value.event_id == "k"
    assert w.decode_message("t", 0, 1, None, cloudevent(id="p-q?")).id == "p-q?"  # the real one is a valid id
    for fmt in ("cloudevents", "xzepr"):  # forced formats, a document that is no event: the same rule (review)
        with pytest.raises(w.BadMessage) as bad:
            w.decode_message("t", 0, 1, b"k", b'{"id": "p-q\\ud800", "goal": "G"}', fmt=fmt)
        assert bad.value.event_id == "k"
        with pytest.raises(w.BadMessage) as bad:
            w.decode_message("t", 0, 1, b"k", b'{"id": 77, "goal": "G"}', fmt=fmt)
        assert bad.value.event_id == "77"
    image = [("ce_specversion", b"1.0"), ("ce_id", b"img-1"), ("ce_type", b"com.example.image"),
             ("ce_source", b"cam"), ("content-type", b"image/png")]
    ev = w.decode_message("t", 0, 1, None, b"\x89PNG\r\n\x1a\n\xff\xfe", image)
    assert (ev.id, ev.plan) == ("img-1", None) and "not UTF-8" in ev.plan_error
    assert w.Filters(event_types="xz.plan").check(ev)  # skipped by the filters, not rejected
    structured = [("ce_specversion", b"1.0"), ("ce_id", b"header-id"),
                  ("Content-Type", b"application/cloudevents+json; charset=utf-8")]
    ev = w.decode_message("t", 0, 1, None, cloudevent(id="body-id", data={"plan": PLAN}), structured)
    assert (ev.id, ev.plan.goal) == ("body-id", PLAN["goal"])
    with pytest.raises(w.BadMessage) as bad:
        w.decode_message("t", 0, 1, b"k", b"{not json", structured)
    assert bad.value.event_id == "k"  # the header names nothing on a structured event
    blank = [("ce_specversion", b"1.0"), ("ce_id", b" "), ("ce_type", b"t"), ("ce_source", b"s")]
    with pytest.raises(w.BadMessage, match="attribute 'id'") as bad:
        w.decode_message("t", 0, 1, b"k", json.dumps({"plan": PLAN}).encode(), blank)
    assert bad.value.event_id == "k"


def test_a_stop_signal_takes_no_lock_the_thread_it_interrupts_may_hold():
    """A signal handler runs on the main thread between two of its steps: SIGTERM while that thread wrote a log
    line (its lock held, the pipe full) hung the watcher for good, since the handler logged too (attack round 12)."""
    watcher = w.Watcher(w.Settings(topic="t"), w.Filters(), None, log=w.WatchLog(io.StringIO()))

    def interrupted():  # holding what the main thread may hold when the signal comes, the handler's call
        with watcher.log.lock, watcher.cond, watcher.producer_lock:
            watcher.signal_stop("SIGTERM")
    thread = threading.Thread(target=interrupted, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive() and not watcher.stopping.is_set()  # asked, not done: the stopper does it
    stopper = threading.Thread(target=watcher._stopper, daemon=True)
    stopper.start()
    assert watcher.stopping.wait(5)
    watcher.signal_stop("SIGTERM")  # the second: stop now
    assert watcher.hard_stop.wait(5)
    watcher.stop_requests.put(None)
    stopper.join(5)
    assert not stopper.is_alive()


class _Future:
    def __init__(self):
        self.is_done, self.error, self.done = False, None, threading.Event()

    def fail(self, exc):
        self.error, self.is_done = exc, True
        self.done.set()

    def get(self, timeout=None):
        if not self.done.wait(timeout):
            import kafka
            raise kafka.errors.KafkaTimeoutError("no ack in time")
        if self.error is not None:
            raise self.error
        return "ok"


class _Producer:
    def __init__(self, sends):
        self.sends = sends

    def send(self, topic, key=None, value=None, headers=None):
        future = _Future()
        self.sends.append((time.monotonic(), self, future))
        if len(self.sends) > 1:  # the second send is acked at once
            future.is_done = True
            future.done.set()
        return future


def test_a_result_whose_producer_is_renewed_under_it_is_waited_out_not_sent_again_at_once():
    """Another worker's failures renew the shared producer and close the old one by force, which fails every
    record in it, in flight or not: the broker may have this one (sent again at once, one event got two results:
    attack round 12). It is waited out as a late ack is, four publish timeouts from its send."""
    import kafka
    watcher = w.Watcher(w.Settings(topic="t", publish_timeout=0.25), w.Filters(), None,
                        log=w.WatchLog(io.StringIO()))
    watcher.kafka = kafka
    sends = []
    old = watcher.producer = _Producer(sends)

    def renew_under_it():
        while not sends:
            time.sleep(0.01)
        watcher.producer = _Producer(sends)  # as _renew_producer does for another worker's record
        sends[0][2].fail(kafka.errors.IllegalStateError("Producer is closed forcefully."))
    threading.Thread(target=renew_under_it, daemon=True).start()
    assert watcher._publish("t.results", b"k", b"{}", [], "result") is None
    assert len(sends) == 2 and sends[0][1] is old and sends[1][1] is not old
    assert sends[1][0] - sends[0][0] >= 4 * 0.25 - 0.01  # waited out, not sent again at once


def test_an_event_settled_after_its_partition_is_gone_counts_for_nothing():
    """A run that ends after its partition was lost settled on the forgotten partition, and counted: with
    --max-events the watcher stopped having committed nothing (attack round 12)."""
    tracker = w.OffsetTracker()
    tp = ("t", 0)
    tracker.assign([tp])
    po = tracker.get(tp)
    po.received(0)
    po.received(1)
    assert po.settled(0) is True
    tracker.forget([tp])
    assert po.settled(1) is False and po.settled(7) is False


def test_a_set_aside_answer_out_but_not_marked_keeps_its_claim_until_a_chore_marks_it(store):
    """Published, then the store refused the "published" mark: the claim was released all the same, and the next
    watcher sharing the store republished the stored result, two results (attack round 12, argued)."""
    watcher = w.Watcher(w.Settings(topic="t"), w.Filters(), None, store=store, log=w.WatchLog(io.StringIO()))
    watcher._publish = lambda *args, **kw: None  # the result goes out
    marks = []

    def refused(event_id, owner):  # the first time: the lock passes before the chore's try
        marks.append(event_id)
        if len(marks) == 1:
            raise OSError("database is locked")
        return store.event_published(event_id, owner)
    watcher.store = type("Refusing", (), {"__getattr__": lambda self, name: getattr(store, name),
                                          "event_published": staticmethod(refused)})()
    ev = w.Event(id="aside-1", topic="t", partition=0, offset=3)
    watcher._answer_claimed(ev, "set aside")
    assert marks == ["aside-1"] and "aside-1" in watcher.unmarked and watcher.chores
    assert store.claimed_elsewhere({"aside-1"}, "another-owner") == {"aside-1"}  # still held: nobody republishes
    watcher._do_chores()
    assert "aside-1" not in watcher.unmarked and store.event_record("aside-1")["published_at"]


def test_a_stop_asked_for_while_a_poll_fetches_commits_nothing_it_fetched():
    """The stopper thread asks for a stop at any moment, a poll in progress included: what that poll fetched is
    left unread, the client's position past it, and it was then committed as transaction markers, never answered
    (found in review)."""
    import collections
    import kafka
    tp = kafka.TopicPartition("t", 0)
    Record = collections.namedtuple("Record", "topic partition offset key value headers timestamp")

    class Consumer:
        def __init__(self, watcher):
            self.watcher, self.pos, self.commits, self.polls = watcher, 5, [], 0

        def assignment(self):
            return {tp}

        def paused(self):
            return set()

        def pause(self, *tps):
            pass

        def resume(self, *tps):
            pass

        def position(self, tp, timeout_ms=None):
            return self.pos

        def commit(self, offsets, timeout_ms=None):
            self.commits.append({p: o.offset for p, o in offsets.items()})

        def poll(self, timeout_ms=None):
            self.polls += 1
            if self.polls == 1:
                return {}
            self.watcher.request_stop("SIGTERM")  # while the client fetches
            self.pos = 8
            return {tp: [Record("t", 0, o, b"k%d" % o, b"goal: G\ninstructions: [a]\n", [], 1000) for o in (5, 6, 7)]}
    watcher = w.Watcher(w.Settings(topic="t", poll_ms=10), w.Filters(), None, log=w.WatchLog(io.StringIO()))
    watcher.kafka, watcher.consumer = kafka, Consumer(watcher)
    watcher.tracker.assign([tp])
    watcher.tracker.committed({tp: 5})
    watcher._loop()
    watcher._commit()
    assert watcher.received == 0 and all(c[tp] <= 5 for c in watcher.consumer.commits)


def test_a_plan_s_steps_cut_to_100_are_named_in_truncated():
    plan = {"goal": "G", "instructions": ["step %d" % i for i in range(150)]}
    ev = w.decode_message("t", 0, 1, b"k", json.dumps(plan).encode())
    steps = [{"step": i + 1, "text": "step %d" % i, "status": "pending"} for i in range(100)]  # as the run holds them
    data = w.result_event(ev, {"status": "completed", "answer": "a", "steps": steps}, "src")["data"]
    assert len(data["steps"]) == 100 and data["truncated"] == {"steps": 150}
    data = w.result_event(ev, {"status": "rejected", "error": "e"}, "src")["data"]  # no run, no steps: none cut
    assert data["steps"] == [] and "truncated" not in data


def test_invalid_plans_are_reported_not_raised():
    ev = w.decode_message("t", 0, 1, None, xzepr_event(payload={"plan": {"goal": "G"}}))
    assert ev.plan is None and "missing required key 'instructions'" in ev.plan_error
    ev = w.decode_message("t", 0, 1, None, xzepr_event(payload={"cluster": "prod"}))
    assert ev.plan is None and ev.plan_error.startswith("no plan in the event")
    ev = w.decode_message("t", 0, 1, None, cloudevent(data={"plan": 42}))
    assert ev.plan is None and "must be an object or text" in ev.plan_error
    ev = w.decode_message("t", 0, 1, None, b"just words")
    assert ev.format == "plan" and ev.plan is None and "must be a mapping" in ev.plan_error


def test_a_binary_header_given_twice_counts_its_last_value_in_any_case():
    # as Java's Headers.lastHeader: a record that names its id twice is run, answered and deduplicated as the last
    headers = BINARY_HEADERS + [("CE_ID", b"bin-2"), ("content-type", b"application/json")]
    ev = w.decode_message("t", 0, 1, None, json.dumps({"plan": PLAN}).encode(), headers)
    assert (ev.format, ev.id) == ("cloudevents", "bin-2")
    with pytest.raises(w.BadMessage) as bad:
        w.decode_message("t", 0, 1, None, b"", headers)
    assert bad.value.event_id == "bin-2"


def test_results_are_recognised_and_context_must_stay_in_the_jail(tmp_path):
    ev = w.decode_message("t", 0, 1, None, cloudevent(type="xzatoma.plan.completed", data={"status": "completed"}))
    assert ev.is_result
    plan = w.decode_message("t", 0, 1, None, b"goal: G\ncontext: {directory: ../..}\ninstructions: [a]").plan
    assert "outside the working directory" in w.context_outside(plan, str(tmp_path))
    assert str(tmp_path) not in w.context_outside(plan, str(tmp_path))  # the reason goes to the event's sender
    (tmp_path / "src").mkdir()
    for ok in ("src", ".", str(tmp_path / "src"), "https://github.com/x/y", "git@github.com:x/y.git"):
        plan.context = {"repository": ok}
        assert w.context_outside(plan, str(tmp_path)) is None, ok
    (tmp_path / "escape").symlink_to("/etc")
    plan.context = {"dir": "escape"}
    assert w.context_outside(plan, str(tmp_path))
    # however the key is spelled, at whatever depth, and a file: URL (an attack round named /etc in each way)
    for outside in ({"repo": "file:///etc"}, {"workingDir": "/etc"}, {"directory ": "/etc"}, [{"directory": "/etc"}],
                    {"directories": ["src", "/root"]}, {"deploy": {"rootDir": "~/.."}}, {"WORKSPACE": "/tmp"},
                    {"basedir": "/etc"}, {"srcdir": "/etc"}, {"path": ["/etc"]}, {"root": [["/"]]},
                    [{"path": "/etc"}], {"settings": {"workspaces": ["/etc"]}}, {"extra_cwds": ["/etc"]}):
        plan.context = outside
        assert "outside the working directory" in (w.context_outside(plan, str(tmp_path)) or ""), outside
    plan.context = {"dir": "file:///tmp/%00x"}  # a NUL once decoded: refused, not raised (review)
    assert "NUL" in w.context_outside(plan, str(tmp_path))
    # URL paths are not directories: these ran before the check read every depth, and run still (review)
    for inside in ({"health": "/healthz", "cluster": "prod"}, {"repository": "org/repo"}, {"paths": ["/pets"]},
                   {"endpoints": [{"method": "GET", "path": "/users"}]}, {"api_path": "/v1/health"},
                   {"service": {"root": "/"}}, {"redirect": "/login"}):
        plan.context = inside
        assert w.context_outside(plan, str(tmp_path)) is None, inside


# ---- filters ----

def _ev(value=None, **kw):
    return w.decode_message("t", 0, 1, kw.pop("key", b"k"), value or xzepr_event(payload={"plan": PLAN}, **kw))


STEPS_BARE = json.dumps(STEPS_PLAN).encode()


@pytest.mark.parametrize("filters,value,runs", [
    ({}, None, True),
    ({"event_types": "deployment.success,other"}, None, True),
    ({"event_types": "deployment"}, None, False),  # exact, not a prefix
    ({"sources": r"receiver\.01H$"}, None, True),
    ({"sources": r"^github"}, None, False),
    ({"platforms": "kubernetes"}, None, True),
    ({"platforms": "nomad"}, None, False),
    ({"packages": "myapp"}, None, True),
    ({"packages": "other"}, None, False),
    ({"api_versions": "v1"}, None, True),
    ({"api_versions": "v2"}, None, False),
    ({}, xzepr_event(payload={"plan": PLAN}, success=False), False),
    ({"include_failed": True}, xzepr_event(payload={"plan": PLAN}, success=False), True),
    ({"actions": "^DOCS\\."}, STEPS_BARE, True),  # case-insensitive search
    ({"actions": "deploy"}, STEPS_BARE, False),
    ({"names": "release"}, STEPS_BARE, True),
    ({"names": "^notes"}, STEPS_BARE, False),
    ({"match_version": "^1.4"}, STEPS_BARE, True),
    ({"match_version": "~1.4.3"}, STEPS_BARE, False),
    ({"match_version": ">=1.0,<2"}, STEPS_BARE, True),
    ({"match_version": "1.4.2"}, STEPS_BARE, True),
    ({"match_version": "^1.4", "names": "nope"}, STEPS_BARE, False),  # all given must hold
    ({"match_version": ">=1.0"}, json.dumps(dict(STEPS_PLAN, version="v1.5")).encode(), False),  # not semver
    ({"match_version": ">=1.0"}, b"goal: G\ninstructions: [a]\n", False),  # no version at all
    ({"event_types": "deployment.success"}, STEPS_BARE, False),  # a bare plan has no type
])
def test_filter_matrix(filters, value, runs):
    assert (w.Filters(**filters).check(_ev(value)) is None) == runs


@pytest.mark.parametrize("version,constraint,ok", [
    ("1.2.3", "1.2.3", True), ("1.2.4", "1.2.3", False), ("1.2.9", "1.2", True), ("1.3.0", "1.2", False),
    ("1.9.0", "^1.2", True), ("2.0.0", "^1.2", False), ("0.2.5", "^0.2", True), ("0.3.0", "^0.2", False),
    ("0.0.3", "^0.0.3", True), ("0.0.4", "^0.0.3", False), ("1.2.9", "~1.2.3", True), ("1.3.0", "~1.2.3", False),
    ("1.5.0", ">=1.0,<2", True), ("2.0.0", ">=1.0,<2", False), ("2.0.0-rc.1", ">=1.0, <2", False),
    ("1.0.0-rc.1", ">=1.0.0", False), ("1.0.0-rc.2", ">1.0.0-rc.1", True), ("1.0.0-alpha", "<1.0.0-beta", True),
    ("1.2.3+build.5", "1.2.3", True), ("01.2.3", ">=1", False), ("1.2", ">=1", False), ("", "^1", False),
])
def test_semver_constraints(version, constraint, ok):
    assert w.VersionConstraint(constraint).matches(version) is ok


@pytest.mark.parametrize("kwargs,flag", [({"sources": "("}, "--source"), ({"names": "[a"}, "--name"),
                                         ({"actions": "*x"}, "--action"), ({"match_version": "^one"},
                                                                           "--match-version"),
                                         ({"match_version": ">=1.0,<<2"}, "--match-version")])
def test_invalid_filters_name_the_flag(kwargs, flag):
    with pytest.raises(w.WatchError, match="^" + flag):
        w.Filters(**kwargs)


# ---- result events ----

def test_a_message_that_cannot_be_read_is_answered_under_the_id_cloudevents_gives_it():
    """A binary CloudEvent (ce_specversion and ce_id headers) whose body cannot be read is answered under its
    ce_id; any other message only under its key (found by attack rounds 10 and 11: a ce_id header on a structured
    message, whose id is in its body, named nothing, and answered under it, it took over another event's id)."""
    binary = [("ce_specversion", b"1.0"), ("ce_id", b"from-header")]
    with pytest.raises(w.BadMessage) as bad:
        w.decode_message("t", 0, 1, b"key", b"\xff not utf-8", binary)
    assert bad.value.event_id == "from-header"
    for body in (b'{"specversion": "1.0", "id": "x", ', b"{{{: ["):
        with pytest.raises(w.BadMessage) as bad:
            w.decode_message("t", 0, 1, b"key", body, [("ce_id", b"evt-9")])
        assert bad.value.event_id == "key", body


def test_a_structured_cloudevent_s_data_base64_carries_a_plan():
    """CloudEvents' JSON format puts binary data in data_base64: a plan there was "no plan"."""
    import base64
    for body, kind in ((json.dumps({"plan": PLAN}), "application/json"),
                       ("goal: From base64\ninstructions: [a]\n", "application/yaml")):
        doc = {"specversion": "1.0", "id": "b64", "type": "t", "source": "s", "datacontenttype": kind,
               "data_base64": base64.b64encode(body.encode()).decode()}
        ev = w.decode_message("t", 0, 1, None, json.dumps(doc).encode())
        assert ev.plan is not None and ev.plan.goal in ("Count the files", "From base64"), ev.plan_error
    # binary data (an image), or JSON over the bounds: no plan, which the filters decide about first (rejected at
    # once, an image on a shared topic got a result though the filters skipped its type: round 11)
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n\xff\xfe").decode()
    deep = base64.b64encode(b"[" * 1500 + b"]" * 1500).decode()
    for data in (png, "not base64!", deep):
        ev = w.decode_message("t", 0, 1, None, json.dumps(dict(doc, data_base64=data)).encode())
        assert ev.id == "b64" and ev.plan is None and ev.plan_error.startswith("no plan")
        assert w.Filters(event_types="other").check(ev)  # skipped by the filters, not rejected


def test_a_message_read_or_set_aside_unread_is_answered_under_the_same_id():
    """A set-aside message was keyed by its first exact-case ce_id header, a rejected one by the last in any case
    (found by an attack round): one rule now, message_id_hint."""
    import types
    headers = [("ce_specversion", b"1.0"), ("CE_ID", b"first"), ("ce_id", b"last"), ("ce_source", b"\xff")]
    with pytest.raises(w.BadMessage) as bad:
        w.decode_message("t", 0, 1, b"key", b"{}", headers)
    assert bad.value.event_id == "last"
    assert w._guess_id(types.SimpleNamespace(key=b"key", headers=headers)) == "last"
    assert w._guess_id(types.SimpleNamespace(key=b"key", headers=[("ce_id", b"\xff")])) == "key"
    assert w._guess_id(types.SimpleNamespace(key=None, headers=[])) is None


def test_result_event_shape_and_bounded_answer():
    ev = _ev()
    out = w.result_event(ev, {"status": "max_turns", "answer": "é" * 10, "conversation_id": "C1", "turns": 3,
                              "usage": {"prompt_tokens": 5}}, "xzatoma://host/g", answer_limit=7)
    assert out["specversion"] == "1.0" and out["type"] == "xzatoma.plan.failed" and out["subject"] == ev.id
    assert out["source"] == "xzatoma://host/g" and out["datacontenttype"] == "application/json"
    uuid.UUID(out["id"])
    assert out["time"].endswith("Z")
    data = out["data"]
    assert data["answer"] == "ééé" and data["answer_truncated"] is True  # 7 bytes, never half a character
    assert (data["status"], data["trigger_event_id"], data["conversation_id"], data["turns"], data["goal"]) == \
        ("failed", ev.id, "C1", 3, "Count the files")
    # numbers JSON cannot carry are left out (a model server's usage of NaN made a result strict parsers refuse)
    odd = w.result_event(ev, {"status": "completed", "turns": float("nan"), "duration_seconds": float("inf"),
                              "usage": {"prompt_tokens": float("nan"), "completion_tokens": 1e309, "total": 10 ** 400,
                                        "cached": 2}}, "s")
    json.loads(w._encode(odd), parse_constant=lambda name: pytest.fail("%s in a result" % name))
    assert odd["data"]["usage"] == {"cached": 2} and odd["data"]["turns"] == 0


def _alias_bomb(levels=9):
    """356 bytes of YAML naming 9**9 strings (issue 22: 47 s, a 684 MB database)."""
    lines = ["goal: G", "instructions: [a]", "context:", '  l0: &l0 ["x","x","x","x","x","x","x","x","x"]']
    lines += ["  l%d: &l%d [%s]" % (n, n, ",".join(["*l%d" % (n - 1)] * 9)) for n in range(1, levels)]
    return ("\n".join(lines) + "\n").encode()


def _binary(event_id, value, content_type=b"application/json", **extra):
    headers = [("ce_specversion", b"1.0"), ("ce_id", event_id), ("ce_source", b"ci"), ("ce_type", b"build.done"),
               ("content-type", content_type)]
    return value, headers + list(extra.items())


POISON = [
    # (name, key, value, headers, event id of the rejection or None, what the reason says)
    ("deep JSON array", None, b"[" * 1500 + b"]" * 1500, [], None, "nested deeper than 64 levels"),
    ("deep JSON object", b"k1", b'{"a":' * 1500 + b"1" + b"}" * 1500, [], "k1", "nested deeper than 64 levels"),
    ("deep JSON in a CloudEvent", None, cloudevent("deep-ce", data={"plan": "x"}).replace(
        b'"x"', b"[" * 1500 + b"]" * 1500), [], None, "nested deeper than 64 levels"),
    ("deep JSON, binary mode", None) + _binary(b"deep-bin", b"[" * 1500 + b"]" * 1500) +
    ("deep-bin", "nested deeper than 64 levels"),
    ("deep JSON plan text, binary mode", None) + _binary(b"deep-bin2", b'{"plan": "' + b"[" * 1500 + b'"}') +
    ("deep-bin2", "nested deeper than 64 levels"),
    ("YAML alias bomb, bare", b"bomb", _alias_bomb(), [], "bomb", "once its aliases are expanded"),
    ("YAML alias bomb in data.plan", None, cloudevent("bomb-ce", data={"plan": _alias_bomb().decode()}), [],
     "bomb-ce", "once its aliases are expanded"),
    ("recursive alias", b"rec", b"goal: G\ninstructions: [a]\nc: &c [1, *c]\n", [], "rec", "contains it"),
    ("a 5000-digit number", b"num", b"goal: " + b"1" * 5000 + b"\ninstructions: [a]\n", [], "num",
     "integer string conversion"),
    ("YAML base 60 of 200 KB", b"b60", b"goal: G\ninstructions: [a]\nn: " + b":".join([b"1"] * 100000) + b"\n", [],
     "b60", "a base-60 number (x:y:z) of 199999 characters"),
    ("an id of 20 KB", None, cloudevent("i" * 20000, data={"plan": PLAN}), [], w._cut_id("i" * 20000),
     "event id is 20000"),
    # cut, two keys that differ past the limit were one id: the second plan never ran, logged a duplicate
    ("a bare plan's key of 2 KB", b"k" * 2048, b"goal: G\ninstructions: [a]\n", [], w._cut_id("k" * 2048),
     "message key (a bare plan's event id) is 2048 bytes"),
    ("a type of 20 KB", None, cloudevent("long-type", type="t" * 20000, data={"plan": PLAN}), [], "long-type",
     "attribute 'type' is over the limit"),
    # a binary CloudEvent's ce_id is its id whatever else is wrong: its rejection is answered (it was not)
    ("a ce_source header of 20 KB", None) + _binary(b"long-hdr", b"{}", ce_source=b"s" * 20000) +
    ("long-hdr", "header 'ce_source' is 20000 bytes"),
    ("300 headers, binary mode", None, b"{}", BINARY_HEADERS + [("h%d" % i, b"v") for i in range(300)], "bin-1",
     "304 headers"),
    ("a body not UTF-8, binary mode", None, b"\xff\xfe{}", BINARY_HEADERS, "bin-1", "not UTF-8"),
    ("an empty body, binary mode", b"key", b"", BINARY_HEADERS, "bin-1", "empty message"),
    ("300 headers", b"many", b"goal: G\ninstructions: [a]\n", [("h%d" % i, b"v") for i in range(300)], "many",
     "300 headers"),
    ("a context path of a million parts", b"deep-path",
     b'goal: G\ninstructions: [a]\ncontext: {directory: "' + b"a/" * 500000 + b'"}\n', [], "deep-path",
     "longer than a path can be"),
    ("over max_message_bytes", b"big", b"goal: " + b"x" * 70000 + b"\ninstructions: [a]\n", [], "big",
     "over the limit of 65536"),
]


@pytest.mark.parametrize("name,key,value,headers,event_id,reason", POISON, ids=[p[0] for p in POISON])
def test_poison_messages_are_bad_messages_in_bounded_memory(name, key, value, headers, event_id, reason):
    """Issue 22: `[` x 1500 raised RecursionError (the watcher exited 1 on every restart); a 356-byte plan took
    47 s and 684 MB. Each is now one rejection, read in bounded memory."""
    import tracemalloc
    tracemalloc.start()
    try:
        try:
            ev = w.decode_message("t", 0, 1, key, value, headers, max_bytes=65536 if "max_message" in name else 8 << 20)
            rejected = w.BadMessage(ev.plan_error, ev.id) if ev.plan is None else None
            outside = w.context_outside(ev.plan, "/tmp") if rejected is None else None
            rejected = w.BadMessage(outside, ev.id) if outside else rejected
        except w.BadMessage as exc:
            rejected = exc
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rejected is not None and reason in rejected.reason, rejected and rejected.reason
    assert rejected.event_id == event_id
    assert peak < 48 * 1024 * 1024, peak


def test_an_id_or_key_of_up_to_1_kb_is_kept_whole_and_one_past_it_is_refused():
    """Found by an attack round: ids and bare plans' keys of 1,022 to 1,024 bytes (within the documented 1 KB) were
    cut to make room for the cut's mark: a CloudEvent was rejected, and two keys differing in their last bytes
    were one id, so the second plan never ran."""
    plan = b"goal: G\ninstructions: [a]\n"
    for n in (1022, 1024):
        assert w.decode_message("t", 0, 1, None, cloudevent("i" * n, data={"plan": PLAN})).id == "i" * n
        assert w.decode_message("t", 0, 1, b"k" * (n - 3) + b"AAA", plan).id == "k" * (n - 3) + "AAA"
        assert w.decode_message("t", 0, 1, "é".encode() * (n // 2), plan).id == "é" * (n // 2)  # 2 bytes each
    with pytest.raises(w.BadMessage) as caught:
        w.decode_message("t", 0, 1, None, cloudevent("i" * 1025, data={"plan": PLAN}))
    assert caught.value.event_id.startswith("i" * 1024 + "…") and "1025 bytes" in caught.value.reason
    with pytest.raises(w.BadMessage) as caught:
        w.decode_message("t", 0, 1, "é".encode() * 513, plan)
    assert 1024 < len(caught.value.event_id.encode()) <= w.ID_CUT_BYTES and "1026 bytes" in caught.value.reason
    # a cut id is never a valid one: 'A' x 1,100 was answered as 'A' x 1,021 + '…', a valid id that then never ran
    valid = "A" * 1021 + "…"
    assert w.decode_message("t", 0, 1, None, cloudevent(valid, data={"plan": PLAN})).id == valid
    with pytest.raises(w.BadMessage) as caught:
        w.decode_message("t", 0, 1, None, cloudevent("A" * 1100, data={"plan": PLAN}))
    assert caught.value.event_id != valid and len(caught.value.event_id.encode()) > w.ID_MAX_BYTES
    # and two long ids sharing their first 1 KB stay two (the second got no result: a duplicate of the first)
    first, second = w._cut_id("A" * 1024 + "-first"), w._cut_id("A" * 1024 + "-second")
    assert first != second and len(first.encode()) == len(second.encode()) == w.ID_CUT_BYTES


def test_half_a_character_is_sent_as_a_question_mark_never_an_encoding_error():
    """JSON may escape a lone surrogate (\\ud800), and a model's reply may hold one: Python keeps it in a str that
    cannot be encoded, so the result (and its failed replacement) raised UnicodeEncodeError: no result at all."""
    value = cloudevent("half", data={"plan": {"goal": "G", "instructions": ["a"]}}).replace(b'"G"', b'"G \\ud800"')
    ev = w.decode_message("t", 0, 1, None, value)
    assert ev.plan.goal == "G ?"
    out = w.result_event(ev, {"status": "completed", "answer": "x\udfff" * 5, "error": "\ud800"}, "s",
                         max_bytes=20000)
    data = json.loads(w._encode(out))["data"]
    assert data["answer"] == "x?" * 5 and data["error"] == "?"
    # and when it must be cut to fit (UnicodeEncodeError: the completed run was reported failed)
    out = w.result_event(ev, {"status": "completed", "answer": "x\udfff" * 20000}, "s", max_bytes=14336)
    assert len(w._encode(out)) <= 14336 and out["data"]["status"] == "completed"
    assert json.loads(w._encode(out))["data"]["answer"].startswith("x?x?")


def test_headers_the_watcher_does_not_read_are_never_a_reason_to_reject():
    ev = w.decode_message("t", 0, 1, b"k", b"goal: G\ninstructions: [a]\n",
                          [("traceparent", b"\xff\xfe"), (b"\xff", b"x"), ("x-big", b"y" * 100000)])
    assert ev.plan is not None and ev.id == "k"


def test_every_result_field_is_bounded_and_the_whole_event_fits():
    """Issue 22: a 2 MB goal copied whole made a result over the producer's 1 MB limit, retried forever."""
    token = "ghp_" + "A" * 36
    goal = "g" * 8180 + " " + token + " " + "g" * (2 << 20)  # the token across the goal's bound
    ev = w.decode_message("t", 0, 1, None, cloudevent("fit-1", type="build." + "x" * 3000,
                                                      data={"plan": {"goal": goal, "instructions": ["a"]}}))
    outcome = {"status": "completed", "answer": "a" * (3 << 20), "error": "\x01" * (1 << 20),
               "conversation_id": "C" * 5000, "usage": {"prompt_tokens": 1, "junk": "x" * 100000},
               "turns": "many"}
    for limit in (1048576 - 1024, 65536, 16000):
        out = w.result_event(ev, outcome, "xzatoma://h/g", answer_limit=65536, max_bytes=limit)
        encoded = json.dumps(out, ensure_ascii=False).encode()
        assert len(encoded) <= limit, (limit, len(encoded))
        data = out["data"]
        assert data["truncated"]["goal"] > 2 << 20 and data["truncated"]["answer"] == 3 << 20
        assert data["truncated"]["conversation_id"] == 5000 and data["answer_truncated"] is True
        assert "ghp_" not in data["goal"] and (limit < 65536 or data["goal"].startswith("g" * 8180 + " [REDACTED"))
        assert data["usage"] == {"prompt_tokens": 1} and data["turns"] == 0
        assert out["subject"] == "fit-1" and data["trigger_event_id"] == "fit-1"
    small = w.result_event(_ev(), {"status": "completed", "answer": "ok"}, "s", max_bytes=65536)["data"]
    assert "truncated" not in small and "answer_truncated" not in small and small["answer"] == "ok"


def test_xzepr_posts_are_bounded_too():
    api = FakeXzepr()
    client = w.XzeprClient(api.url, None, attempts=1, max_body_bytes=16384)
    plan = dict(STEPS_PLAN, name="n" * 5000, version="9" * 3000)
    ev = w.decode_message("t", 0, 1, None, xzepr_event(event_id="xz-big", payload={"plan": plan},
                                                       release="r" * 3000, package="p" * 3000))
    client.post_event(ev.plan_name() + ".completed", ev, False,
                      {"trigger_event_id": ev.id, "status": "failed", "error": "e" * (1 << 20)})
    body = api.events()[0]
    assert len(json.dumps(body, ensure_ascii=False).encode()) <= 16384
    assert body["name"].endswith(".completed") and len(body["name"]) <= 256
    assert len(body["version"]) <= 256 and len(body["release"]) <= 256 and len(body["package"]) <= 256
    assert body["payload"]["truncated"]["error"] == 1 << 20 and body["payload"]["trigger_event_id"] == "xz-big"


def _min_request_size():
    import xzatoma_core
    return next(k for k in xzatoma_core.KEYS if k.name == "watcher.kafka.max_request_size").bounds[0]


def _hostile(kind):
    """(event, outcome) whose every field is as large as the watcher lets it be, in characters JSON escapes to 6
    bytes (control), or in characters of 2-4 bytes that a cut must not split (multibyte)."""
    if kind == "multibyte":
        plan = {"goal": "é" * 5000 + "𝄞" * 3000, "instructions": ["€" * 200] * 100}
        ev = w.decode_message("t", 0, 1, None, cloudevent("𝄞" * 255, type="€" * 1365, data={"plan": plan}))
        return ev, {"status": "completed", "answer": "a𝄞€é" * 20000, "error": "€" * 5000,
                    "conversation_id": "𝄞" * 100, "warnings": ["𝄞" * 600] * 20,
                    "usage": {"é" * 60 + str(i): i for i in range(40)},
                    "steps": [{"text": "é" * 300, "status": "done"}] * 10000, "turns": 3}
    if kind == "rejected, 4 KB type":  # case B: a bad plan whose type is 4096 control characters
        ev = w.decode_message("t", 0, 1, None, cloudevent("\x01" * 1024, type="\x01" * 4096,
                                                          data={"plan": {"goal": "\x01" * 9000}}))
        assert ev.plan is None
        return ev, {"status": "rejected", "error": ev.plan_error + "\x01" * 9000}
    plan = {"goal": "\x01" * 9000, "instructions": ["\x02" * 300] * 100}
    ev = w.decode_message("t", 0, 1, None, cloudevent("\x01" * 1024, type="\x01" * 4096, data={"plan": plan}))
    return ev, {"status": "completed", "answer": "\x01" * 70000, "error": "\x1b" * 9000,
                "conversation_id": "\x02" * 300, "warnings": ["\x03" * 2000] * 50,
                "usage": {"\x04" * 60 + str(i): i for i in range(40)},
                "steps": [{"text": "\x05" * 300, "status": "\x06" * 20}] * 10000, "turns": 3}


@pytest.mark.parametrize("kind", ["control", "multibyte", "rejected, 4 KB type"])
def test_a_result_fits_whatever_the_event_and_the_run_held(kind):
    """Issue 22 (attack round): only answer, goal and error were cut, so the steps (100 x 256 bytes, a control
    character 6 bytes as JSON), a 4 KB type or the ids left `result_event` raising "cannot fit": a rejected event
    got no result at all, a completed run was reported failed. Now every field gives way, in order, down to the
    smallest budget a watcher has, and the status and the subject stay whole."""
    ev, outcome = _hostile(kind)
    status = outcome["status"]
    floor = _min_request_size() - w.RECORD_OVERHEAD - w.ID_CUT_BYTES  # Watcher._budget with the longest key
    sources = {"trigger_event_id": ev.id, "trigger_type": ev.type, "goal": ev.plan.goal if ev.plan else None,
               "answer": outcome.get("answer"), "error": outcome["error"],
               "conversation_id": outcome.get("conversation_id")}
    for size in (1048576, 65536, 32768, _min_request_size()):
        for budget in sorted({size - w.RECORD_OVERHEAD - len(ev.id.encode()), floor}):
            out = w.result_event(ev, outcome, "xzatoma://h/g", 65536, budget)
            encoded = w._encode(out)
            assert len(encoded) <= budget, (size, budget, len(encoded))
            doc = json.loads(encoded)
            data = doc["data"]
            assert (doc["type"], data["status"], doc["subject"]) == ("xzatoma.plan." + status, status, ev.id)
            for name, source in sources.items():  # each text whole, or a head of it (never half a character, nor a
                # '?' for one) and named as cut
                if data[name] != source:
                    assert source.startswith(data[name]) and data["truncated"][name] >= len(source.encode())
            assert len(data["steps"]) <= 100 and len(data["warnings"]) <= 8 and len(data["usage"]) <= 16
            if "steps" in outcome:  # a list cut says how many there were
                assert data["truncated"]["steps"] == 10000 and data["truncated"]["warnings"] in (20, 50)
                assert data["truncated"]["usage"] == 40 and all(s["step"] == n + 1 for n, s in
                                                                enumerate(data["steps"]))
    assert floor == 14317  # 16384 less the frame and an id cut to 1 KB, with its mark and digest


def test_a_result_keeps_what_matters_most_when_it_must_give_way():
    """The order of the cut: steps, warnings and the type go before any of the answer; the answer, goal and error
    before the conversation and trigger ids; a completed run stays completed, with a note of the cut."""
    plan = {"goal": "Summarise the logs", "instructions": ["\x02" * 250] * 100}
    ev = w.decode_message("t", 0, 1, None, cloudevent("order-1", type="\x01" * 4096, data={"plan": plan}))
    outcome = {"status": "completed", "answer": "A" * 30000, "conversation_id": "conv-1",
               "steps": [{"text": "\x05" * 256, "status": "done"}] * 100, "warnings": ["\x03" * 1024] * 8,
               "usage": {"prompt_tokens": 7}}
    roomy = w.result_event(ev, outcome, "s", 65536, 65536 - 1024 - 7)["data"]
    assert roomy["answer"] == "A" * 30000 and roomy["goal"] == "Summarise the logs"
    assert len(roomy["steps"]) < 100 and roomy["truncated"]["steps"] == 100 and "answer" not in roomy["truncated"]
    tight = w.result_event(ev, outcome, "s", 65536, 14336)["data"]
    assert tight["status"] == "completed" and tight["answer_truncated"] is True and tight["answer"].startswith("A")
    assert (tight["steps"], tight["warnings"], tight["trigger_type"]) == ([], [], "")
    assert (tight["conversation_id"], tight["trigger_event_id"], tight["usage"]) == ("conv-1", "order-1",
                                                                                     {"prompt_tokens": 7})
    assert tight["truncated"]["trigger_type"] == 4096 and tight["truncated"]["answer"] == 30000


def test_an_xzepr_post_fits_whatever_the_event_held():
    """The same flaw in the XZepr post: only the payload's texts were cut, largest first, so when an event's name,
    version, release, platform, package and (in the description) id were control characters, the post was made
    to fit 16 KB by cutting the trigger's id away, the one link to its event, while the description kept it."""
    api = FakeXzepr()
    client = w.XzeprClient(api.url, None, attempts=1, max_body_bytes=16384)
    ev = w.decode_message("t", 0, 1, None, xzepr_event(event_id="\x01" * 1024, payload={"plan": PLAN},
                                                       name="\x01" * 4000, version="\x01" * 4000,
                                                       release="\x01" * 4000, platform_id="\x01" * 4000,
                                                       package="\x01" * 4000))
    client.post_event("\x01" * 4000 + ".completed", ev, True,
                      {"trigger_event_id": ev.id, "status": "completed", "error": "\x01" * (1 << 20),
                       "conversation_id": "\x02" * 300, "turns": 1})
    body = api.events()[0]
    assert len(json.dumps(body, ensure_ascii=False).encode()) <= 16384
    assert body["name"].endswith(".completed") and body["success"] is True
    assert (body["payload"]["trigger_event_id"], body["payload"]["status"]) == (ev.id, "completed")
    assert body["payload"]["truncated"]["error"] == 1 << 20 and body["payload"]["truncated"]["description"]


def test_a_dead_letter_copy_s_reason_is_redacted_as_the_log_and_the_result_are():
    """Found by an attack round: a token quoted in a rejection reason (a specversion, a YAML tag, a context path)
    was [REDACTED] in the log and the result, and whole in the dead-letter copy's xzatoma_reason header."""
    from types import SimpleNamespace
    token = "ghp_" + "QWERTYUIOPasdfghjklzxcvbnmQWERTYUIOP"
    watcher = w.Watcher(w.Settings(topic="t", dead_letter_topic="dlq"), w.Filters(), None,
                        log=w.WatchLog(io.StringIO()))
    sent = []
    watcher._publish = lambda topic, key, value, headers, what, give_up_after=None: sent.append(dict(headers))
    msg = SimpleNamespace(topic="t", partition=0, offset=7, key=b"k", value=b"{}", headers=[("h", b"v")])
    watcher._dead_letter(msg, "unsupported specversion %r" % token)
    reason = sent[0]["xzatoma_reason"].decode()
    assert token not in reason and "[REDACTED]" in reason and sent[0]["h"] == b"v"  # the message's own: as sent


def test_a_dead_letter_copy_says_its_key_was_cut_as_it_says_its_value_was():
    """A rejected event's 5,000-byte key went to the dead-letter topic cut to 4,096 bytes with nothing saying so,
    though the copy was far under any limit (round 17b): a replay of it lands elsewhere, under another id."""
    from types import SimpleNamespace
    watcher = w.Watcher(w.Settings(topic="t", dead_letter_topic="dlq"), w.Filters(), None,
                        log=w.WatchLog(io.StringIO()))
    sent = []
    watcher._publish = lambda topic, key, value, headers, what, give_up_after=None: sent.append((key, dict(headers)))
    msg = SimpleNamespace(topic="t", partition=0, offset=7, key=b"k" * 5000, value=b"{}", headers=[])
    watcher._dead_letter(msg, "the key is too long")
    watcher._dead_letter(w.Kept(msg, 1 << 20), "the key is too long")  # as a waiting job keeps it
    watcher._dead_letter(SimpleNamespace(topic="t", partition=0, offset=8, key=b"k", value=b"{}", headers=[]), "r")
    assert [(len(key), headers.get("xzatoma_key_truncated")) for key, headers in sent] == \
        [(4096, b"5000"), (4096, b"5000"), (1, None)]


def test_only_the_broker_s_refusals_count_toward_giving_a_result_up():
    """A broker that answered nothing for 17 minutes had a completed run's result replaced by `failed` after 20
    timeouts (attack round 17c): a silence is waited out (the stall shows on the metrics), never taken for the
    broker refusing the result, which is what watcher.publish_attempts counts."""
    kafka = pytest.importorskip("kafka")

    class Future:
        def __init__(self, error=None):
            self.error, self.is_done = error, error is not None

        def get(self, timeout):
            if self.error is None:
                time.sleep(timeout)
                raise kafka.errors.KafkaTimeoutError("no answer")
            raise self.error

    class Producer:
        def __init__(self, error=None):
            self.error, self.sent = error, 0

        def send(self, *args, **kwargs):
            self.sent += 1
            return Future(self.error)

    renewals = []

    def watcher(producer):
        watcher = w.Watcher(w.Settings(topic="t", publish_timeout=0.01, backoff_initial=0.001, backoff_max=0.002),
                            w.Filters(), None, log=w.WatchLog(io.StringIO()))
        watcher.kafka, watcher.producer = kafka, producer
        watcher._renew_producer = lambda failed: renewals.append(failed)  # no broker answers: no new producer
        return watcher

    refusing = watcher(Producer(kafka.errors.NotLeaderForPartitionError("refused")))
    assert "refused" in refusing._publish("out", b"k", b"v", [], "result", give_up_after=3)
    assert refusing.producer.sent == 3
    silent = watcher(Producer())
    first = silent.producer
    done = []
    thread = threading.Thread(target=lambda: done.append(silent._publish("out", b"k", b"v", [], "result",
                                                                         give_up_after=3)))
    thread.start()
    # ten renewals tried, and nothing given up, nor sent again through the producer whose send went unanswered:
    # a frozen broker reads what waits in its socket when it wakes (two copies of one result, round 17e)
    assert wait_for(lambda: renewals.count(first) >= 10, 30) and not done and first.sent == 1
    fresh = Producer()
    silent.producer = fresh  # a new producer could be made: the broker answers again
    assert wait_for(lambda: fresh.sent >= 1, 30) and not done and first.sent == 1
    silent.hard_stop.set()
    thread.join(10)
    assert done and "no answer" in done[0]


def test_a_log_whose_reader_stops_reading_never_holds_the_watcher():
    """Found by an attack round: with stderr a pipe nobody read, every thread that logged waited on it, the
    consumer loop and the signal's stopper included: 12 of 400 events committed, then nothing, and SIGTERM twice
    did not stop it. Lines the reader cannot take are dropped and counted, and said once it reads again."""
    import select
    r, wfd = os.pipe()
    stream = os.fdopen(wfd, "w")
    log = w.WatchLog(stream, "json")
    logged = threading.Thread(target=lambda: [log("received", event_id="e%d" % i, note="x" * 300)
                                              for i in range(20000)])
    logged.start()
    logged.join(60)
    assert not logged.is_alive() and log.dropped > 0  # 20,000 lines against a 64 KB pipe: it never waited
    seen, deadline = b"", time.monotonic() + 60
    while b"log_dropped" not in seen and time.monotonic() < deadline:  # the reader is back
        if select.select([r], [], [], 1)[0]:
            seen = seen[-200000:] + os.read(r, 1 << 16)
    note = json.loads(next(l for l in seen.split(b"\n") if b"log_dropped" in l))
    assert note["lines"] > 0 and note["level"] == "warn"
    while log._queue.unfinished_tasks and time.monotonic() < deadline:  # all that waited is written
        if select.select([r], [], [], 1)[0]:
            seen = seen[-200000:] + os.read(r, 1 << 16)
    log("stopped")
    closer = threading.Thread(target=log.close)
    closer.start()
    while closer.is_alive() or select.select([r], [], [], 0)[0]:
        if select.select([r], [], [], 0.5)[0]:
            seen = seen[-200000:] + os.read(r, 1 << 16)
    assert seen.rstrip().endswith(b'"event": "stopped"}')  # close() wrote what waited
    stream.close()
    os.close(r)


def test_decision_log_escapes_control_characters_and_redacts():
    buf = io.StringIO()
    log = w.WatchLog(buf, "text", redact=lambda s: s.replace("hunter2secret", "[REDACTED]"))
    log("received", event_id="a\x1b[2Jb", type="x y", note="hunter2secret")
    line = buf.getvalue()
    assert "\x1b" not in line and "\\x1b[2J" in line and 'type="x y"' in line and "[REDACTED]" in line
    # invisible characters by their Unicode category, not a list (a bidi mark, tag characters smuggling text,
    # a soft hyphen, an invisible operator were let through), and line breaks: one decision, one line
    hidden = "\u061c\u2061\u206a\u00ad\ufff9\U000e0041\U000e007f\u202e\u2028"
    buf = io.StringIO()
    w.WatchLog(buf, "text")("received", event_id="id" + hidden, source="s\nforged=line\r\n")
    line = buf.getvalue()
    assert line.count("\n") == 1 and line.endswith("\n")
    assert not set(hidden) & set(line) and "\\U000e0041" in line and "\\u061c" in line
    buf = io.StringIO()
    w.WatchLog(buf, "json")("committed", partition=1, offset=5)
    assert json.loads(buf.getvalue())["event"] == "committed"
    # every field is bounded, redacted before its cut (a filtered event's name of a million characters was one
    # 11.5 MB line; a cut through a key would have kept half of it)
    token = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    for fmt in ("text", "json"):
        buf = io.StringIO()
        w.WatchLog(buf, fmt)("filtered", reason="name %r does not match --name" % ("\U000e0041" * 10 ** 6),
                             note="x" * (w.LOG_FIELD_CHARS - 20) + " " + token, steps=["s" * 100] * 1000)
        line = buf.getvalue()
        assert len(line) < 12 * 3 * w.LOG_FIELD_CHARS and "characters more]" in line, fmt
        assert "ghp_" not in line and "A1b2C3d4" not in line, fmt


def test_an_error_in_the_log_is_the_one_hardened_line():
    """The watcher's error lines are xzatoma_store.one_line: a form feed in a name is shown, not folded into
    a blank (the copy the watcher had missed that hardening); an error that says nothing is named by its type."""
    assert w._one_line(OSError("a\x0cb.txt")) == "a\\x0cb.txt"
    assert w._one_line(TimeoutError()) == "TimeoutError"


def test_offsets_commit_up_to_the_lowest_unfinished():
    po = w.PartitionOffsets()
    for o in (10, 11, 12, 13):
        po.received(o)
    po.settled(11)
    po.settled(13)
    assert po.commit_point() == 10
    po.settled(10)
    assert po.commit_point() == 12
    po.committed = 12
    assert po.commit_point() is None
    po.settled(12)
    assert po.commit_point() == 14


def test_a_lost_partition_takes_back_what_it_settled_and_never_committed():
    """--max-events counts events settled and committed: a watcher whose partition was lost (the broker paused
    past the session) before its commit exited 0 with nothing committed (found by an attack round)."""
    from kafka import TopicPartition
    tracker, tp, other = w.OffsetTracker(), TopicPartition("t", 0), TopicPartition("t", 1)
    for o in (0, 1, 2, 3):
        tracker.get(tp).received(o)
    tracker.get(other).received(0)
    tracker.get(other).settled(0)
    for o in (0, 1, 2):
        tracker.get(tp).settled(o)
    tracker.get(tp).settled(2)  # settled twice counts once
    tracker.committed({tp: 1})  # 0 is committed; 1 and 2 are settled, not committed; 3 runs
    assert tracker.forget([tp]) == 2
    assert tracker.forget([tp]) == 0 and list(tracker.partitions) == [other]


def test_a_log_read_again_from_an_earlier_offset_starts_the_partition_s_offsets_again():
    """Kafka answers a fetch past a log's end with OFFSET_OUT_OF_RANGE (the topic made anew), and the client reads
    again from the oldest record: the watcher committed only past the group's old offset, so nothing it answered
    there was ever committed (attack round 17a). A message from before where the partition was read to starts
    its offsets again; the runs received before settle where they were received, counting for nothing."""
    from kafka import TopicPartition
    tracker, tp = w.OffsetTracker(), TopicPartition("t", 0)
    tracker.committed({tp: 0})
    old = tracker.get(tp)
    for o in range(6):
        old.received(o)
    for o in range(5):
        old.settled(o)
    tracker.committed({tp: 5})  # 5 still runs
    assert tracker.rewound(tp, 6) is None and tracker.rewound(tp, 5) is None  # read on; a message waiting
    assert tracker.rewound(tp, 0) == 6
    tracker.restart(tp, 0)
    assert tracker.commit_points() == {tp: 0}  # the group's offset (6) set right at once
    new = tracker.get(tp)
    new.received(0)
    assert old.settled(5) is False and tracker.commit_points() == {tp: 0}  # the old run counts for nothing here
    assert new.settled(0) is True and tracker.commit_points() == {tp: 1}
    tracker.committed({tp: 1})
    assert tracker.commit_points() == {} and tracker.rewound(tp, 1) is None


def test_missing_kafka_hint(tmp_path):
    """One install_hint for the program and the watcher: pipx is known by the metadata it writes at its venv's
    root (a PIPX_HOME of any name), not by a directory called pipx."""
    from xzatoma_store import install_hint
    (tmp_path / "pipx_metadata.json").write_text("{}")
    assert install_hint("kafka-python", "kafka", str(tmp_path)) == "pipx inject xzatoma kafka-python"
    assert install_hint("kafka-python", "kafka", "/home/u/.local/pipx/nothing-here").startswith(
        "pip install 'xzatoma[kafka]'")


# ---- the consumer loop against a real broker (in-process, run-one-plan injected) ----

FAST_GROUP = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000, "max_poll_interval_ms": 8000}


class Lines(io.TextIOBase):
    """A thread-safe text sink that keeps lines (the watcher's log or its dry-run output)."""

    def __init__(self):
        self.lines, self.lock = [], threading.Lock()

    def write(self, text):
        with self.lock:
            self.lines.extend(l for l in text.splitlines() if l)
        return len(text)

    def json(self):
        with self.lock:
            return [json.loads(l) for l in self.lines]

    def events(self, name):
        return [r for r in self.json() if r.get("event") == name]


def new_topic(broker, partitions=1):
    import kafka_broker as kb
    name = "t-" + uuid.uuid4().hex[:10]
    kb.create_topic(broker.address, name, partitions)
    return name


def start_watcher(broker, topic, run_plan, store=None, filters=None, **settings):
    settings.setdefault("group_id", "g-" + uuid.uuid4().hex[:8])
    settings.setdefault("consumer_options", FAST_GROUP)
    settings.setdefault("shutdown_grace", 5)
    s = w.Settings(brokers=broker.address, topic=topic, **settings)
    log, out = Lines(), Lines()
    watcher = w.Watcher(s, filters or w.Filters(), run_plan, store=store, log=w.WatchLog(log, "json"), out=out)
    watcher.log_lines, watcher.out_lines = log, out
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    watcher.thread = thread
    return watcher


def gated_runner(timeout=60):
    """(gate, runner, run_plan): fake_runner's runs, each held until the gate is set."""
    gate, runner = threading.Event(), fake_runner()

    def run_plan(job):
        gate.wait(timeout)
        return runner(job)
    return gate, runner, run_plan


def fake_runner(delay=0.0, answers=None):
    calls = []

    def run_plan(job):
        calls.append(job)
        if delay:
            job.cancel.wait(delay)
            if job.cancel.is_set():
                return {"status": "interrupted", "conversation_id": "conv-" + job.event.id, "error": "interrupted"}
        return {"status": "completed", "answer": (answers or {}).get(job.event.id, "done: " + job.plan.goal),
                "conversation_id": "conv-" + job.event.id, "turns": 1, "tool_calls": 0,
                "usage": {"prompt_tokens": 10, "completion_tokens": 2}}
    run_plan.calls = calls
    return run_plan


@pytest.fixture
def store(tmp_path):
    from xzatoma_store import Store
    s = Store(str(tmp_path / "conversations.db")).open()
    yield s
    s.close()


def test_an_error_while_a_message_is_rejected_costs_that_message_alone(kafka_broker, store, monkeypatch):
    """Found by round 16b: a rejected event's plan was made a prompt, and failed there (an integer too long to be
    written in decimal): the error escaped the path that handles errors and the watcher exited 1, on every start.
    A rejected event is answered without its plan; an error in rejecting it costs that message, not the watcher."""
    import kafka_broker as kb
    import xzatoma_plans
    topic = new_topic(kafka_broker)

    class Broken(w.Filters):
        def check(self, ev):
            if ev.id in ("boom", "worse"):
                raise RuntimeError("a bug")
            return super().check(ev)
    prompt = xzatoma_plans.Plan.to_prompt

    def to_prompt(plan):
        if plan.goal == "explode":
            raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")
        return prompt(plan)
    monkeypatch.setattr(xzatoma_plans.Plan, "to_prompt", to_prompt)
    job = w.Job.__init__

    def init(self, event, *args, **kw):
        if event.id == "worse":
            raise RuntimeError("the rejection broke too")
        job(self, event, *args, **kw)
    monkeypatch.setattr(w.Job, "__init__", init)
    kb.produce(kafka_broker.address, topic, [
        (None, cloudevent(event_id="boom", data={"plan": dict(PLAN, goal="explode")})),
        (None, cloudevent(event_id="worse", data={"plan": PLAN})),
        (None, cloudevent(event_id="after", data={"plan": PLAN}))])
    run_plan = fake_runner()
    watcher = start_watcher(kafka_broker, topic, run_plan, store, max_events=3, filters=Broken())
    watcher.thread.join(60)
    assert not watcher.thread.is_alive() and [j.event.id for j in run_plan.calls] == ["after"]
    results = {json.loads(r.value)["subject"]: json.loads(r.value)
               for r in kb.read_all(kafka_broker.address, topic + ".results", 2)}
    assert sorted(results) == ["after", "boom"] and results["boom"]["type"] == "xzatoma.plan.rejected"
    assert any("the rejection broke too" in l.get("error", "") for l in watcher.log_lines.events("error"))
    assert kb.committed(kafka_broker.address, watcher.s.group_id, topic) == [3]

def test_a_message_that_breaks_the_watcher_after_it_was_read_is_answered_under_its_own_id(kafka_broker, store):
    """Found by an attack round: a NUL in a plan's context directory raised in realpath, and the catch-all answered
    under a guess from the message's key (no key: no result at all); a version of 5,000 digits raised in int()
    and rejected an event the --match-version filter should have skipped."""
    import kafka_broker as kb
    topic = "t-" + uuid.uuid4().hex[:8]
    kb.create_topic(kafka_broker.address, topic)

    class Broken(w.Filters):
        def check(self, ev):
            if ev.id == "boom":
                raise RuntimeError("a bug")
            return super().check(ev)
    nul = dict(PLAN, version="1.2.0", context={"directory": "sub\x00dir"})
    long_version = dict(PLAN, version="1" * 5000 + ".0.0")
    kb.produce(kafka_broker.address, topic, [
        (b"key-1", cloudevent(event_id="nul-ctx", data={"plan": nul})),
        (None, cloudevent(event_id="nul-ctx-2", data={"plan": nul})),
        (b"key-2", cloudevent(event_id="boom", data={"plan": dict(PLAN, version="1.0.0")})),
        (b"key-3", cloudevent(event_id="digits", data={"plan": long_version}))])
    run_plan = fake_runner()
    watcher = start_watcher(kafka_broker, topic, run_plan, store, max_events=4,
                            filters=Broken(match_version="^1.0"))
    watcher.thread.join(60)
    assert not watcher.thread.is_alive() and run_plan.calls == []
    results = {json.loads(r.value)["subject"]: json.loads(r.value)
               for r in kb.read_all(kafka_broker.address, topic + ".results", 3)}
    assert sorted(results) == ["boom", "nul-ctx", "nul-ctx-2"]  # "digits" filtered: no result
    assert all(r["type"] == "xzatoma.plan.rejected" for r in results.values())
    assert "NUL character" in results["nul-ctx"]["data"]["error"]
    assert "RuntimeError: a bug" in results["boom"]["data"]["error"]
    assert [r["event_id"] for r in watcher.log_lines.events("filtered")] == ["digits"]
    assert kb.committed(kafka_broker.address, watcher.s.group_id, topic) == [4]


def test_watcher_runs_each_format_once_and_rejects_bad_input(kafka_broker, store):
    import kafka_broker as kb
    topic = new_topic(kafka_broker)
    messages = [(None, c[2], c[3]) if c[1] is None else (c[1], c[2], c[3]) for c in FORMAT_CASES]
    # distinct ids: FORMAT_CASES reuse some ids on purpose elsewhere
    unique = []
    for i, (key, value, headers) in enumerate(messages):
        if value.startswith(b"{") and b'"specversion"' in value:
            doc = json.loads(value)
            doc["id"] = "evt-%d" % i
            value = json.dumps(doc).encode()
        headers = [(k, b"bin-%d" % i) if k == "ce_id" else (k, v) for k, v in headers]
        unique.append((key if key else None, value, headers))
    runnable = len(unique)
    bad = [
        (None, b"\xff\xfe not utf-8", []),                                           # no id: no result
        (b"bad-yaml", b"{{{: [", []),                                                 # keyed: rejected result
        (None, cloudevent(event_id="no-source", source="", data={"plan": PLAN}), []),  # rejected result
        (None, xzepr_event(event_id="bad-plan", payload={"plan": {"goal": "G"}}), []),  # rejected result
        (None, cloudevent(event_id="res-1", type="xzatoma.plan.completed", data={}), []),  # a result: skipped
        (None, xzepr_event(event_id="failed-evt", payload={"plan": PLAN}, success=False), []),  # filtered
        (None, cloudevent(event_id="evt-0", data={"plan": PLAN}), []),               # duplicate id of message 0
        # a dead-letter copy, back on an input topic: rejected, not copied again (two watchers, each's copies the
        # other's input, looped one message forever)
        (b"copy", b"{{{: [", [("xzatoma_reason", b"x"), ("xzatoma_origin", b"other:0:5")]),
        # another bad message under an answered id: no second result, but a dead-letter copy (it had neither)
        (None, xzepr_event(event_id="bad-plan", payload={"plan": {"goal": "Other"}}), []),
    ]
    kb.produce(kafka_broker.address, topic, unique + bad)
    total = len(unique) + len(bad)
    run_plan = fake_runner()
    watcher = start_watcher(kafka_broker, topic, run_plan, store, dead_letter_topic=topic + ".dlq",
                            max_events=total)
    watcher.thread.join(90)
    assert not watcher.thread.is_alive()
    log = watcher.log_lines

    ran = sorted(j.event.id for j in run_plan.calls)
    assert len(ran) == runnable and len(set(ran)) == runnable  # every format ran, and exactly once
    assert "evt-0" in ran and ran.count("evt-0") == 1
    assert sorted(r["event_id"] for r in log.events("duplicate")) == ["bad-plan", "evt-0"]
    rejected = {r.get("event_id"): r["reason"] for r in log.events("rejected")}
    assert rejected[None].startswith("not UTF-8") and "neither JSON nor YAML" in rejected["bad-yaml"]
    assert "attribute 'source'" in rejected["no-source"] and "'instructions'" in rejected["bad-plan"]
    filtered = {r["event_id"]: r["reason"] for r in log.events("filtered")}
    assert "result published by xzatoma" in filtered["res-1"] and "failed event" in filtered["failed-evt"]
    for r in log.events("rejected"):
        assert {"topic", "partition", "offset"} <= set(r)

    # results: CloudEvents 1.0 on <topic>.results, keyed by the input id, one per event that passed the filters
    records = kb.read_all(kafka_broker.address, topic + ".results", runnable + 4)
    results = [json.loads(r.value) for r in records]
    by_subject = {}
    for r, rec in zip(results, records):
        assert dict(rec.headers)["content-type"].startswith(b"application/cloudevents+json")
        assert rec.key.decode() == r["subject"]
        assert r["specversion"] == "1.0" and r["source"].startswith("xzatoma://")
        by_subject.setdefault(r["subject"], []).append(r)
    assert all(len(v) == 1 for v in by_subject.values()), by_subject
    completed = {s for s, v in by_subject.items() if v[0]["type"] == "xzatoma.plan.completed"}
    assert completed == set(ran)
    assert len([s for s in completed if re.match(r"^%s:0:\d+@\d{13}$" % topic, s)]) == 1  # the keyless bare plan
    assert {s for s, v in by_subject.items() if v[0]["type"] == "xzatoma.plan.rejected"} == \
        {"bad-yaml", "no-source", "bad-plan", "copy"}
    assert [r["origin"] for r in log.events("dead_letter_skipped")] == ["other:0:5"]
    sample = by_subject["evt-0"][0]["data"]
    assert sample["answer"] == "done: Count the files" and sample["conversation_id"] == "conv-evt-0"
    assert sample["trigger_event_id"] == "evt-0" and sample["usage"] == {"prompt_tokens": 10, "completion_tokens": 2}

    # dead letters: bad input copied with the reason
    dead = kb.read_all(kafka_broker.address, topic + ".dlq", 5)
    reasons = sorted(dict(d.headers)["xzatoma_reason"].decode() for d in dead)
    assert len(dead) == 5 and any(r.startswith("not UTF-8") for r in reasons)
    assert sum(r.endswith("its id is answered already, so it has no result") for r in reasons) == 1

    # committed past every message: a restart re-reads nothing; each run recorded in the store
    assert kb.committed(kafka_broker.address, watcher.s.group_id, topic) == [total]
    record = store.event_record("evt-0")
    assert record["status"] == "completed" and record["published_at"] and record["conversation_id"] == "conv-evt-0"
    assert json.loads(record["metadata"])["topic"] == topic
    # the job handed to the runner carries the conversation metadata
    job = next(j for j in run_plan.calls if j.event.id == "evt-0")
    assert job.metadata == {"event_id": "evt-0", "type": "deployment.success", "source": "xzepr.event.receiver.01H",
                            "topic": topic, "partition": 0, "offset": 0, "format": "xzepr"}


def test_dry_run_prints_what_would_run_and_commits_nothing(kafka_broker, monkeypatch):
    import kafka_broker as kb
    from kafka.record import util
    monkeypatch.setattr(util, "crc32c_c", None)  # as if the kafka extra's crc32c were missing: said, once
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [
        (None, cloudevent(event_id="d1", data={"plan": PLAN})),
        (None, cloudevent(event_id="d2", type="other", data={"plan": PLAN})),  # filtered out
        (b"d3", json.dumps(STEPS_PLAN).encode()),
        (None, b"\xff"),                                                       # rejected
    ])
    run_plan = fake_runner()
    watcher = start_watcher(kafka_broker, topic, run_plan, dry_run=True, max_events=4,
                            filters=w.Filters(names="release"))
    watcher.thread.join(60)
    assert not watcher.thread.is_alive()
    lines = watcher.out_lines.json()
    assert [l["event_id"] for l in lines] == ["d3"]  # d1 and d2 have no plan name: --name filters them out
    assert lines[0]["goal"] == "Write release notes" and lines[0]["version"] == "1.4.2" and lines[0]["offset"] == 2
    assert run_plan.calls == []
    assert kb.committed(kafka_broker.address, watcher.s.group_id, topic) == [None]
    assert kb.read_all(kafka_broker.address, topic + ".results", 1, timeout=2) == []
    slow = watcher.log_lines.events("slow_crc")
    assert len(slow) == 1 and "pip install crc32c" in slow[0]["hint"]


def test_a_dry_run_whose_output_is_closed_stops_and_blames_no_message(kafka_broker):
    """Found by an attack round: after `--dry-run | head -1` the reader went, and every later message was logged
    "rejected: the watcher could not read this message: BrokenPipeError", 49 of 50. The run stops instead."""
    import kafka_broker as kb
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [(b"p%d" % i, json.dumps(PLAN).encode()) for i in range(5)])

    class Gone:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass
    log = Lines()
    s = w.Settings(brokers=kafka_broker.address, topic=topic, group_id="g-" + uuid.uuid4().hex[:8], dry_run=True,
                   consumer_options=FAST_GROUP, shutdown_grace=5)
    watcher = w.Watcher(s, w.Filters(), None, log=w.WatchLog(log, "json"), out=Gone())
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    assert len(log.events("output_closed")) == 1 and log.events("rejected") == []
    assert "dry run's output was closed" in log.events("stopping")[0]["reason"]


class FakeXzepr:
    """A local XZepr API: receivers and events, with scripted failures."""

    def __init__(self, event_failures=0):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        self.requests, self.receivers, self.event_failures = [], [], event_failures
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _reply(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                fake.requests.append(("GET", self.path, self.headers.get("Authorization"), None))
                self._reply(200, {"data": fake.receivers})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(("POST", self.path, self.headers.get("Authorization"), body))
                if self.path == "/api/v1/receivers":
                    fake.receivers.append(dict(body, id="R1"))
                    return self._reply(201, {"id": "R1"})
                if fake.event_failures:
                    fake.event_failures -= 1
                    return self._reply(503, {"error": "busy"})
                self._reply(201, {"id": "E%d" % len(fake.requests)})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self):
        return [r[3] for r in self.requests if r[0] == "POST" and r[1] == "/api/v1/events"]


def test_xzepr_api_gets_started_and_completed_with_retries_on_5xx(kafka_broker, store):
    import kafka_broker as kb
    api = FakeXzepr(event_failures=2)
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [(None, xzepr_event(event_id="x1", payload={"plan": STEPS_PLAN})),
                                             (None, xzepr_event(event_id="x2", payload={"plan": PLAN}))])
    client = w.XzeprClient(api.url, "xzepr-key-123456", attempts=3, backoff=0.01)
    run_plan = fake_runner()
    watcher = start_watcher(kafka_broker, topic, run_plan, store, max_events=2)
    watcher.xzepr = client
    watcher.thread.join(60)
    assert not watcher.thread.is_alive()
    events = api.events()
    names = [e["name"] for e in events]
    # x1: started failed twice (503) then went through; each name posted once successfully after retries
    assert names.count("release-notes.started") == 3 and names.count("release-notes.completed") == 1
    assert names.count("deployment.success.started") == 1 and names.count("deployment.success.completed") == 1
    assert client.retries == 2
    assert [r for r in api.requests if r[1].startswith("/api/v1/receivers")][0][0] == "GET"
    assert sum(1 for r in api.requests if r[:2] == ("POST", "/api/v1/receivers")) == 1  # created once, then reused
    assert all(r[2] == "Bearer xzepr-key-123456" for r in api.requests)
    done = [e for e in events if e["name"] == "release-notes.completed"][0]
    assert done["event_receiver_id"] == "R1" and done["success"] is True and done["version"] == "1.4.2"
    assert done["payload"]["trigger_event_id"] == "x1" and done["payload"]["status"] == "completed"
    assert done["platform_id"] == "kubernetes" and done["package"] == "myapp"


def test_xzepr_down_is_logged_and_counted_never_blocking(kafka_broker, store):
    import kafka_broker as kb
    api = FakeXzepr(event_failures=1000)
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [(None, xzepr_event(event_id="y1", payload={"plan": PLAN}))])
    watcher = start_watcher(kafka_broker, topic, fake_runner(), store, max_events=1)
    watcher.xzepr = w.XzeprClient(api.url, None, attempts=2, backoff=0.01)
    watcher.thread.join(60)
    assert not watcher.thread.is_alive()
    failed = watcher.log_lines.events("xzepr_failed")
    assert len(failed) == 2 and "HTTP 503" in failed[0]["error"] and "after 2 attempts" in failed[0]["error"]
    assert watcher.counts["xzepr_failed"] == 2 and watcher.counts["completed"] == 1
    assert kb.committed(kafka_broker.address, watcher.s.group_id, topic) == [1]


def test_a_result_recorded_but_never_published_is_published_not_rerun(kafka_broker, store):
    """A crash between recording and publishing: the redelivered event publishes the stored result again."""
    import kafka_broker as kb
    topic = new_topic(kafka_broker)
    ev = w.decode_message(topic, 0, 0, None, cloudevent(event_id="crash-1", data={"plan": PLAN}))
    stored = w.result_event(ev, {"status": "completed", "answer": "from before", "conversation_id": "C0"},
                            "xzatoma://h/g")
    store.record_event("crash-1", "C0", "completed", result=json.dumps(stored))
    kb.produce(kafka_broker.address, topic, [(None, cloudevent(event_id="crash-1", data={"plan": PLAN}))])
    run_plan = fake_runner()
    watcher = start_watcher(kafka_broker, topic, run_plan, store, max_events=1)
    watcher.thread.join(60)
    assert run_plan.calls == []
    results = [json.loads(r.value) for r in kb.read_all(kafka_broker.address, topic + ".results", 1)]
    assert [r["id"] for r in results] == [stored["id"]] and results[0]["data"]["answer"] == "from before"
    assert store.event_record("crash-1")["published_at"]


def test_max_concurrent_runs_in_parallel_and_commits_only_up_to_the_lowest_unfinished(kafka_broker, store):
    import kafka_broker as kb
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [(None, cloudevent(event_id="c%d" % i, data={"plan": PLAN}))
                                             for i in range(6)])
    gate = threading.Event()
    running = []

    def run_plan(job):
        running.append(job.event.id)
        if job.event.id == "c0":
            gate.wait(30)  # the first event is slow: nothing at or after it may be committed
        return {"status": "completed", "answer": job.event.id, "conversation_id": "conv"}
    watcher = start_watcher(kafka_broker, topic, run_plan, store, max_concurrent=4, max_events=6)
    assert wait_for(lambda: len(watcher.log_lines.events("finished")) >= 5, 60)
    assert len(running) == 6 and wait_for(lambda: len(watcher.log_lines.events("finished")) == 5, 2)
    time.sleep(0.5)  # several commit rounds pass while c0 is unfinished…
    assert kb.committed(kafka_broker.address, watcher.s.group_id, topic)[0] in (None, 0)  # …none past it
    gate.set()
    watcher.thread.join(60)
    assert kb.committed(kafka_broker.address, watcher.s.group_id, topic) == [6]


def test_stop_lets_running_plans_finish_then_interrupts_and_redelivers(kafka_broker, store):
    import kafka_broker as kb
    topic = new_topic(kafka_broker)
    group = "g-" + uuid.uuid4().hex[:8]
    kb.produce(kafka_broker.address, topic, [(None, cloudevent(event_id="quick", data={"plan": PLAN})),
                                             (None, cloudevent(event_id="slow", data={"plan": PLAN}))])
    started = threading.Event()

    def run_plan(job):
        if job.event.id == "quick":
            started.set()
            time.sleep(1.0)  # finishes inside the grace period
            return {"status": "completed", "answer": "q", "conversation_id": "cq"}
        job.cancel.wait(60)  # never finishes by itself: interrupted when the grace period ends
        return {"status": "interrupted", "error": "cancelled", "conversation_id": "cs"}
    watcher = start_watcher(kafka_broker, topic, run_plan, store, group_id=group, max_concurrent=2, shutdown_grace=3)
    assert started.wait(60)
    assert wait_for(lambda: len(watcher.in_flight) == 2, 10)
    t0 = time.monotonic()
    watcher.request_stop("SIGTERM")
    watcher.thread.join(30)
    assert not watcher.thread.is_alive() and 2.5 < time.monotonic() - t0 < 15
    log = watcher.log_lines
    assert [r["event_id"] for r in log.events("finished")] == ["quick"]
    assert [r["event_id"] for r in log.events("interrupted")] == ["slow"]
    assert kb.committed(kafka_broker.address, group, topic) == [1]  # quick committed, slow redelivered
    assert store.event_record("slow") is None
    # a watcher of the same group later gets "slow" again and completes it, once
    again = start_watcher(kafka_broker, topic, fake_runner(), store, group_id=group, max_events=1)
    again.thread.join(60)
    assert [r["event_id"] for r in again.log_lines.events("finished")] == ["slow"]
    assert kb.committed(kafka_broker.address, group, topic) == [2]
    types = sorted((json.loads(r.value)["subject"], json.loads(r.value)["type"])
                   for r in kb.read_all(kafka_broker.address, topic + ".results", 3, timeout=5))
    # one result each: the stopped run published nothing (read_all waits for a third that must not come)
    assert types == [("quick", "xzatoma.plan.completed"), ("slow", "xzatoma.plan.completed")]


def test_two_watchers_in_one_group_run_every_event_exactly_once(kafka_broker, tmp_path):
    """Scale-out: a second process joins mid-stream; the rebalance finishes and commits before handing over, so
    nothing runs twice even with separate stores (no dedupe to hide a double run)."""
    import kafka_broker as kb
    from xzatoma_store import Store
    topic = new_topic(kafka_broker, partitions=4)
    group = "g-" + uuid.uuid4().hex[:8]
    ids = ["e%02d" % i for i in range(40)]
    kb.produce(kafka_broker.address, topic, [(None, cloudevent(event_id=i, data={"plan": PLAN}), [], n % 4)
                                             for n, i in enumerate(ids)])
    runners = [fake_runner(delay=0.4), fake_runner(delay=0.4)]
    stores = [Store(str(tmp_path / ("s%d.db" % n))).open() for n in range(2)]
    first = start_watcher(kafka_broker, topic, runners[0], stores[0], group_id=group, max_concurrent=2, idle_exit=4)
    assert wait_for(lambda: len(runners[0].calls) >= 4, 60)
    second = start_watcher(kafka_broker, topic, runners[1], stores[1], group_id=group, max_concurrent=2,
                           idle_exit=4)
    first.thread.join(120)
    second.thread.join(120)
    ran = [j.event.id for r in runners for j in r.calls]
    assert sorted(ran) == ids  # every event exactly once in total
    assert runners[1].calls, "\n".join(str((n, r["time"][14:], r["event"], r.get("partitions"), r.get("event_id"))) for n, x in enumerate((first, second)) for r in x.log_lines.json() if r["event"] not in ("received", "started", "finished"))
    assert first.log_lines.events("revoked"), "the first watcher gave partitions up in a rebalance"
    assert kb.committed(kafka_broker.address, group, topic, 4) == [10, 10, 10, 10]
    subjects = [json.loads(r.value)["subject"] for r in kb.read_all(kafka_broker.address, topic + ".results", 40)]
    assert sorted(subjects) == ids
    for s in stores:
        s.close()


def test_broker_down_at_start_and_restarted_mid_stream(tmp_path, kafka_broker, store):
    """Unreachable at start: retried with backoff, each attempt logged. Lost mid-stream (this broker keeps
    everything in memory, so it comes back empty): the watcher rejoins and runs what arrives, nothing twice."""
    import kafka_broker as kb
    broker = kb.Broker(kafka_broker.binary, str(tmp_path / "broker.log"))
    topic = "restart-" + uuid.uuid4().hex[:8]
    run_plan = fake_runner()
    watcher = start_watcher(broker, topic, run_plan, store, backoff_initial=0.2, backoff_max=1.0,
                            publish_timeout=3.0)
    try:
        assert wait_for(lambda: len(watcher.log_lines.events("broker_unavailable")) >= 2, 30)
        attempts = [r["attempt"] for r in watcher.log_lines.events("broker_unavailable")]
        assert attempts[:2] == [1, 2]
        broker.start()
        kb.create_topic(broker.address, topic)
        kb.produce(broker.address, topic, [(None, cloudevent(event_id="a%d" % i, data={"plan": PLAN}))
                                           for i in range(3)])
        assert wait_for(lambda: len(watcher.log_lines.events("finished")) == 3, 60)
        broker.stop()
        time.sleep(1.0)  # the broker stays away for a while (nothing to wait for: it is simply gone)
        broker.start()
        kb.create_topic(broker.address, topic)
        kb.create_topic(broker.address, topic + ".results")  # a real broker keeps its topics; this one forgot
        kb.produce(broker.address, topic, [(None, cloudevent(event_id="b%d" % i, data={"plan": PLAN}))
                                           for i in range(3)])
        assert wait_for(lambda: len(watcher.log_lines.events("finished")) == 6, 60), "\n".join(str(x) for x in [
            (r["time"][14:], r["event"], r.get("error")) for r in watcher.log_lines.json()])
        watcher.request_stop("test")
        watcher.thread.join(30)
        ran = sorted(j.event.id for j in run_plan.calls)
        assert ran == ["a0", "a1", "a2", "b0", "b1", "b2"]
        subjects = sorted(json.loads(r.value)["subject"] for r in kb.read_all(broker.address, topic + ".results", 3))
        assert subjects == ["b0", "b1", "b2"]
    finally:
        watcher.request_stop("test")
        broker.stop()


@pytest.fixture
def freezable_broker(tmp_path, kafka_broker):
    """A broker of the test's own, which it may freeze (SIGSTOP: it answers nothing, but reads what is on its
    sockets when thawed) and thaw; thawed and stopped at the end."""
    import signal
    import kafka_broker as kb
    broker = kb.Broker(kafka_broker.binary, str(tmp_path / "broker.log")).start()
    broker.freeze = lambda: broker.proc.send_signal(signal.SIGSTOP)
    broker.thaw = lambda: broker.proc.send_signal(signal.SIGCONT)
    yield broker
    if broker.proc is not None:
        broker.thaw()
    broker.stop()


def test_a_late_ack_is_waited_for_never_sent_again_nor_given_up_on(freezable_broker, store):
    """A broker that freezes while a result is on its way: the wait for the ack times out (publish_timeout),
    which is no failed attempt (watcher.publish_attempts is 1), and the result is neither sent again nor
    replaced by a failed one: the broker reads it when it wakes, and a second send (or a replacement) published
    two results for one event. Each event gets exactly one result, the right one; the offsets are committed."""
    import kafka_broker as kb
    broker = freezable_broker
    topic = new_topic(broker)
    kb.produce(broker.address, topic, [(None, cloudevent("late-%d" % i, data={"plan": PLAN})) for i in range(3)])
    runner = fake_runner()
    frozen = threading.Event()
    started = []

    def run_plan(job):
        started.append(job.event.id)
        if job.event.id == "late-1":  # its result goes out to a broker that stops answering
            assert wait_for(lambda: watcher.log_lines.events("finished"), 30)  # late-0's is out: metadata known
            broker.freeze()
            frozen.set()
        return runner(job)
    watcher = start_watcher(broker, topic, run_plan, store, publish_timeout=1.0, publish_attempts=1,
                            backoff_initial=0.05, backoff_max=0.1, max_events=3)
    try:
        assert frozen.wait(60)
        # late (the producer answers within 3 publish timeouts: woken before, the broker acknowledges it)
        assert wait_for(lambda: watcher.log_lines.events("publish_waiting"), 30), started
        assert "Timeout" in watcher.log_lines.events("publish_waiting")[0]["error"]
        broker.thaw()
        watcher.thread.join(60)
        assert not watcher.thread.is_alive()
        results = sorted((json.loads(r.value)["subject"], json.loads(r.value)["data"]["status"])
                         for r in kb.read_all(broker.address, topic + ".results", 3))
        assert results == [("late-0", "completed"), ("late-1", "completed"), ("late-2", "completed")]
        assert kb.committed(broker.address, watcher.s.group_id, topic) == [3]
        assert sorted(started) == ["late-0", "late-1", "late-2"]
        assert not watcher.log_lines.events("publish_failed")
        assert not watcher.log_lines.events("producer_renewed")  # the same producer delivered it, once
    finally:
        watcher.request_stop("test")


def test_metrics_hooks_count_outcomes_and_runs(kafka_broker, store):
    prom = pytest.importorskip("prometheus_client")
    import kafka_broker as kb
    import xzatoma_metrics
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [(None, cloudevent(event_id="m1", data={"plan": PLAN})),
                                             (None, cloudevent(event_id="m2", type="x", data={"plan": PLAN})),
                                             (None, b"\xff")])
    metrics = xzatoma_metrics.PrometheusMetrics()
    watcher = start_watcher(kafka_broker, topic, fake_runner(), store, max_events=3,
                            filters=w.Filters(event_types="build.succeeded"), lag_interval=0.0)
    watcher.metrics = metrics
    watcher.thread.join(60)
    text = prom.generate_latest(metrics.registry).decode()
    for line in ('xzatoma_watch_events_total{outcome="completed"} 1.0', 'xzatoma_watch_events_total{outcome="filtered"} 1.0',
                 'xzatoma_watch_events_total{outcome="rejected"} 1.0', "xzatoma_watch_run_duration_seconds_count 1.0",
                 "xzatoma_watch_runs_in_flight 0.0", "xzatoma_watch_oldest_waiting_seconds 0.0"):
        assert line in text, line


def test_results_on_the_input_topic_are_never_run(kafka_broker, store):
    import kafka_broker as kb
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [(None, cloudevent(event_id="loop-%d" % i, data={"plan": PLAN}))
                                             for i in range(2)])
    run_plan = fake_runner()
    watcher = start_watcher(kafka_broker, topic, run_plan, store, output_topic=topic, max_events=4)
    watcher.thread.join(60)
    assert not watcher.thread.is_alive()
    assert sorted(j.event.id for j in run_plan.calls) == ["loop-0", "loop-1"]
    filtered = watcher.log_lines.events("filtered")
    assert len(filtered) == 2 and all("result published by xzatoma" in f["reason"] for f in filtered)
    assert kb.committed(kafka_broker.address, watcher.s.group_id, topic) == [4]


def test_a_broker_frozen_past_the_producers_answer_stops_no_partition(freezable_broker, store):
    """Frozen far longer than 3 publish timeouts with a result in flight: the producer's renewal fails while the
    broker is away, and the old producer answered nothing after it woke; the watcher waited on it forever and
    the partition stopped (found by a fault campaign). A wait is now bounded at 4 publish timeouts, then the
    record goes through a new producer: every event gets its result and all is committed. (A result may then
    come twice: the broker may have read the first before it froze; the README says so.)"""
    import kafka_broker as kb
    broker = freezable_broker
    topic = new_topic(broker)
    ids = ["fz-%d" % i for i in range(6)]
    kb.produce(broker.address, topic, [(None, cloudevent(i, data={"plan": PLAN})) for i in ids])
    runner = fake_runner()

    def run_plan(job):
        if job.event.id == "fz-1":
            assert wait_for(lambda: watcher.log_lines.events("finished"), 30)
            broker.freeze()
        return runner(job)
    watcher = start_watcher(broker, topic, run_plan, store, publish_timeout=0.3, backoff_initial=0.05,
                            backoff_max=0.2, max_events=len(ids))
    try:
        # the wait passes 4 publish timeouts and a new producer cannot be made while the broker is away
        assert wait_for(lambda: watcher.log_lines.events("producer_failed"), 60)
        broker.thaw()
        watcher.thread.join(90)
        assert not watcher.thread.is_alive(), (watcher.settled, [r["event"] for r in watcher.log_lines.json()][-20:])
        subjects = {json.loads(r.value)["subject"] for r in kb.read_all(broker.address, topic + ".results", len(ids))}
        assert subjects == set(ids)
        assert kb.committed(broker.address, watcher.s.group_id, topic) == [len(ids)]
    finally:
        watcher.request_stop("test")


def test_a_watcher_stops_while_its_broker_is_frozen_mid_publish(freezable_broker, store):
    """Stopped twice (a hard stop) while the broker answers nothing and a result waits for its ack: the last
    commit and leaving the group each waited about 30 s for the broker (SIGTERM with a 2 s grace exited after
    70 s, found by a fault campaign). Both are bounded now: the watcher ends while the broker is still frozen."""
    import kafka_broker as kb
    broker = freezable_broker
    topic = new_topic(broker)
    kb.produce(broker.address, topic, [(None, cloudevent("st-%d" % i, data={"plan": PLAN})) for i in range(3)])
    runner = fake_runner()

    def run_plan(job):
        if job.event.id == "st-1":
            assert wait_for(lambda: watcher.log_lines.events("finished"), 30)  # st-0's result is out
            broker.freeze()
        return runner(job)
    watcher = start_watcher(broker, topic, run_plan, store, publish_timeout=1.0, shutdown_grace=1)
    try:
        assert wait_for(lambda: watcher.log_lines.events("publish_waiting"), 30)
        watcher.request_stop("test")
        watcher.request_stop("test")  # the second: stop now
        watcher.thread.join(25)  # 12 s measured; without the bounds, longer than 25 s
        assert not watcher.thread.is_alive()  # the broker is still frozen
        assert watcher.log_lines.events("stopped")
    finally:
        watcher.request_stop("test")


def test_a_watcher_told_to_create_its_topics_makes_them_and_runs(kafka_broker, store):
    """--create-topics through the watcher itself (its client options, not a test's): the input, results and
    dead-letter topics are made, and an event published afterwards runs and gets its result."""
    import kafka_broker as kb
    topic = "made-" + uuid.uuid4().hex[:8]
    watcher = start_watcher(kafka_broker, topic, fake_runner(), store, create_topics=True,
                            dead_letter_topic=topic + ".dlq", max_events=1)
    try:
        assert wait_for(lambda: watcher.log_lines.events("connected"), 60), watcher.log_lines.json()
        assert not watcher.log_lines.events("broker_unavailable")
        kb.produce(kafka_broker.address, topic, [(None, cloudevent("made-1", data={"plan": PLAN}))])
        watcher.thread.join(60)
        results = kb.read_all(kafka_broker.address, topic + ".results", 1)
        assert [json.loads(r.value)["subject"] for r in results] == ["made-1"]
        from kafka import KafkaAdminClient
        admin = KafkaAdminClient(bootstrap_servers=kafka_broker.address)
        try:
            assert {topic, topic + ".results", topic + ".dlq"} <= set(admin.list_topics())
        finally:
            admin.close()
    finally:
        watcher.request_stop("test")


def test_create_topics_makes_the_missing_ones(kafka_broker):
    from kafka import KafkaAdminClient
    name = "made-" + uuid.uuid4().hex[:8]
    opts = w.client_options(kafka_broker.address)
    w.create_topics(opts, [name, name + ".results", name])
    w.create_topics(opts, [name, name + ".dlq"])  # existing ones are left alone
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.address)
    try:
        assert {name, name + ".results", name + ".dlq"} <= set(admin.list_topics())
    finally:
        admin.close()


# ---- issue 22: no message stops a partition, results fit, lag tells the truth, claims, crash loops ----

class Gauges:
    """A metrics sink keeping what the watcher last reported (it calls it from its threads)."""

    def __init__(self):
        self.lag, self.stalled, self.in_flight, self.oldest, self.seen = {}, {}, 0, 0.0, []

    def watch_lag(self, topic, partition, lag):
        self.lag[partition] = lag
        self.seen.append((partition, lag))

    def watch_lag_clear(self, topic, partition):
        self.lag.pop(partition, None)
        self.stalled.pop(partition, None)

    def watch_commit_stalled(self, topic, partition, seconds):
        self.stalled[partition] = seconds

    def watch_in_flight(self, n):
        self.in_flight = n

    def watch_oldest_waiting(self, seconds):
        self.oldest = seconds

    def watch_event(self, outcome):
        pass

    def watch_run(self, seconds):
        pass


def test_poison_and_faults_cost_one_message_each_never_a_partition(kafka_broker, store):
    """Held-out style: hostile messages and failures of every stage among good events on two partitions. Each good
    event completes once, each event with an id gets exactly one result, every result fits under the producer's
    max_request_size, bad input is dead-lettered, and both partitions are committed to their end."""
    import kafka_broker as kb
    topic = new_topic(kafka_broker, partitions=2)
    good = ["g%d" % i for i in range(6)]
    ev = w.decode_message(topic, 1, 3, None, cloudevent("old-big", data={"plan": PLAN}))
    too_big = w.result_event(ev, {"status": "completed", "answer": "a" * 200000, "conversation_id": "C0"},
                             "xzatoma://h/g", answer_limit=1 << 20)  # stored whole by an older version
    store.record_event("old-big", "C0", "completed", result=json.dumps(too_big))
    store.record_event("bad-stored", "C1", "completed", result="{not json")  # a record nobody can read
    big_goal = {"goal": "Summarise " + "w" * 300000, "instructions": ["a"]}
    p0 = [(None, cloudevent("g0", data={"plan": PLAN})),
          (None, b"[" * 1500 + b"]" * 1500),                                   # no id: dead letter only
          (None,) + _binary(b"deep-bin", b"[" * 1500 + b"]" * 1500),
          (None, cloudevent("g1", data={"plan": PLAN})),
          (b"bomb", _alias_bomb()),
          (None, cloudevent("boom", data={"plan": PLAN})),                     # its run raises
          (None, cloudevent("g2", data={"plan": PLAN}))]
    p1 = [(None, cloudevent("g3", data={"plan": PLAN})),
          (None, cloudevent("big-goal", data={"plan": big_goal})),             # a result that must be cut to fit
          (None, cloudevent("garbage", data={"plan": PLAN})),                  # its run returns no outcome
          (None, cloudevent("old-big", data={"plan": PLAN})),                  # a stored result too big to publish
          (None, cloudevent("g4", data={"plan": PLAN})),
          (None, cloudevent("i" * 20000, data={"plan": PLAN})),                # an id over the limit
          (None, cloudevent("bad-stored", data={"plan": PLAN})),               # reading its record fails
          (None, cloudevent("g5", data={"plan": PLAN}))]
    kb.produce(kafka_broker.address, topic, [m[:2] + (m[2] if len(m) > 2 else [], 0) for m in p0] +
               [m[:2] + ([], 1) for m in p1])
    calls = []

    def run_plan(job):
        calls.append(job.event.id)
        if job.event.id == "boom":
            raise RuntimeError("the model's reply broke a parser")
        if job.event.id == "garbage":
            return "not an outcome"
        return {"status": "completed", "answer": "done " + job.event.id, "conversation_id": "conv-" + job.event.id}
    total = len(p0) + len(p1)
    watcher = start_watcher(kafka_broker, topic, run_plan, store, dead_letter_topic=topic + ".dlq",
                            max_events=total, max_request_size=65536, backoff_initial=0.05)
    watcher.thread.join(90)
    assert not watcher.thread.is_alive()

    assert sorted(calls) == sorted(good + ["boom", "big-goal", "garbage"])  # each ran once, nothing else ran
    records = kb.read_all(kafka_broker.address, topic + ".results", 14)
    assert all(len(r.value) <= 65536 for r in records)
    results = {}
    for r in records:
        doc = json.loads(r.value)
        results.setdefault(doc["subject"], []).append(doc)
    assert all(len(v) == 1 for v in results.values()), {k: len(v) for k, v in results.items()}
    status = {k: v[0]["data"]["status"] for k, v in results.items()}
    long_id = w._cut_id("i" * 20000)
    assert status == dict({g: "completed" for g in good}, **{
        "deep-bin": "rejected", "bomb": "rejected", "boom": "failed", "big-goal": "completed", "garbage": "failed",
        "old-big": "failed", "bad-stored": "failed", long_id: "rejected"})
    assert results["big-goal"][0]["data"]["truncated"]["goal"] == 300010
    assert "could not be published" in results["old-big"][0]["data"]["error"]
    assert "MessageSizeTooLarge" in results["old-big"][0]["data"]["error"]
    assert "the watcher failed while handling this event" in results["bad-stored"][0]["data"]["error"]
    assert "not an outcome" in results["garbage"][0]["data"]["error"]
    dead = kb.read_all(kafka_broker.address, topic + ".dlq", 6)
    origins = sorted(dict(d.headers)["xzatoma_origin"].decode() for d in dead)
    assert origins == sorted("%s:%d:%d" % (topic, p, o) for p, o in [(0, 1), (0, 2), (0, 4), (1, 3), (1, 5),
                                                                      (1, 6)])
    assert kb.committed(kafka_broker.address, watcher.s.group_id, topic, 2) == [len(p0), len(p1)]
    assert store.event_record("old-big")["status"] == "failed" and store.event_record("old-big")["published_at"]
    assert store.conn().execute("SELECT count(*) FROM event_claims").fetchone()[0] == 0  # none left behind


def test_at_the_smallest_max_request_size_every_event_gets_one_result_that_fits(kafka_broker):
    """Issue 22 (attack round), against the broker at watcher.kafka.max_request_size 16384 (its minimum): a bad plan
    whose type is 4096 control characters got no result at all and was committed; a completed run whose 100 steps
    were control characters was reported failed ("a result event cannot fit"); and a dead-letter copy whose
    header names were 4-byte characters (counted as one byte each) was over the limit and lost."""
    import kafka_broker as kb
    topic = new_topic(kafka_broker)
    names = [("%03d" % i) + "𝄞" * 24 for i in range(100)]  # 100 headers of 99 bytes, counted as 27
    kb.produce(kafka_broker.address, topic, [
        (None, cloudevent("bad-type", type="\x01" * 4096, data={"plan": {"goal": "no instructions"}}), []),
        (None, cloudevent("steps", data={"plan": PLAN}), []),
        (b"dl-1", b"goal: " + b"x" * 10000 + b"\n", [(n, b"") for n in names]),  # no instructions: rejected
        (b"big", b"goal: " + b"y" * 40000 + b"\n", [])])  # over max_message_bytes: rejected unread

    def run_plan(job):
        return {"status": "completed", "answer": "done", "conversation_id": "conv-steps",
                "steps": [{"text": "\x01" * 256, "status": "done"}] * 100}
    watcher = start_watcher(kafka_broker, topic, run_plan, dead_letter_topic=topic + ".dlq", max_events=4,
                            max_request_size=16384, max_message_bytes=32768)
    watcher.thread.join(60)
    assert not watcher.thread.is_alive()
    records = kb.read_all(kafka_broker.address, topic + ".results", 4, timeout=10)
    assert all(len(r.value) + len(r.key) <= 16384 - w.RECORD_OVERHEAD for r in records)
    results = {}
    for r in records:
        doc = json.loads(r.value)
        results.setdefault(doc["subject"], []).append(doc["data"])
    assert {k: [d["status"] for d in v] for k, v in results.items()} == \
        {"bad-type": ["rejected"], "steps": ["completed"], "dl-1": ["rejected"], "big": ["rejected"]}
    assert results["bad-type"][0]["truncated"]["trigger_type"] == 4096
    assert results["steps"][0]["answer"] == "done" and results["steps"][0]["truncated"]["steps"] == 100
    dead = {dict(d.headers)["xzatoma_origin"].decode(): d for d in kb.read_all(kafka_broker.address,
                                                                              topic + ".dlq", 3, timeout=10)}
    assert sorted(dead) == ["%s:0:0" % topic, "%s:0:2" % topic, "%s:0:3" % topic]
    copy = dead["%s:0:2" % topic]
    assert copy.value == b"goal: " + b"x" * 10000 + b"\n" and dict(copy.headers)["xzatoma_headers_dropped"] == b"100"
    copy = dead["%s:0:3" % topic]  # cut to fit, and says from what
    assert copy.value.startswith(b"goal: yyy") and len(copy.value) + len(copy.key) < 16384 - w.RECORD_OVERHEAD
    assert dict(copy.headers)["xzatoma_truncated"] == b"40007"
    assert kb.committed(kafka_broker.address, watcher.s.group_id, topic) == [4]


def test_a_group_offset_past_the_log_s_end_is_read_from_the_start_and_set_right(kafka_broker, store):
    """A group's committed offset past its partition's end (set by hand, or kept while the log was lost): Tansu
    answers each fetch with nothing, and the watcher sat with every gauge at 0 while events waited; after a
    restart they were skipped for good (attack round 17a). It reads the partition from its start, the store
    answering once what was answered before, and commits where it is."""
    import kafka_broker as kb
    topic, group = new_topic(kafka_broker), "g-" + uuid.uuid4().hex[:8]
    kb.produce(kafka_broker.address, topic, [(None, cloudevent("far-%d" % i, data={"plan": PLAN})) for i in range(2)])
    store.record_event("far-0", "C0", "completed")
    store.event_published("far-0")  # answered before
    kb.commit(kafka_broker.address, group, topic, {0: 100})
    runner = fake_runner()
    watcher = start_watcher(kafka_broker, topic, runner, store, group_id=group, max_events=2)
    watcher.thread.join(60)
    assert not watcher.thread.is_alive()
    assert [j.event.id for j in runner.calls] == ["far-1"]  # far-0 was answered before: a duplicate
    assert kb.committed(kafka_broker.address, group, topic) == [2]
    (out,) = watcher.log_lines.events("offset_out_of_range")
    assert (out["offset"], out["start"], out["end"]) == (100, 0, 2), out


def test_a_topic_made_anew_under_a_running_watcher_is_read_again_from_its_start(kafka_broker, store):
    """The input topic deleted and made anew while a watcher runs: its position and committed offset (2) are
    past the new log's end, and Tansu answers each fetch there with nothing: 3 new events waited unanswered,
    every gauge at 0 (attack round 17a). The end is checked every lag interval, metrics or not."""
    import kafka_broker as kb
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [(None, cloudevent("old-%d" % i, data={"plan": PLAN})) for i in range(2)])
    runner = fake_runner()
    watcher = start_watcher(kafka_broker, topic, runner, store, lag_interval=0.2)
    try:
        assert wait_for(lambda: kb.committed(kafka_broker.address, watcher.s.group_id, topic) == [2], 60)
        kb.make_topic_anew(kafka_broker.address, topic)
        kb.produce(kafka_broker.address, topic, [(None, cloudevent("new-0", data={"plan": PLAN}))])
        assert wait_for(lambda: len(runner.calls) == 3, 60), watcher.log_lines.events("offset_out_of_range")
        assert wait_for(lambda: kb.committed(kafka_broker.address, watcher.s.group_id, topic) == [1], 30)
    finally:
        watcher.request_stop("test")
        watcher.thread.join(30)
    assert [j.event.id for j in runner.calls] == ["old-0", "old-1", "new-0"]
    assert watcher.log_lines.events("offset_out_of_range")[0]["end"] < 2


def test_a_topic_made_anew_under_a_partition_paused_behind_a_run_is_found_while_it_waits(kafka_broker, store):
    """Round 17d: a partition paused behind its runs is not fetched, so its high watermark stayed the old log's
    and hid the new log's end until the backlog drained; by then the new log reached past the old offset and its
    first events were skipped. The new end is found while the run still holds the partition."""
    import kafka_broker as kb
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [(None, cloudevent("held-%d" % i, data={"plan": PLAN})) for i in range(2)])
    gate, runner, run_plan = gated_runner()
    watcher = start_watcher(kafka_broker, topic, run_plan, store, lag_interval=0.2)
    try:
        assert wait_for(lambda: len(watcher.in_flight) == 1 and len(watcher.backlog) == 1, 60)
        kb.make_topic_anew(kafka_broker.address, topic)
        kb.produce(kafka_broker.address, topic, [(None, cloudevent("fresh-0", data={"plan": PLAN}))])
        assert wait_for(lambda: watcher.log_lines.events("offset_out_of_range"), 30)  # the run still holds it
        assert runner.calls == []  # the first run still waits at its gate
        gate.set()
        assert wait_for(lambda: len(runner.calls) == 3, 60)
    finally:
        gate.set()
        watcher.request_stop("test")
        watcher.thread.join(30)
    assert [j.event.id for j in runner.calls] == ["held-0", "held-1", "fresh-0"]


def test_lag_counts_what_waits_and_a_stuck_publish_shows_then_recovers(kafka_broker, store):
    """Issue 22: the lag gauge read 0 while 32 of 40 events waited, and a result that could never be published
    stopped the partition with no alert. Lag is now end offset minus committed offset; while the output topic
    refuses every result, lag stays and the oldest waiting age grows (the README's alert); when it takes them
    again, the stored results are published, nothing is run twice, and lag drains to 0."""
    import kafka_broker as kb
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [(None, cloudevent("lag-%d" % i, data={"plan": PLAN}))
                                             for i in range(5)])
    gate, runner, run_plan = gated_runner()
    gauges = Gauges()
    watcher = start_watcher(kafka_broker, topic, run_plan, store, lag_interval=0.05, backoff_initial=0.05,
                            backoff_max=0.3, output_topic="no such topic!")
    watcher.metrics = gauges
    try:
        assert wait_for(lambda: gauges.lag.get(0) == 5 and gauges.in_flight == 1, 60), (gauges.lag, gauges.in_flight)
        gate.set()  # the runs finish; no result can be published
        assert wait_for(lambda: len(runner.calls) == 5, 30)
        assert wait_for(lambda: gauges.oldest > 1.0 and gauges.stalled[0] > 1.0, 30)  # what the alert watches
        assert gauges.lag[0] == 5 and kb.committed(kafka_broker.address, watcher.s.group_id, topic)[0] in (None, 0)
        watcher.s.output_topic = topic + ".results"  # the topic takes results again
        assert wait_for(lambda: gauges.lag.get(0) == 0, 60), gauges.lag
        assert gauges.oldest == 0.0 and gauges.stalled[0] == 0.0
    finally:
        watcher.request_stop("test")
        watcher.thread.join(30)
    assert sorted(j.event.id for j in runner.calls) == ["lag-%d" % i for i in range(5)]  # none ran twice
    subjects = [json.loads(r.value)["subject"] for r in kb.read_all(kafka_broker.address, topic + ".results", 5)]
    assert sorted(subjects) == ["lag-%d" % i for i in range(5)]
    assert all(json.loads(r.value)["type"] == "xzatoma.plan.completed"
               for r in kb.read_all(kafka_broker.address, topic + ".results", 5))


def test_lag_counts_events_that_arrived_batched_behind_a_paused_partition(kafka_broker, store):
    """Found by an attack round: 40 events produced in one record batch while the partition was paused behind a
    running event read as lag 2, not 41. A paused partition is not fetched, so its high watermark is stale, and
    the broker's ListOffsets answer fell short (Tansu 0.6 answers the last batch's first offset + 1). A paused
    partition's end now comes from a fetch of its last known record, whose response carries the true high
    watermark."""
    import kafka_broker as kb
    from kafka import KafkaProducer
    topic = new_topic(kafka_broker)
    gate, runner, run_plan = gated_runner()
    gauges = Gauges()
    watcher = start_watcher(kafka_broker, topic, run_plan, store, lag_interval=0.05)
    watcher.metrics = gauges
    try:
        assert wait_for(lambda: watcher.log_lines.events("positioned"), 60)
        kb.produce(kafka_broker.address, topic, [(None, cloudevent("first", data={"plan": PLAN}))])
        assert wait_for(lambda: gauges.in_flight == 1, 30)
        producer = KafkaProducer(bootstrap_servers=kafka_broker.address, linger_ms=300, batch_size=1 << 20)
        sent = [producer.send(topic, cloudevent("batched-%d" % i, data={"plan": PLAN})) for i in range(40)]
        producer.flush()
        assert [f.get(10).offset for f in sent] == list(range(1, 41))
        producer.close()
        assert wait_for(lambda: gauges.lag.get(0) == 41, 30), gauges.lag
        assert gauges.in_flight == 1 and len(runner.calls) == 0  # still paused behind the first
        gate.set()
        assert wait_for(lambda: gauges.lag.get(0) == 0, 60), gauges.lag
    finally:
        gate.set()
        watcher.request_stop("test")
        watcher.thread.join(30)
    assert len(runner.calls) == 41


def test_a_partition_waiting_its_turn_behind_busy_runs_is_not_stalled(kafka_broker, store):
    """Found by an attack round: one event on partition 1 queued behind ten runs of partition 0 read as stalled
    for all ten, so the README's alert ("not for a backlog that drains, however large") would fire on a healthy
    watcher. Work that merely waits for a run slot is stalled only since a run last gave its slot back."""
    from kafka import KafkaProducer
    topic = new_topic(kafka_broker, partitions=2)
    release = threading.Semaphore(0)
    runner = fake_runner()

    def run_plan(job):
        release.acquire(timeout=60)
        return runner(job)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.address)
    for i in range(3):  # there before the watcher starts: read in one fetch, so they run first, in order
        producer.send(topic, cloudevent("p0-%d" % i, data={"plan": PLAN}), partition=0).get(10)
    gauges = Gauges()
    watcher = start_watcher(kafka_broker, topic, run_plan, store, lag_interval=0.05)
    watcher.metrics = gauges
    try:
        assert wait_for(lambda: watcher.received == 3 and gauges.in_flight == 1, 60)
        producer.send(topic, cloudevent("p1", data={"plan": PLAN}), partition=1).get(10)
        waiting_since = time.monotonic()
        assert wait_for(lambda: gauges.lag.get(1) == 1, 30), gauges.lag
        for i in range(3):  # each of partition 0's runs holds its slot 2 s; partition 1 waits behind all three,
            assert wait_for(lambda: gauges.stalled.get(0, 0) > 2.0, 30)  # yet is stalled no longer than the one
            assert gauges.lag[1] == 1 and gauges.stalled[1] < gauges.stalled[0] + 0.5, (i, gauges.stalled)  # now
            release.release()
            assert wait_for(lambda: len(runner.calls) == i + 1 and gauges.stalled.get(0, 9) < 1.0, 30)
        assert runner.calls[-1].event.id == "p0-2" and time.monotonic() - waiting_since > 6.0
        release.release()
        assert wait_for(lambda: gauges.lag.get(0) == 0 and gauges.lag.get(1) == 0, 60), gauges.lag
        assert gauges.stalled == {0: 0.0, 1: 0.0}
    finally:
        for _ in range(4):
            release.release()
        producer.close()
        watcher.request_stop("test")
        watcher.thread.join(30)
    assert [job.event.id for job in runner.calls] == ["p0-0", "p0-1", "p0-2", "p1"]


def test_a_stall_is_told_while_the_broker_is_away_and_outlives_a_rebalance():
    """Found by an attack round: with the broker frozen, commit_stalled kept its last value for as long as the
    broker was away (set only once the end offsets came back), and a rebalance reset it though the partition had
    not moved (a member joining every few minutes kept the alert from ever firing)."""
    from kafka import TopicPartition
    tp = TopicPartition("t", 0)

    class Away:
        def assignment(self):
            return {tp}

        def end_offsets(self, tps):
            raise ConnectionError("the broker is away")
        beginning_offsets = end_offsets
    watcher = w.Watcher(w.Settings(brokers="127.0.0.1:1", topic="t"), w.Filters(), lambda job: None)
    watcher.consumer, watcher.metrics = Away(), Gauges()
    watcher.tracker.assign([tp])
    watcher.tracker.committed({tp: 7})
    po = watcher.tracker.get(tp)
    po.received(7)  # running, or waiting to publish: the commit cannot move
    po.advanced_at -= 100
    watcher._report_lag()
    assert watcher.metrics.stalled[0] >= 100 and 0 not in watcher.metrics.lag
    # given up and assigned again, still at 7: the stall goes on; at 8 (it moved meanwhile), it starts again
    tracker = watcher.tracker
    tracker.forget([tp])
    tracker.assign([tp])
    tracker.forget([tp])  # given up again before it was positioned (the broker away): remembered all the same
    tracker.assign([tp])
    tracker.committed({tp: 7})
    assert tracker.stalled()[tp] >= 100
    tracker.forget([tp])
    tracker.assign([tp])
    tracker.committed({tp: 8})
    assert tracker.stalled()[tp] < 5
    # given up idle (its commit unmoved for long, nothing waiting) and given back at the same offset, the run it
    # starts at once does not inherit the idle time as a stall (found by the next round)
    tracker.get(tp).advanced_at -= 100
    tracker.waiting_turn({tp: time.monotonic()})  # each lag report: nothing waits, so nothing is stuck
    tracker.forget([tp])
    tracker.assign([tp])
    tracker.committed({tp: 8})
    tracker.get(tp).received(8)
    assert tracker.stalled()[tp] < 5
    # assigned after the last report and given up before the next, idle: it starts afresh too (round 11)
    other = TopicPartition("t", 1)
    tracker.waiting_turn({})
    tracker.assign([other])
    tracker.committed({other: 3})
    tracker.get(other).advanced_at -= 3600
    tracker.forget([other])
    tracker.assign([other])
    tracker.committed({other: 3})
    tracker.get(other).received(3)
    assert tracker.stalled()[other] < 5
    # drained while the broker is still away: 0, not the last value for the whole outage (round 11)
    watcher.tracker.get(other).settled(3)
    watcher.tracker.committed({other: 4})
    watcher.metrics.stalled[1] = 400.0
    watcher.consumer.assignment = lambda: {other}
    watcher._report_lag()
    assert watcher.metrics.stalled[1] == 0.0


def test_lag_is_reported_only_for_partitions_served_and_never_after_their_series_is_dropped():
    """Found by an attack round, end to end: during a rebalance the client still lists the partitions being given
    up; their state was gone, so their lag read as the whole partition (from its beginning), and a report begun
    before the series was dropped set it again after, where it stayed while another member served it."""
    from kafka import TopicPartition
    kept, given = TopicPartition("t", 0), TopicPartition("t", 1)

    class Consumer:
        def assignment(self):
            return {kept, given}  # as kafka-python answers mid-rebalance

        def end_offsets(self, tps):
            return {tp: 5 for tp in tps}

        def beginning_offsets(self, tps):
            return {tp: 0 for tp in tps}

        def highwater(self, tp):
            return None

        def paused(self):
            return set()
    watcher = w.Watcher(w.Settings(brokers="127.0.0.1:1", topic="t"), w.Filters(), lambda job: None)
    import types
    watcher.consumer, watcher.metrics = Consumer(), Gauges()
    watcher.end_probe = types.SimpleNamespace(ends=lambda found: {})  # nothing is paused here
    watcher.tracker.assign([kept, given])
    watcher.tracker.committed({kept: 5, given: 5})
    watcher._report_lag()
    assert watcher.metrics.lag == {0: 0, 1: 0}
    watcher.revoking.add(given)  # _revoke: given up from here on
    watcher._revoked_committed({given}, {})
    assert watcher.metrics.lag == {0: 0}
    watcher._report_lag()  # the client still lists it: nothing is reported for it, from its beginning or at all
    assert watcher.metrics.lag == {0: 0} and 1 not in watcher.metrics.stalled


def test_a_partition_behind_a_held_claim_or_a_run_that_never_ends_is_stalled(kafka_broker, store):
    """Found by an attack round: the oldest event of a partition, waiting for a claim another live process holds,
    or for a slot that a run which never ends keeps, was taken for one merely waiting its turn: commit_stalled
    read 0 while the partition never moved again, and the alert could never fire."""
    import kafka_broker as kb
    from xzatoma_store import _process_space, _process_start
    topic = new_topic(kafka_broker)
    store.conn().execute("INSERT INTO event_claims (event_id, owner, host, pid, claimed_at, expires_at, attempts, "
                         "started) VALUES ('x', 'a frozen watcher', ?, ?, ?, 0, 1, ?)",
                         (_process_space(), os.getpid(), time.time(), _process_start(os.getpid())))
    gate, runner, run_plan = gated_runner()
    gauges = Gauges()
    watcher = start_watcher(kafka_broker, topic, run_plan, store, lag_interval=0.05)
    watcher.metrics = gauges
    try:
        kb.produce(kafka_broker.address, topic, [(None, cloudevent(i, data={"plan": PLAN})) for i in ("x", "y")])
        assert wait_for(lambda: gauges.in_flight == 1 and gauges.lag.get(0) == 2, 60)  # y runs; x is held
        assert wait_for(lambda: gauges.stalled.get(0, 0) > 2.0, 30), gauges.stalled
        store.conn().execute("DELETE FROM event_claims WHERE event_id = 'x'")  # the frozen one is gone: x waits
        before = gauges.stalled[0]  # for the slot y's run keeps, which it never gives back
        assert wait_for(lambda: gauges.stalled[0] > before + 1.0, 30), gauges.stalled
        gate.set()
        assert wait_for(lambda: gauges.lag.get(0) == 0, 60) and gauges.stalled[0] == 0.0
    finally:
        gate.set()
        watcher.request_stop("test")
        watcher.thread.join(30)
    assert sorted(job.event.id for job in runner.calls) == ["x", "y"]


def test_a_copy_waits_on_its_id_s_run_and_a_refusal_is_asked_again(kafka_broker, store):
    """Found by an attack round, in the stall clock. A copy of an id whose run never ends read about 0 while other
    partitions' runs kept ending (it waits for that run, not for a slot); and an event refused its claim once read
    as stalled for a whole drain after the claim's holder was gone (the refusal was remembered, not asked again)."""
    from kafka import KafkaProducer
    from xzatoma_store import _process_space, _process_start
    topic = new_topic(kafka_broker, partitions=3)
    store.conn().execute("INSERT INTO event_claims (event_id, owner, host, pid, claimed_at, expires_at, attempts, "
                         "started) VALUES ('held', 'a frozen watcher', ?, ?, ?, 0, 1, ?)",
                         (_process_space(), os.getpid(), time.time(), _process_start(os.getpid())))
    hung, release = threading.Event(), threading.Semaphore(0)
    runner = fake_runner()

    def run_plan(job):
        (hung.wait if job.event.id == "X" else release.acquire)(timeout=60)
        return runner(job)
    gauges = Gauges()
    watcher = start_watcher(kafka_broker, topic, run_plan, store, lag_interval=0.05, max_concurrent=2)
    watcher.metrics = gauges
    producer = KafkaProducer(bootstrap_servers=kafka_broker.address)
    try:
        assert wait_for(lambda: len(watcher.log_lines.events("positioned")) == 3, 60)
        producer.send(topic, cloudevent("X", data={"plan": PLAN}), partition=1).get(10)
        assert wait_for(lambda: gauges.in_flight == 1, 30)
        producer.send(topic, cloudevent("X", data={"plan": PLAN}), partition=0).get(10)  # a copy: waits on X
        copy_since = time.monotonic()
        producer.send(topic, cloudevent("held", data={"plan": PLAN}), partition=2).get(10)
        for i in range(12):
            producer.send(topic, cloudevent("drain-%d" % i, data={"plan": PLAN}), partition=2).get(10)
        assert wait_for(lambda: watcher.log_lines.events("claimed_elsewhere"), 30)
        assert wait_for(lambda: gauges.stalled.get(2, 0) > 1.0, 30)  # 'held' is refused: partition 2 is stuck
        store.conn().execute("DELETE FROM event_claims WHERE event_id = 'held'")  # its holder is gone
        for i in range(6):  # partition 2 drains, a run at a time: under one run's time (the refusal is asked
            release.release()  # again, and no one holds the claim now)
            assert wait_for(lambda: len(runner.calls) == i + 1, 30)
            assert wait_for(lambda: gauges.stalled.get(2, 9) < 1.0, 10), (i, gauges.stalled)
            assert gauges.stalled[0] > time.monotonic() - copy_since - 1.0, (i, gauges.stalled)  # see below
        # the copy on partition 0 waits on X's run, which never ends: its stall grows whatever else ends meanwhile
        assert wait_for(lambda: gauges.stalled[0] > time.monotonic() - copy_since - 1.0 > 1.0, 30), gauges.stalled
        assert gauges.lag[0] == 1 and gauges.lag[1] == 1
    finally:
        hung.set()
        for _ in range(20):
            release.release()
        producer.close()
        watcher.request_stop("test")
        watcher.thread.join(30)


def test_a_rebalance_waits_for_a_run_longer_than_the_session_timeout_and_it_runs_once(kafka_broker, tmp_path):
    """kafka-python 3 calls the rebalance listener on its IO loop, which sends the heartbeats too: waiting there
    for a run as one call stopped them, the member was evicted mid-run, and the next one ran its event again (two
    results; attack round 12). Watchers with stores of their own (two machines): only the group keeps them apart."""
    import kafka_broker as kb
    from xzatoma_store import Store
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [(b"long-1", b"goal: Take a while\ninstructions: [wait]\n")])
    started, group = threading.Event(), "g-" + uuid.uuid4().hex[:8]
    opts = dict(FAST_GROUP, max_poll_interval_ms=30000)  # the session: 6 s; the run: 9 s
    slow = fake_runner(delay=9)

    def run_slowly(job):
        started.set()
        return slow(job)
    stores = [Store(str(tmp_path / name)).open() for name in ("a.db", "b.db")]
    first = start_watcher(kafka_broker, topic, run_slowly, stores[0], group_id=group, consumer_options=opts,
                          shutdown_grace=20)
    assert started.wait(60)
    other = fake_runner()
    second = start_watcher(kafka_broker, topic, other, stores[1], group_id=group, consumer_options=opts)
    try:
        deadline = time.monotonic() + 60
        while kb.committed(kafka_broker.address, group, topic) != [1] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert kb.committed(kafka_broker.address, group, topic) == [1]
        assert [j.event.id for j in slow.calls] == ["long-1"] and other.calls == []
        assert not first.log_lines.events("commit_failed") and not first.log_lines.events("lost")
    finally:
        for watcher in (first, second):
            watcher.request_stop("test")
        for watcher in (first, second):
            watcher.thread.join(60)
        for s in stores:
            s.close()
    results = kb.read_all(kafka_broker.address, topic + ".results", 1)
    assert [r.key for r in results] == [b"long-1"]


def test_a_rebalance_while_stopping_starts_no_grace_period_of_its_own(kafka_broker):
    """SIGTERM, then a member joins late in the grace period: the revoke had a fresh grace period of its own, and
    the run went on past the stop's (attack round 12). The join is placed 4 s into a 6 s grace on purpose: the
    fault is when it comes."""
    import kafka_broker as kb
    from kafka import KafkaConsumer
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [(b"long-2", b"goal: Take a while\ninstructions: [wait]\n")])
    started, cancelled_at = threading.Event(), []

    def run_plan(job):
        started.set()
        if job.cancel.wait(60):
            cancelled_at.append(time.monotonic())
        return {"status": "interrupted"}
    group = "g-" + uuid.uuid4().hex[:8]
    watcher = start_watcher(kafka_broker, topic, run_plan, group_id=group, shutdown_grace=6,
                            consumer_options=dict(FAST_GROUP, max_poll_interval_ms=30000))
    assert started.wait(60)
    stopped_at = time.monotonic()
    watcher.request_stop("SIGTERM")
    time.sleep(4)
    other = KafkaConsumer(bootstrap_servers=kafka_broker.address, group_id=group, enable_auto_commit=False,
                          **FAST_GROUP)
    other.subscribe([topic])
    done = threading.Event()

    def member():
        while not done.is_set():
            other.poll(timeout_ms=200)
    polling = threading.Thread(target=member, daemon=True)
    polling.start()
    try:
        watcher.thread.join(60)
        assert not watcher.thread.is_alive() and cancelled_at
        assert cancelled_at[0] - stopped_at < 6 + 1.5  # the stop's grace period, not one begun at the join
    finally:
        done.set()
        polling.join(5)
        other.close(autocommit=False)


def _locked_store_watcher(kafka_broker, tmp_path, partitions, busy_timeout=30.0, **settings):
    """A watcher whose store another process holds locked (BEGIN EXCLUSIVE, as a backup does): (watcher, gauges,
    the locking connection, topic)."""
    import sqlite3
    from xzatoma_store import Store
    path = str(tmp_path / "conversations.db")
    store = Store(path).open()
    store.busy_timeout = busy_timeout
    topic = new_topic(kafka_broker, partitions=partitions)
    s = w.Settings(brokers=kafka_broker.address, topic=topic, group_id="g-" + uuid.uuid4().hex[:8],
                   consumer_options=FAST_GROUP, lag_interval=0.3, **settings)
    log = Lines()
    watcher = w.Watcher(s, w.Filters(), fake_runner(), store=store, log=w.WatchLog(log, "json"), metrics=Gauges())
    watcher.log_lines = log
    watcher.thread = threading.Thread(target=watcher.run, daemon=True)
    watcher.thread.start()
    assert wait_for(lambda: any(e.get("partitions") for e in log.events("assigned")), 60)
    locker = sqlite3.connect(path, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    return watcher, locker, topic


def test_a_store_locked_by_another_process_holds_neither_the_lag_report_nor_a_stop(kafka_broker, tmp_path):
    """The consumer loop's own store calls (marks, a lag report's look-up) waited out the 30 s busy timeout each:
    with a backup holding the lock, every gauge read 0 for minutes, and SIGTERM took three (attack round 12)."""
    import kafka_broker as kb
    watcher, locker, topic = _locked_store_watcher(kafka_broker, tmp_path, 1, shutdown_grace=2)
    try:
        kb.produce(kafka_broker.address, topic, [(b"locked-1", b"goal: G\ninstructions: [a]\n")])
        assert wait_for(lambda: watcher.metrics.stalled.get(0, 0) >= 3 and watcher.metrics.lag.get(0) == 1, 20), \
            (watcher.metrics.stalled, watcher.metrics.lag)
        asked = time.monotonic()
        watcher.request_stop("SIGTERM")
        watcher.thread.join(30)
        took = time.monotonic() - asked
        assert not watcher.thread.is_alive() and took < 2 + 8, took  # the grace, 5 s for stuck runs, closing
        assert kb.committed(kafka_broker.address, watcher.s.group_id, topic) != [1]  # read again after a restart
    finally:
        locker.execute("ROLLBACK")
        locker.close()


def test_a_store_locked_by_another_process_stalls_every_partition_it_holds(kafka_broker, tmp_path):
    """A claim the locked store refused gave its run slot back, and that restarted the other partitions' stall as
    if they merely waited their turn: commit_stalled saw-toothed under 60 s for a lock of hours (attack round 12)."""
    import kafka_broker as kb
    watcher, locker, topic = _locked_store_watcher(kafka_broker, tmp_path, 2, busy_timeout=0.5)
    try:
        kb.produce(kafka_broker.address, topic, [(b"p0", b"goal: G\ninstructions: [a]\n", [], 0),
                                                 (b"p1", b"goal: G\ninstructions: [a]\n", [], 1)])
        assert wait_for(lambda: len(watcher.log_lines.events("store_failed")) >= 4, 30)
        assert wait_for(lambda: min(watcher.metrics.stalled.get(p, 0) for p in (0, 1)) >= 4, 20), \
            watcher.metrics.stalled
        locker.execute("ROLLBACK")
        assert wait_for(lambda: len(watcher.log_lines.events("finished")) == 2, 30)  # the store back: both run
    finally:
        locker.close()
        watcher.request_stop("test")
        watcher.thread.join(30)
    assert sorted(r.key for r in kb.read_all(kafka_broker.address, topic + ".results", 2)) == [b"p0", b"p1"]


def test_a_run_whose_claim_cannot_be_renewed_stops_before_its_lease_ends_and_runs_again(kafka_broker, tmp_path):
    """A store locked past the claim lease: the holder could not renew, and a watcher in another pid namespace
    (which judges the lease by the clock alone) took the claim over while the holder's run went on: one id ran
    twice at once (attack round 12). Claims unrenewed for half their lease now stop their runs, tried again."""
    import sqlite3
    import kafka_broker as kb
    from xzatoma_store import Store
    path = str(tmp_path / "conversations.db")
    store = Store(path).open()
    topic = new_topic(kafka_broker)
    calls = []

    def run_plan(job):  # the first run waits to be stopped; the second ends at once
        calls.append(job.event.id)
        if len(calls) == 1:
            job.cancel.wait(60)
            return {"status": "interrupted", "error": "interrupted"}
        return {"status": "completed", "answer": "done", "conversation_id": "c"}
    watcher = start_watcher(kafka_broker, topic, run_plan, store, claim_lease=2)
    kb.produce(kafka_broker.address, topic, [(b"lapse-1", b"goal: G\ninstructions: [a]\n")])
    locker = sqlite3.connect(path, isolation_level=None)
    try:
        assert wait_for(lambda: calls, 60)
        watcher.chores.append(("another-id", store.release_claim))  # a store write due: waited out first, it held
        locker.execute("BEGIN EXCLUSIVE")  # a backup, say                 # the lapse back past the lease itself
        assert wait_for(lambda: watcher.log_lines.events("claims_lapsing"), 10)
        locker.execute("ROLLBACK")
        assert wait_for(lambda: watcher.log_lines.events("finished"), 30)
        assert calls == ["lapse-1", "lapse-1"] and len(watcher.log_lines.events("interrupted")) == 1
    finally:
        locker.close()
        watcher.request_stop("test")
        watcher.thread.join(30)
        store.close()
    assert [r.key for r in kb.read_all(kafka_broker.address, topic + ".results", 1)] == [b"lapse-1"]


def test_two_watchers_sharing_a_store_never_run_one_id_at_once(kafka_broker, store):
    """Issue 22: two processes on one store ran an id twice when it arrived twice at once. Two watchers (two
    consumer groups: both get every message) share one store: the id runs once, the other watcher waits for the
    claim and then finds it done."""
    import kafka_broker as kb
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [(None, cloudevent("same", data={"plan": PLAN}))])
    watchers, calls, running = [], [], []

    def run_plan(job):
        running.append(job.event.id)
        calls.append(job.event.id)
        # hold the claim until the other watcher has found it held (no fixed wait: the event itself)
        wait_for(lambda: any(x.log_lines.events("claimed_elsewhere") for x in watchers), 30)
        running.remove(job.event.id)
        return {"status": "completed", "answer": "once", "conversation_id": "c-once"}
    for _ in range(2):
        watchers.append(start_watcher(kafka_broker, topic, run_plan, store, max_events=1))
    for x in watchers:
        x.thread.join(60)
        assert not x.thread.is_alive()
    assert calls == ["same"]
    assert sorted(len(x.log_lines.events("duplicate")) for x in watchers) == [0, 1]
    assert sum(len(x.log_lines.events("claimed_elsewhere")) for x in watchers) == 1
    assert [json.loads(r.value)["subject"] for r in kb.read_all(kafka_broker.address, topic + ".results", 1)] == \
        ["same"]
    for x in watchers:
        assert kb.committed(kafka_broker.address, x.s.group_id, topic) == [1]


def test_a_rejected_event_is_answered_like_a_run_once_per_store(kafka_broker, store):
    """A rejected event's result was tried three times and dropped while the output topic refused results (a
    run's waits, and goes out when it takes them again), and it was answered again on every read: by a second
    consumer group on the same store, after a kill -9 (found by an attack round). It is now claimed, recorded
    and published as a run's result is."""
    import kafka_broker as kb
    topic = new_topic(kafka_broker)
    bad = cloudevent("bad-1", data={"plan": {"goal": "no instructions"}})
    kb.produce(kafka_broker.address, topic, [(None, bad), (None, cloudevent("good-1", data={"plan": PLAN}))])
    runner = fake_runner()
    first = start_watcher(kafka_broker, topic, runner, store, backoff_initial=0.05, backoff_max=0.3, max_events=2,
                          output_topic="no such topic!", dead_letter_topic=topic + ".dlq")
    try:
        assert wait_for(lambda: [j.event.id for j in runner.calls] == ["good-1"], 60)
        assert wait_for(lambda: len(first.log_lines.events("publish_failed")) >= 2, 60)  # both results held
        assert kb.committed(kafka_broker.address, first.s.group_id, topic)[0] in (None, 0)
        first.s.output_topic = topic + ".results"  # the topic takes results again
        first.thread.join(60)
        assert not first.thread.is_alive()
    finally:
        first.request_stop("test")
    assert kb.committed(kafka_broker.address, first.s.group_id, topic) == [2]
    second = start_watcher(kafka_broker, topic, runner, store, max_events=2, dead_letter_topic=topic + ".dlq")
    second.thread.join(60)
    assert not second.thread.is_alive()
    assert len(second.log_lines.events("duplicate")) == 2 and len(runner.calls) == 1
    results = {json.loads(r.value)["subject"]: json.loads(r.value)["data"]["status"]
               for r in kb.read_all(kafka_broker.address, topic + ".results", 2)}
    assert results == {"bad-1": "rejected", "good-1": "completed"}
    assert len(kb.read_all(kafka_broker.address, topic + ".results", 2)) == 2  # one each, none twice
    assert len(kb.read_all(kafka_broker.address, topic + ".dlq", 1)) == 1  # copied once, not per try
    # a valid event sent again under the answered id is a duplicate: one id, one result (consumers deduplicate
    # on subject; a second answer would be dropped, or replace the first)
    kb.produce(kafka_broker.address, topic, [(None, cloudevent("bad-1", data={"plan": PLAN}))])
    third = start_watcher(kafka_broker, topic, runner, store, max_events=1, group_id=first.s.group_id)
    third.thread.join(60)
    assert not third.thread.is_alive()
    assert [j.event.id for j in runner.calls] == ["good-1"] and len(third.log_lines.events("duplicate")) == 1
    assert len(kb.read_all(kafka_broker.address, topic + ".results", 2)) == 2


def test_a_watcher_frozen_past_its_lease_keeps_its_claim_on_this_host(kafka_broker, tmp_path):
    """A watcher process stopped (SIGSTOP: as a stall of the whole interpreter, a swapped-out VM) while it ran an
    event, past its claim's lease: another watcher on this host sharing its store, reading the same event, took
    the claim over and ran it beside the first, which then finished too: two runs, two results (found by an
    attack round). A claim of a live process here holds: the second waits, then finds the event done."""
    import signal
    import subprocess
    import sys
    import kafka_broker as kb
    from conftest import ROOT
    from xzatoma_store import Store
    first, second = new_topic(kafka_broker), new_topic(kafka_broker)
    db = tmp_path / "s.db"
    Store(str(db)).open().close()
    settings = dict(brokers=kafka_broker.address, topic=first, group_id="g-" + first, consumer_options=FAST_GROUP,
                    claim_lease=1.0, shutdown_grace=2, max_events=1)
    script = CRASHER % {"paths": [ROOT, os.path.join(ROOT, "tests")]}
    a = subprocess.Popen([sys.executable, "-c", script, json.dumps(settings), str(db), str(tmp_path / "a.log")],
                         env=dict(os.environ, STALL_DIR=str(tmp_path)), stderr=subprocess.PIPE, text=True)
    try:
        kb.produce(kafka_broker.address, first, [(None, cloudevent("stall", data={"plan": PLAN}))])
        wait_for(lambda: (tmp_path / "running").exists(), 60)
        os.kill(a.pid, signal.SIGSTOP)
        store = Store(str(db)).open()
        lease_end = store.conn().execute("SELECT expires_at FROM event_claims").fetchone()[0]
        tries = []
        claim = store.claim_event
        store.claim_event = lambda *args, **kw: tries.append(time.time()) or claim(*args, **kw)
        runner = fake_runner()
        b = start_watcher(kafka_broker, second, runner, store, output_topic=first + ".results", claim_lease=1.0,
                          max_events=1)
        kb.produce(kafka_broker.address, second, [(None, cloudevent("stall", data={"plan": PLAN}))])
        # the second watcher asks for the claim again and again after the frozen one's lease has ended
        assert wait_for(lambda: len([t for t in tries if t > lease_end + 1]) >= 3, 60)
        assert runner.calls == [] and b.log_lines.events("claimed_elsewhere")
        os.kill(a.pid, signal.SIGCONT)
        (tmp_path / "go").touch()
        assert a.wait(60) == 0, a.stderr.read()
        b.thread.join(60)
        assert not b.thread.is_alive()
    finally:
        if a.poll() is None:
            os.kill(a.pid, signal.SIGCONT)
            a.kill()
            a.wait()
    assert runner.calls == [] and len(b.log_lines.events("duplicate")) == 1
    results = [json.loads(r.value) for r in kb.read_all(kafka_broker.address, first + ".results", 1)]
    assert [(r["subject"], r["data"]["answer"]) for r in results] == [("stall", "ok %d" % a.pid)]
    assert kb.committed(kafka_broker.address, "g-" + first, first) == [1]
    assert kb.committed(kafka_broker.address, b.s.group_id, second) == [1]


def test_copies_of_a_running_id_stop_fetching_once_their_messages_fill_the_backlog_bytes():
    """Found by an attack round: copies of an id running here (a producer retrying) count once toward the events
    that may wait, so fetching went on until 256 of them waited: 256 copies of 8 MB held 2 GB. Fetching now stops
    once what waits holds BACKLOG_BYTES of messages, however few ids."""
    import types
    watcher = w.Watcher(w.Settings(brokers="127.0.0.1:1", topic="t", max_concurrent=2), w.Filters(), None,
                        log=w.WatchLog(Lines(), "json"), out=Lines())
    watcher.running_ids.add("same")
    copy = types.SimpleNamespace(topic="t", partition=0, offset=1, value=b"x" * (4 << 20), key=b"same",
                                 headers=[("h", b"v" * 50)])
    for n in range(1, 17):
        kept = w.Kept(copy, watcher.s.max_request_size)
        watcher.backlog.append(w.Job(w.decode_message("t", 0, n, None, cloudevent("same", data={"plan": PLAN})),
                                     None, message=kept))
        assert watcher._ready_or_many() == (n == 16), n  # over 4 MiB a record, as fetched
    # what each keeps for its dead-letter copy is no more than that copy may carry
    assert len(kept.value) == watcher.s.max_request_size and kept.size == len(copy.value) and kept.headers
    # a plan of 90,000 empty objects is 270 KB as JSON and 6 MB parsed: it counts as parsed (250 such copies held
    # 1.6 GB), and the rest of the document is not kept at all
    watcher.backlog.clear()
    value = cloudevent("same", data={"plan": dict(PLAN, context={"pad": [{}] * 90000}), "pad": [{}] * 9000})
    record = types.SimpleNamespace(topic="t", partition=0, offset=1, value=value, key=None, headers=[])
    ev = w.decode_message("t", 0, 1, None, value)
    assert ev.data is None and len(ev.plan.context["pad"]) == 90000
    for n in range(1, 13):
        watcher.backlog.append(w.Job(ev, None, message=w.Kept(record, watcher.s.max_request_size)))
        if watcher._ready_or_many():
            break
    each = w._message_bytes(watcher.backlog[0])
    assert each > 90000 * 64 and each * n >= w.BACKLOG_BYTES > each * (n - 1), (each, n)
    # a text Python holds four bytes a character (one emoji in it), in any of the plan's fields, counts so: 1 MiB of
    # ASCII and an emoji in a plan's name, 7 MiB each, took 461 MB for 10 counted as 70 MiB
    wide = "x" * (1 << 20) + "\U0001F600"
    ev = w.decode_message("t", 0, 1, None, cloudevent("wide", data={"plan": dict(PLAN, name=wide)}))
    assert ev.plan.name == wide and w.Job(ev, None).decoded >= 4 * len(wide)


def test_an_event_held_elsewhere_waits_without_stopping_the_others(kafka_broker, store):
    """An event whose id a live watcher elsewhere holds (frozen mid-run: its claim stands as long as it lives)
    waits for it. It went back into the queue of waiting events, and a watcher with --max-concurrent 1 stopped
    fetching while any event waited: every partition stopped (found by an attack round)."""
    import kafka_broker as kb
    from xzatoma_store import _process_space, _process_start
    topic = new_topic(kafka_broker, partitions=2)
    store.conn().execute("INSERT INTO event_claims (event_id, owner, host, pid, claimed_at, expires_at, attempts, "
                         "started) VALUES ('same', 'a frozen watcher', ?, ?, ?, 0, 1, ?)",
                         (_process_space(), os.getpid(), time.time(), _process_start(os.getpid())))
    runner = fake_runner()
    x = start_watcher(kafka_broker, topic, runner, store, max_events=42)
    try:
        # 40 copies (a producer retrying): they waited one each, and 17 stopped fetching as well
        kb.produce(kafka_broker.address, topic, [(None, cloudevent("same", data={"plan": PLAN}), [], 0)] * 40)
        assert wait_for(lambda: x.log_lines.events("claimed_elsewhere"), 60), x.log_lines.lines[-20:]
        kb.produce(kafka_broker.address, topic, [(None, cloudevent("other-0", data={"plan": PLAN}), [], 0),
                                                 (None, cloudevent("other-1", data={"plan": PLAN}), [], 1)])
        assert wait_for(lambda: sorted(j.event.id for j in runner.calls) == ["other-0", "other-1"], 60), \
            [j.event.id for j in runner.calls]
        store.conn().execute("DELETE FROM event_claims WHERE event_id = 'same'")  # the frozen watcher died
        x.thread.join(60)
        assert not x.thread.is_alive()
    finally:
        x.request_stop("test")
    assert sorted(j.event.id for j in runner.calls) == ["other-0", "other-1", "same"]
    assert len(x.log_lines.events("duplicate")) == 39
    assert kb.committed(kafka_broker.address, x.s.group_id, topic, 2) == [41, 1]


def test_a_claim_whose_release_failed_is_released_when_the_store_answers(kafka_broker, store):
    """A claim holds while its process lives: one whose release failed (a store locked past its busy timeout)
    held its id for good, renewed by the heartbeat, and the event never got a result (found by an attack round).
    The release is tried again until the store takes it."""
    import sqlite3
    import kafka_broker as kb
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [(None, cloudevent("stuck", data={"plan": PLAN}))])
    release, failures = store.release_claim, []

    def locked_once(*args):
        if not failures:
            failures.append(args)
            raise sqlite3.OperationalError("database is locked")
        return release(*args)
    store.release_claim = locked_once
    x = start_watcher(kafka_broker, topic, fake_runner(delay=60), store, shutdown_grace=0.5, claim_lease=1.0)
    assert wait_for(lambda: x.log_lines.events("started"), 60)
    x.request_stop("test")  # past the grace the run is interrupted, and its claim released: that fails once
    x.thread.join(30)
    assert not x.thread.is_alive() and failures
    assert [l.get("retry") for l in x.log_lines.events("store_failed")] == [True]
    assert store.conn().execute("SELECT count(*) FROM event_claims").fetchone()[0] == 0


def test_a_failed_store_write_retried_later_lets_no_copy_run_or_publish_again(store):
    """Found by an attack round, reading the code: a result published whose "published" mark failed left the record
    unmarked, and a copy of its id then published that stored result once more (the mark's retry was dropped
    while the copy ran); and a retried release could delete the claim a copy of its id had just made."""
    watcher = w.Watcher(w.Settings(brokers="127.0.0.1:1", topic="t"), w.Filters(), lambda job: None, store=store)
    watcher.log = lambda *a, **kw: None
    ev = w.decode_message("t", 0, 1, None, cloudevent("X", data={"plan": PLAN}))
    assert store.claim_event("X", watcher.owner, 60)[0]
    store.record_event("X", "c", "completed", result=json.dumps({"subject": "X"}), owner=watcher.owner)
    # the result went out, and marking it so failed: a chore
    watcher.unmarked["X"] = ("t", 0, 1)
    watcher.chores.append(("X", store.event_published))
    copy = w.Job(ev, None)
    assert watcher._claim(copy) == "duplicate"  # not "republish"
    assert watcher._answered_from(copy)  # the same message: its dead-letter copy, if bad, was made then
    other = w.Job(w.decode_message("t", 0, 9, None, cloudevent("X", data={"plan": PLAN})), None)
    assert watcher._claim(other) == "duplicate" and not watcher._answered_from(other)  # another: copied (review)
    with watcher.cond:
        watcher.running_ids.add("X")  # even with a copy of it running, the mark is written
    watcher._do_chores()
    assert not watcher.chores and not watcher.unmarked and store.event_record("X")["published_at"]
    assert store.event_record("X")["result"] is None  # out: its text is not kept for good (up to 1 MB an event)
    # while a chore writes an id's claim, no copy of that id can start (it is among the running ids)
    seen = []
    watcher.chores.append(("Y", lambda event_id, owner: seen.append(event_id in watcher.running_ids)))
    watcher._do_chores()
    assert seen == [True] and "Y" not in watcher.running_ids


def test_a_watcher_that_cannot_claim_an_event_waits_and_never_answers_it_unclaimed(kafka_broker, store):
    """A watcher whose claims failed (a store locked by another process) ended the event with a failed result:
    recorded without the fence it replaced another watcher's published result (found by an attack round); and
    after 5 tries, with the store still locked, it went out beside the result of the run another watcher sharing
    the store was making (found by the next). The claim is now tried again, backing off, for as long as the
    store fails: nothing is answered unclaimed, and the partition's stall shows the wait."""
    import kafka_broker as kb
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [(None, cloudevent("done", data={"plan": PLAN}))])
    first = start_watcher(kafka_broker, topic, fake_runner(), store, max_events=1)
    first.thread.join(60)
    assert not first.thread.is_alive()

    claim = store.claim_event

    def locked(*args, **kw):
        import sqlite3
        raise sqlite3.OperationalError("database is locked")
    store.claim_event = locked
    runner = fake_runner()
    second = start_watcher(kafka_broker, topic, runner, store, max_events=1, backoff_initial=0.05, backoff_max=0.2)
    try:
        assert wait_for(lambda: len(second.log_lines.events("store_failed")) >= 8, 30)
        assert second.thread.is_alive() and runner.calls == []
        assert second.log_lines.events("store_failed")[7]["level"] == "error"  # from the fifth on
        store.claim_event = claim  # the lock is gone: the event turns out answered already
        second.thread.join(60)
        assert not second.thread.is_alive()
    finally:
        store.claim_event = claim
        second.request_stop("test")
    assert [l["event_id"] for l in second.log_lines.events("duplicate")] == ["done"] and runner.calls == []
    assert store.conn().execute("SELECT status FROM processed_events").fetchall()[0][0] == "completed"
    results = [json.loads(r.value)["data"]["status"] for r in kb.read_all(kafka_broker.address, topic + ".results", 2,
                                                                        timeout=5)]
    assert results == ["completed"]


def test_a_result_the_store_cannot_record_waits_for_it_and_never_goes_out_unrecorded(kafka_broker, store):
    """Found by an attack round: with the store's disk full as a run ended, its result was replaced by a failed
    one, published without a record; a second consumer group sharing the store then ran the event again (two
    results), and a completed run's answer was lost. The result now waits, unpublished, and is recorded then
    published once the store works; a rejected message's dead-letter copy follows its record."""
    import sqlite3
    import kafka_broker as kb
    topic, dead = new_topic(kafka_broker), new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [(None, cloudevent("full", data={"plan": PLAN})),
                                             (None, cloudevent("bad", data={"plan": {"goal": "G"}}))])
    record, fails = store.record_event, []

    def full(*args, **kw):
        if fails.count(args[0]) < 3:  # each id's first three
            fails.append(args[0])
            raise sqlite3.OperationalError("database or disk is full")
        return record(*args, **kw)
    store.record_event = full
    runner = fake_runner()
    first = start_watcher(kafka_broker, topic, runner, store, max_events=2, backoff_initial=0.05, backoff_max=0.2,
                          dead_letter_topic=dead)
    first.thread.join(60)
    assert not first.thread.is_alive()
    store.record_event = record
    assert len(fails) == 6 and {"full", "bad"} <= set(fails) and len(runner.calls) == 1  # run once, recorded late
    waits = first.log_lines.events("store_failed")
    assert len(waits) == 6 and all(w["waiting"].startswith("its result") for w in waits)
    results = {json.loads(r.value)["subject"]: json.loads(r.value)["data"]["status"]
               for r in kb.read_all(kafka_broker.address, topic + ".results", 2, timeout=10)}
    assert results == {"full": "completed", "bad": "rejected"}
    assert len(kb.read_all(kafka_broker.address, topic + ".results", 3, timeout=2)) == 2
    assert [m.key for m in kb.read_all(kafka_broker.address, dead, 2, timeout=3)] == [None]  # the bad one, once
    rows = dict(store.conn().execute("SELECT event_id, published_at IS NOT NULL FROM processed_events"))
    assert rows == {"full": 1, "bad": 1}
    second = start_watcher(kafka_broker, topic, fake_runner(), store, max_events=2)  # another group, one store
    second.thread.join(60)
    assert sorted(l["event_id"] for l in second.log_lines.events("duplicate")) == ["bad", "full"]


def _store_full_until(store, full):
    import sqlite3
    record = store.record_event

    def failing(*args, **kw):
        if full.is_set():
            raise sqlite3.OperationalError("database or disk is full")
        return record(*args, **kw)
    store.record_event = failing
    return record


def test_a_result_waiting_for_the_store_keeps_its_claim_and_its_place(kafka_broker, store):
    """Found by the next attack round: a result waiting for the store went back to the queue, its claim released:
    a watcher of another group sharing the store claimed the id and ran it again; and a stop (or a rebalance)
    dropped the finished run, to be run again after redelivery. The record is now waited for as the run was."""
    import kafka_broker as kb
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [(None, cloudevent("wait", data={"plan": PLAN}))])
    full = threading.Event()
    full.set()
    record = _store_full_until(store, full)
    ran_a, ran_b = fake_runner(), fake_runner()
    a = start_watcher(kafka_broker, topic, ran_a, store, max_events=1, backoff_initial=0.05, backoff_max=0.2)
    b = None
    try:
        assert wait_for(lambda: len(a.log_lines.events("store_failed")) >= 2, 30)
        b = start_watcher(kafka_broker, topic, ran_b, store, max_events=1, backoff_initial=0.05, backoff_max=0.2)
        assert wait_for(lambda: b.log_lines.events("claimed_elsewhere"), 30)  # held: a's claim stands
        a.request_stop("test")  # a stop while it waits: the grace period is the record's too
        full.clear()
        a.thread.join(60)
        b.thread.join(60)
        assert not a.thread.is_alive() and not b.thread.is_alive()
    finally:
        store.record_event = record
        for x in (a, b):
            if x is not None:
                x.request_stop("test")
    assert len(ran_a.calls) == 1 and ran_b.calls == []
    assert [l["event_id"] for l in b.log_lines.events("duplicate")] == ["wait"]
    results = kb.read_all(kafka_broker.address, topic + ".results", 2, timeout=5)
    assert [json.loads(r.value)["data"]["status"] for r in results] == ["completed"]
    assert kb.committed(kafka_broker.address, a.s.group_id, topic) == [1]  # settled within the grace period


def test_a_result_the_store_never_records_before_the_stop_is_an_interrupted_run_in_the_counts_and_metrics(
        kafka_broker, store):
    """The grace period ends with the store still full: nothing is published, nothing committed (it runs again
    after redelivery), and the run counts as interrupted in the log's counts and the metrics alike (the metrics
    had nothing of it, found by an attack round)."""
    import kafka_broker as kb
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [(None, cloudevent("never", data={"plan": PLAN}))])
    full = threading.Event()
    full.set()
    record = _store_full_until(store, full)
    outcomes = []

    class Events(Gauges):
        def watch_event(self, outcome):
            outcomes.append(outcome)
    log = Lines()
    s = w.Settings(brokers=kafka_broker.address, topic=topic, group_id="g-" + uuid.uuid4().hex[:8],
                   consumer_options=FAST_GROUP, shutdown_grace=1, backoff_initial=0.05, backoff_max=0.2)
    watcher = w.Watcher(s, w.Filters(), fake_runner(), store=store, log=w.WatchLog(log, "json"), metrics=Events())
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: len(log.events("store_failed")) >= 2, 30)
        watcher.request_stop("test")
        thread.join(60)
        assert not thread.is_alive()
    finally:
        store.record_event = record
    assert watcher.counts["interrupted"] == 1 and outcomes.count("interrupted") == 1
    assert [l["event_id"] for l in log.events("interrupted")] == ["never"]
    assert kb.read_all(kafka_broker.address, topic + ".results", 1, timeout=2) == []
    assert kb.committed(kafka_broker.address, s.group_id, topic) in ([None], [0])  # read again from it


def test_a_result_is_recorded_and_published_only_under_its_claim(kafka_broker, store):
    """Across hosts only the claim's beats tell: a watcher frozen past its lease is taken over (how: test_store),
    and when it wakes and finishes its run, the other's result is the one that goes out (its own is neither
    recorded nor published)."""
    import kafka_broker as kb
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [(None, cloudevent("taken", data={"plan": PLAN})),
                                             (None, cloudevent("kept", data={"plan": PLAN}))])

    def run_plan(job):
        if job.event.id == "taken":  # as if frozen past the lease on another host, and taken over meanwhile
            store.conn().execute("UPDATE event_claims SET owner = 'a watcher elsewhere', host = 'elsewhere', "
                                 "attempts = 2 WHERE event_id = 'taken'")
        return {"status": "completed", "answer": "ran here", "conversation_id": "c-" + job.event.id}
    x = start_watcher(kafka_broker, topic, run_plan, store, max_events=2)
    x.thread.join(60)
    assert not x.thread.is_alive()
    assert [l["event_id"] for l in x.log_lines.events("claim_lost")] == ["taken"]
    results = [json.loads(r.value)["subject"] for r in kb.read_all(kafka_broker.address, topic + ".results", 1)]
    assert results == ["kept"]
    assert store.conn().execute("SELECT owner FROM event_claims WHERE event_id = 'taken'").fetchone()[0] == \
        "a watcher elsewhere"
    assert store.conn().execute("SELECT count(*) FROM processed_events WHERE event_id = 'taken'").fetchone()[0] == 0
    assert kb.committed(kafka_broker.address, x.s.group_id, topic) == [2]


CRASHER = r"""
import json, os, sys
sys.path[:0] = %(paths)r
import xzatoma_watch as w
from xzatoma_store import Store
settings = json.loads(sys.argv[1])
real = w.decode_message


def decode(topic, partition, offset, key, value, *args, **kw):
    if b"CRASH-READ" in value:
        os._exit(7)  # as a segfault or the OOM killer would: nothing runs after
    return real(topic, partition, offset, key, value, *args, **kw)
w.decode_message = decode


def run_plan(job):
    if job.event.id == "long" and os.environ.get("STALL_DIR"):  # runs until it is cancelled, told where it is
        open(os.environ["STALL_DIR"] + "/running", "w").close()
        job.cancel.wait(600)
        return {"status": "interrupted", "conversation_id": "c-long", "error": "interrupted"}
    if job.event.id == "crash-run":
        os._exit(7)
    if job.event.id == "stall":  # tells the test it runs, then runs until the test says go
        open(os.environ["STALL_DIR"] + "/running", "w").close()
        while not os.path.exists(os.environ["STALL_DIR"] + "/go"):
            job.cancel.wait(0.05)
    return {"status": "completed", "answer": "ok " + str(os.getpid()), "conversation_id": "c-" + job.event.id}
store = Store(sys.argv[2]).open()
log = open(sys.argv[3], "a")
watcher = w.Watcher(w.Settings(**settings), w.Filters(), run_plan, store=store, log=w.WatchLog(log, "json"))
import signal
signal.signal(signal.SIGTERM, lambda signum, frame: watcher.signal_stop("SIGTERM"))
sys.exit(watcher.run())
"""


def test_a_watcher_killed_after_it_was_asked_to_stop_has_not_crashed_its_runs(kafka_broker, tmp_path):
    """Kubernetes stops a pod with SIGTERM and kills it 30 s later (`docker stop`, 10 s), the watcher's own grace
    period being 30 s: each such stop of a long run counted as a crash of it, and after watcher.max_attempts of
    them a valid event was set aside as `failed`, never run to its end (attack round 17c). A run that ends by a
    stop asked for is no crash, whether or not the process lives to the end of its grace."""
    import signal
    import subprocess
    import sys
    import kafka_broker as kb
    from conftest import ROOT
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [(None, cloudevent("long", data={"plan": PLAN}))])
    quick = {"session_timeout_ms": 1500, "heartbeat_interval_ms": 300, "max_poll_interval_ms": 8000}
    settings = dict(brokers=kafka_broker.address, topic=topic, group_id="g-" + topic, consumer_options=quick,
                    max_attempts=1, idle_exit=1.0, shutdown_grace=60)
    script = CRASHER % {"paths": [ROOT, os.path.join(ROOT, "tests")]}
    log, stall = tmp_path / "watch.log", tmp_path / "stall"
    stall.mkdir()
    args = [sys.executable, "-c", script, json.dumps(settings), str(tmp_path / "s.db"), str(log)]
    for _ in range(2):  # asked to stop, then killed within its grace period: twice
        (stall / "running").unlink() if (stall / "running").exists() else None
        proc = subprocess.Popen(args, env=dict(os.environ, STALL_DIR=str(stall)))
        try:
            assert wait_for(lambda: (stall / "running").exists(), 60)
            proc.send_signal(signal.SIGTERM)
            assert wait_for(lambda: log.read_text().count('"runs_stopping"') == _ + 1, 30)
        finally:
            proc.kill()
            proc.wait(30)
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)  # no stall now: it runs to its end
    assert r.returncode == 0, r.stderr
    lines = [json.loads(l) for l in log.read_text().splitlines()]
    assert not [l for l in lines if l["event"] == "set_aside"]
    (result,) = kb.read_all(kafka_broker.address, topic + ".results", 1)
    assert json.loads(result.value)["data"]["status"] == "completed"


def _produce_unreadable(address, topic, values, how):
    """One record batch the consumer cannot read, as the broker keeps it: flagged `snappy` (a codec whose library
    is not installed here: a Java producer's default choice meets the same) over a body that is not, with a CRC
    that does not match, or gzip over a body that inflates to 80 MiB (a bomb). Made by kafka-python's own
    producer, patched only while it builds the batch."""
    import gzip
    import pytest
    import kafka.codec
    import kafka.record.default_records as records
    from kafka import KafkaProducer
    with pytest.MonkeyPatch.context() as mp:
        if how == "snappy":
            assert not kafka.codec.has_snappy()  # else the consumer reads it and this test proves nothing
            mp.setitem(KafkaProducer._COMPRESSORS, "snappy", (lambda: True, records.DefaultRecordBatch.CODEC_SNAPPY))
            mp.setattr(kafka.codec, "has_snappy", lambda: True)
            mp.setattr(records, "snappy_encode", lambda data: b"not snappy")
        elif how == "bomb":
            bomb = gzip.compress(bytes(80 << 20), 9)
            mp.setattr(records, "gzip_encode", lambda data: bomb)
            values = [v + b" " * len(bomb) for v in values]  # else "no gain": the producer sends it uncompressed
        else:
            crc = records.calc_crc32c
            mp.setattr(records, "calc_crc32c", lambda data: crc(data) ^ 1)
        compression = {"snappy": "snappy", "bomb": "gzip"}.get(how)
        producer = KafkaProducer(bootstrap_servers=address, acks="all", linger_ms=100, compression_type=compression,
                                 max_request_size=4 << 20)
        try:
            futures = [producer.send(topic, value=v) for v in values]
            producer.flush(30)
            offsets = [f.get(30).offset for f in futures]
        finally:
            producer.close(5)
    assert offsets == list(range(offsets[0], offsets[0] + len(values))), offsets
    return offsets


class Undecodable(str):
    """A header name that is not UTF-8 on the wire (librdkafka sends any bytes): the client's decode fails."""

    def encode(self, *args, **kwargs):
        return b"\xff\xfe"


def test_a_record_batch_the_client_cannot_read_costs_its_records_never_the_partition(kafka_broker, store,
                                                                                     monkeypatch):
    """A batch compressed with a codec whose library is missing, whose CRC fails, or that inflates to 80 MiB, or a
    record with a header name that is not UTF-8, was raised out of poll() by kafka-python once (or not at all,
    when the partition was paused for a run), and then it spun on it inside every later poll: the watcher hung,
    silent, at 100% CPU; and the records after a bad one in its batch could never be read. Now what cannot be
    read is set aside where it is (a log line, a dead-letter note of its origin, the commit), its batch mates
    run, and so does everything after."""
    import kafka.codec
    import kafka_broker as kb
    # the snappy batch stands for a codec whose library is missing, here even with the kafka-codecs extra
    monkeypatch.setattr(kafka.codec, "has_snappy", lambda: False)
    topic = new_topic(kafka_broker)
    good = lambda i: cloudevent("g%d" % i, data={"plan": PLAN})  # noqa: E731
    kb.produce(kafka_broker.address, topic, [(None, good(0))])
    snappy = _produce_unreadable(kafka_broker.address, topic, [good(90 + i) for i in range(3)], "snappy")
    kb.produce(kafka_broker.address, topic, [(None, good(1))])
    crc = _produce_unreadable(kafka_broker.address, topic, [good(80 + i) for i in range(2)], "crc")
    bomb = _produce_unreadable(kafka_broker.address, topic, [good(70)], "bomb")
    # one batch: a good record, one whose header name cannot be decoded, two good ones behind it
    from kafka import KafkaProducer
    zipped = KafkaProducer(bootstrap_servers=kafka_broker.address, acks="all", linger_ms=500, compression_type="gzip")
    try:  # a batch compressed as it should be (gzip is always readable): read through the bounded inflater
        futures = [zipped.send(topic, value=good(5) + b" " * 2000), zipped.send(topic, value=good(6) + b" " * 2000)]
        zipped.flush(30)
        assert [f.get(30).offset for f in futures] == [bomb[0] + 1, bomb[0] + 2]
    finally:
        zipped.close(5)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.address, acks="all", linger_ms=500)
    try:
        futures = [producer.send(topic, value=good(2)), producer.send(topic, value=good(60),
                                                                      headers=[(Undecodable("x"), b"v")]),
                   producer.send(topic, value=good(3)), producer.send(topic, value=good(4))]
        producer.flush(30)
        mixed = [f.get(30) for f in futures]
    finally:
        producer.close(5)
    run_plan = fake_runner()
    total = 1 + 3 + 1 + 2 + 1 + 2 + 4
    watcher = start_watcher(kafka_broker, topic, run_plan, store, dead_letter_topic=topic + ".dlq", max_events=total)
    watcher.thread.join(60)
    assert not watcher.thread.is_alive(), "the watcher is stuck"
    assert [j.event.id for j in run_plan.calls] == ["g0", "g1", "g5", "g6", "g2", "g3", "g4"]
    unread = [l for l in watcher.log_lines.json() if l["event"] == "unreadable"]
    header = mixed[1].offset
    assert [(l["offset"], l.get("last_offset", l["offset"])) for l in unread] == [
        (snappy[0], snappy[-1]), (crc[0], crc[-1]), (bomb[0], bomb[0]), (header, header)]
    reasons = [l["reason"] for l in unread]
    assert "UnsupportedCodecError" in reasons[0] and "xzatoma[kafka-codecs]" in reasons[0]
    assert "CRC" in reasons[1] and "inflates past" in reasons[2] and "UnicodeDecodeError" in reasons[3]
    dlq = kb.read_all(kafka_broker.address, topic + ".dlq", 4)
    origins = sorted((dict(r.headers)["xzatoma_origin"].decode() for r in dlq),
                     key=lambda o: int(o.split(":")[2].split("-")[0]))
    assert origins == ["%s:0:%d-%d" % (topic, snappy[0], snappy[-1]), "%s:0:%d-%d" % (topic, crc[0], crc[-1]),
                       "%s:0:%d" % (topic, bomb[0]), "%s:0:%d" % (topic, header)]
    results = kb.read_all(kafka_broker.address, topic + ".results", 7)
    assert sorted(json.loads(r.value)["subject"] for r in results) == ["g0", "g1", "g2", "g3", "g4", "g5", "g6"]
    assert kb.committed(kafka_broker.address, watcher.s.group_id, topic) == [total]


def test_a_failure_of_the_batch_reader_itself_costs_a_record_not_the_partition(kafka_broker, store, monkeypatch):
    """The backstop under the batch reader: whatever else fails while the client unpacks a batch (here the reader
    itself, for one batch) is raised out of every poll, not once, saying where; the watcher sets that record
    aside, moves past it, and the events after it run."""
    import kafka_broker as kb
    topic = new_topic(kafka_broker)
    sent = kb.produce(kafka_broker.address, topic, [(None, cloudevent("b%d" % i, data={"plan": PLAN}))
                                                   for i in range(3)])
    assert len({m.offset for m in sent}) == 3
    bad = sent[1].offset
    read_batch = w._read_batch

    def failing(batch, *args):
        if batch.base_offset <= bad <= batch.last_offset:
            raise RuntimeError("the reader broke")
        return read_batch(batch, *args)
    monkeypatch.setattr(w, "_read_batch", failing)
    kb.produce(kafka_broker.address, topic, [(None, cloudevent("after", data={"plan": PLAN}))])
    run_plan = fake_runner()
    watcher = start_watcher(kafka_broker, topic, run_plan, store, dead_letter_topic=topic + ".dlq", idle_exit=3)
    watcher.thread.join(60)
    assert not watcher.thread.is_alive(), "the watcher is stuck"
    ran = [j.event.id for j in run_plan.calls]
    unread = [l for l in watcher.log_lines.json() if l["event"] == "unreadable"]
    assert unread and all("the reader broke" in l["reason"] for l in unread)
    # the failing batch holds the bad offset (and perhaps its neighbours): those are set aside, the rest run
    lost = {l["offset"] for l in unread}
    assert bad in lost
    assert sorted(ran + ["b%d" % sent.index(m) for m in sent if m.offset in lost]) == ["after", "b0", "b1", "b2"]
    assert kb.committed(kafka_broker.address, watcher.s.group_id, topic) == [4]


def test_max_events_used_up_stops_fetching_and_commits_nothing_it_did_not_take(kafka_broker, store):
    """With --max-events used up while its last run was busy, every poll fetched the records after it, cut them
    off and sought back: a busy loop (38-50% of a core). And a record cut off that stood for an unreadable
    range was sought back to at the range's end, so the offsets before it were committed as if skipped by the
    client. Now fetching pauses, and nothing after what was taken is committed."""
    import kafka_broker as kb
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [(None, cloudevent("g0", data={"plan": PLAN}))])
    bad = _produce_unreadable(kafka_broker.address, topic, [cloudevent("c%d" % i, data={"plan": PLAN})
                                                           for i in range(3)], "crc")
    kb.produce(kafka_broker.address, topic, [(None, cloudevent("g1", data={"plan": PLAN}))])
    release = threading.Event()

    def run_plan(job):
        release.wait(30)
        return {"status": "completed", "answer": "done", "conversation_id": "conv-" + job.event.id}
    watcher = start_watcher(kafka_broker, topic, run_plan, store, max_events=1, max_concurrent=4)
    assert wait_for(lambda: watcher.in_flight and watcher.consumer.paused(), timeout=30), "fetching goes on"
    assert wait_for(lambda: any(l["event"] == "received" for l in watcher.log_lines.json()), timeout=5)
    release.set()
    watcher.thread.join(30)
    assert not watcher.thread.is_alive()
    assert not [l for l in watcher.log_lines.json() if l["event"] == "unreadable"]
    assert kb.committed(kafka_broker.address, watcher.s.group_id, topic) == [bad[0]]


def test_a_transaction_marker_last_on_a_partition_is_committed_past(kafka_broker, store):
    """A transactional producer's commit marker takes an offset the client never gives out: with it last on the
    partition, the watcher committed one short of the end for good (the lag read 1, the commit looked stalled).
    The consumer reads committed data only (an aborted transaction's events are not run: Tansu does not mark
    them, so that half is not observable here)."""
    import kafka_broker as kb
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    topic = new_topic(kafka_broker)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.address, transactional_id="tx-" + topic, acks="all")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, value=cloudevent("t1", data={"plan": PLAN})).get(30)
        producer.commit_transaction()
    finally:
        producer.close(5)
    tp = TopicPartition(topic, 0)
    reader = KafkaConsumer(bootstrap_servers=kafka_broker.address)
    try:
        end = reader.end_offsets([tp])[tp]
    finally:
        reader.close()
    assert end == 2  # the event and the marker
    run_plan = fake_runner()
    watcher = start_watcher(kafka_broker, topic, run_plan, store, idle_exit=3)
    watcher.thread.join(60)
    assert not watcher.thread.is_alive()
    assert [j.event.id for j in run_plan.calls] == ["t1"]
    assert watcher.consumer.config["isolation_level"] == "read_committed"
    assert kb.committed(kafka_broker.address, watcher.s.group_id, topic) == [end]


def test_one_crash_reading_a_batch_of_one_counts_once_and_a_set_aside_id_is_answered_once(store):
    """Found by an attack round: a batch of the one message a dead watcher left marked was counted twice (its
    batch's mark, then its own), so one crash set it aside; and a message set aside was answered without the
    store, beside the result another watcher sharing it had published for that id."""
    import types
    from kafka import TopicPartition
    tp = TopicPartition("t", 0)
    settings = w.Settings(brokers="127.0.0.1:1", topic="t", max_attempts=2)
    consumer = "%s/t/0" % settings.group_id
    store.begin_attempt(consumer, 5, 5, "a watcher that died reading offset 5")
    msg = types.SimpleNamespace(topic="t", partition=0, offset=5, key=b"X", value=b"{", headers=[])
    store.end_attempt = lambda consumer, owner: None  # each of these watchers dies in its batch
    for crashes, expected in ((1, "read"), (2, "set aside")):  # set aside once it stopped max_attempts times
        watcher = w.Watcher(settings, w.Filters(), lambda job: None, store=store)  # a new process, a new owner
        seen = []
        watcher._handle = lambda tp, m: seen.append("read")
        watcher._set_aside = lambda tp, m, n: seen.append("set aside")
        watcher._commit = lambda *a, **kw: None
        watcher._handle_batch(tp, [msg])
        store.conn().execute("UPDATE message_attempts SET owner = 'dead'")
        assert seen == [expected], (crashes, seen)

    published = []
    watcher._publish = lambda topic, key, value, headers, what, **kw: published.append(json.loads(value)) or None
    store.record_event("X", "c", "completed", result=json.dumps({"subject": "X"}))
    store.event_published("X")
    watcher._answer_now(w.Event(id="X", topic="t", partition=0, offset=5), "set aside unread")
    assert published == []  # answered already
    assert store.claim_event("Y", "another watcher", 60)[0]
    watcher._answer_now(w.Event(id="Y", topic="t", partition=0, offset=6), "set aside unread")
    assert published == []  # running in another watcher: its result is the one
    watcher._answer_now(w.Event(id="Z", topic="t", partition=0, offset=7), "set aside unread")
    assert [(r["subject"], r["data"]["status"]) for r in published] == [("Z", "rejected")]
    record = store.event_record("Z")
    assert record["status"] == "rejected" and record["published_at"]
    assert store.claim_event("Z", "anyone", 60)[2] is not None  # finished: never claimed again


def test_a_message_that_crashes_the_watcher_is_set_aside_after_max_attempts(kafka_broker, tmp_path):
    """Issue 22: a message that killed the watcher killed it on every restart, and the partition waited forever.
    A watcher process that dies reading (or running) one message leaves a mark in the store; the message is then
    read alone, and set aside (a result, a dead-letter copy, the commit) once it has stopped the watcher
    watcher.max_attempts times. The restarts here are real processes ended by os._exit."""
    import subprocess
    import sys
    import kafka_broker as kb
    from conftest import ROOT
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [
        (b"crash-read", b"goal: CRASH-READ\ninstructions: [a]\n"),
        (None, cloudevent("good-1", data={"plan": PLAN})),
        (None, cloudevent("crash-run", data={"plan": PLAN})),
        (None, cloudevent("good-2", data={"plan": PLAN}))])
    quick = {"session_timeout_ms": 1500, "heartbeat_interval_ms": 300, "max_poll_interval_ms": 8000}  # a dead
    # member's partitions move after its session timeout: each restart here waits for it
    settings = dict(brokers=kafka_broker.address, topic=topic, group_id="g-" + topic, consumer_options=quick,
                    dead_letter_topic=topic + ".dlq", max_attempts=1, idle_exit=1.0, shutdown_grace=2)
    script = CRASHER % {"paths": [ROOT, os.path.join(ROOT, "tests")]}
    log = tmp_path / "watch.log"
    codes = []
    for _ in range(6):
        r = subprocess.run([sys.executable, "-c", script, json.dumps(settings), str(tmp_path / "s.db"), str(log)],
                           capture_output=True, text=True, timeout=120)
        codes.append(r.returncode)
        if r.returncode == 0:
            break
        assert r.returncode == 7, r.stderr
    # read: died in the batch, died again read alone, set aside; run: died once, then set aside
    assert codes == [7, 7, 7, 0], codes
    lines = [json.loads(l) for l in log.read_text().splitlines()]
    aside = [l for l in lines if l["event"] == "set_aside"]
    assert [(l.get("event_id"), l["offset"]) for l in aside] == [("crash-read", 0), ("crash-run", 2)]
    results = {json.loads(r.value)["subject"]: json.loads(r.value)["data"]
               for r in kb.read_all(kafka_broker.address, topic + ".results", 4)}
    assert {k: v["status"] for k, v in results.items()} == {"crash-read": "rejected", "good-1": "completed",
                                                            "crash-run": "failed", "good-2": "completed"}
    assert "stopped 1 times while reading it" in results["crash-read"]["error"]
    assert "stopped 1 times while running it" in results["crash-run"]["error"]
    assert len(kb.read_all(kafka_broker.address, topic + ".dlq", 2)) == 2
    assert kb.committed(kafka_broker.address, "g-" + topic, topic) == [4]
