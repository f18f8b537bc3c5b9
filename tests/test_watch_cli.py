"""`xzatoma watch` and `xzatoma publish` as a person runs them: subprocesses, a real broker, the fake model."""

import json
import os
import sys
import time
import uuid

import pytest

from conftest import SCRIPT

FAST = {"session_timeout_ms": 6000, "max_poll_interval_ms": 8000}


def test_without_kafka_python_watch_and_publish_name_the_install(cli, tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text("goal: G\ninstructions: [a]\n")
    for args in (["watch", "--topic", "t"], ["publish", "--plan", str(plan), "--topic", "t"]):
        # kafka hidden: the import fails as it does where the package is not installed
        code = ("import os, runpy, sys; sys.modules['kafka'] = None; sys.argv = [%r] + %r; "
                "sys.path.insert(0, os.path.dirname(%r)); runpy.run_path(%r, run_name='__main__')"
                % (SCRIPT, args, SCRIPT, SCRIPT))
        import subprocess
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli.env,
                           cwd=str(cli.workdir), timeout=60)
        assert r.returncode == 2, r.stderr
        assert r.stdout == ""
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "kafka-python" in lines[0] and "pip install 'xzatoma[kafka]'" in lines[0]


def test_bad_filters_and_plans_are_usage_errors(cli, tmp_path):
    pytest.importorskip("kafka")
    r = cli.run("watch", "--topic", "t", "--source", "(", "--brokers", "127.0.0.1:1")
    assert r.returncode == 2 and r.stderr.strip().endswith("missing ), unterminated subpattern at position 0") \
        and "--source" in r.stderr
    r = cli.run("watch", "--topic", "t", "--match-version", "^x")
    assert r.returncode == 2 and "--match-version" in r.stderr
    cli.write_config({"watcher": {"kafka": {"max_request_size": 1000}, "max_attempts": 0}})
    r = cli.run("watch", "--topic", "t", "--brokers", "127.0.0.1:1")
    assert r.returncode == 2 and "watcher.kafka.max_request_size" in r.stderr and r.stdout == ""
    cli.write_config({})
    bad = tmp_path / "bad.yaml"
    bad.write_text("goal: G\n")
    r = cli.run("publish", "--plan", str(bad), "--topic", "t", "--brokers", "127.0.0.1:1")
    assert r.returncode == 2 and "invalid plan" in r.stderr and "'instructions'" in r.stderr and r.stdout == ""


def test_a_watcher_never_runs_without_its_store_and_bad_flags_are_usage_errors(cli, tmp_path):
    """Found by an attack round: a store that could not be opened (not a database, its disk full, locked by a
    backup past the busy timeout, or persistence turned off) left the watcher running with none, for good: no
    claims, no records, one id answered by every process and after every restart. And flags the client could
    not use were "internal errors", exit 1. Each is refused at start: exit 2, one line."""
    pytest.importorskip("kafka")
    bad = tmp_path / "not-a.db"
    bad.write_bytes(b"this is not a database" * 100)
    cli.write_config({"agent": {"persistence": {"db_path": str(bad)}}})
    r = cli.run("watch", "--brokers", "127.0.0.1:1", "--topic", "t", timeout=60)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "cannot use the conversation database %s (agent.persistence.db_path): file is not a database (the " \
           "watcher records every" % bad \
        in r.stderr
    cli.write_config({"agent": {"persistence": {"enabled": False}}})
    r = cli.run("watch", "--brokers", "127.0.0.1:1", "--topic", "t", timeout=60)
    assert r.returncode == 2 and "agent.persistence.enabled: false" in r.stderr and r.stdout == ""
    cli.write_config({})
    for args, said in ((["--brokers", "localhost:notaport"], "'localhost:notaport' is not host:port"),
                       (["--brokers", ""], "no broker given"),
                       (["--brokers", " , "], "no broker given"),
                       (["--brokers", "127.0.0.1:70000"], "is not host:port"),
                       (["--brokers", "localhost:\u00b2"], "is not host:port"),  # a digit to isdigit(), not to int()
                       (["--metrics-port", "70000"], "--metrics-port must be 1 to 65535"),
                       (["--max-concurrent", "100000"], "--max-concurrent must be at most 256")):
        r = cli.run("watch", "--topic", "t", *(["--brokers", "127.0.0.1:1"] if args[0] != "--brokers" else []),
                    *args, timeout=60)
        assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
        assert said in r.stderr and "internal error" not in r.stderr, (args, r.stderr)
    plan = tmp_path / "p.yaml"
    plan.write_text("goal: G\ninstructions: [a]\n")
    r = cli.run("publish", "--plan", str(plan), "--topic", "t", "--brokers", "h:port")
    assert r.returncode == 2 and "'h:port' is not host:port" in r.stderr and r.stdout == ""


def test_settings_no_broker_can_cure_are_refused_at_start(cli, tmp_path):
    """Found by an SRE's audit (round 17c): an empty filter flag (`--platform "$P"`, P unset) turned the filter
    off and every event ran; a CA file that does not exist, or a session timeout the client refuses (45, meant as
    seconds), was retried for good as `broker_unavailable`, the cause never named; `--idle-exit nan` never went
    idle; `--group-id ""` was taken. Each is exit 2, one line naming it, before any broker is asked."""
    pytest.importorskip("kafka")
    from conftest import wait_for
    base = ["watch", "--brokers", "127.0.0.1:1", "--topic", "t", "--idle-exit", "5"]
    for args, said in ((["--platform", ""], "--platform is empty: give a value, or leave the flag out"),
                       (["--event-types", ","], "--event-types is empty"), (["--source", " "], "--source is empty"),
                       (["--name", ""], "--name is empty"), (["--match-version", ""], "--match-version is empty"),
                       (["--group-id", ""], "--group-id (watcher.kafka.group_id) is empty"),
                       (["--idle-exit", "nan"], "--idle-exit must be a positive number of seconds")):
        r = cli.run(*(base + args), timeout=30)
        lines = r.stderr.strip().splitlines()
        assert (r.returncode, r.stdout, len(lines)) == (2, "", 1) and said in lines[0], (args, r.stderr)
    missing = tmp_path / "no-ca.pem"
    for config, said in (({"ssl_cafile": str(missing), "security_protocol": "SSL"},
                          "cannot read watcher.kafka.ssl_cafile %s: No such file or directory" % missing),
                         ({"session_timeout_ms": 45}, "watcher.kafka.session_timeout_ms"),
                         ({"max_poll_interval_ms": 0}, "watcher.kafka.max_poll_interval_ms")):
        cli.write_config({"watcher": {"kafka": config}})
        r = cli.run(*base, timeout=30)
        assert (r.returncode, r.stdout) == (2, "") and said in r.stderr, (config, r.stderr)
    # not refused: a TLS file left in the configuration of a PLAINTEXT broker (never opened), `~` in its path,
    # and a single regular expression that is a comma (round 17e): each goes on to the broker, unreachable here
    (cli.home / "ca.pem").write_text("not read here")
    for config, args in (({"ssl_cafile": str(missing)}, []), ({"ssl_cafile": "~/ca.pem", "security_protocol": "SSL"},
                                                              []), ({}, ["--source", ","])):
        cli.write_config({"provider": {"type": "ollama", "ollama": {"host": "http://127.0.0.1:1"}},
                          "watcher": {"kafka": config}})
        log = tmp_path / "w.log"
        log.unlink() if log.exists() else None
        proc = cli.popen(*(base + args + ["--log-file", str(log)]))
        try:
            assert wait_for(lambda: log.exists() and "broker_unavailable" in log.read_text(), 40), (config, args)
        finally:
            proc.kill()
            proc.communicate(timeout=30)
    cli.write_config({})


def test_a_topic_no_kafka_client_can_use_is_refused_at_start(cli, tmp_path):
    """Found by an attack round: given an output topic no client can publish to (a space in it; or the default
    '<topic>.results' of a legal 249-character topic, 257 characters), the watcher ran every event (its model
    calls spent) and then held each result for good. Every topic is checked against Kafka's own rule at start:
    exit 2, one line naming the flag, before any broker is asked."""
    pytest.importorskip("kafka")
    from conftest import wait_for
    long_topic = "t" * 249
    for args, flag in ((["--topic", "t", "--output-topic", "plan results"], "--output-topic"),
                       (["--topic", long_topic], "--output-topic (by default"),
                       (["--topic", "t", "--dead-letter-topic", ".."], "--dead-letter-topic"),
                       (["--topic", "a/b"], "--topic (watcher.kafka.topic)"),
                       (["--topic", "t", "--output-topic", ""], "--output-topic is empty")):
        r = cli.run("watch", "--brokers", "127.0.0.1:1", "--idle-exit", "5", *args, timeout=30)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and r.stdout == "" and len(lines) == 1, (args, r.stderr)
        assert flag in lines[0] and ("is not a Kafka topic name" in lines[0] or "empty" in flag), lines
    # a dead-letter topic that is the input topic would bring each copy back to be copied again, for good
    r = cli.run("watch", "--brokers", "127.0.0.1:1", "--topic", "t", "--dead-letter-topic", "t", timeout=30)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert "--dead-letter-topic (watcher.kafka.dead_letter_topic) is the input topic" in r.stderr
    # so is an XZepr API that is not an http(s) URL
    cli.write_config({"provider": {"type": "ollama", "ollama": {"host": "http://127.0.0.1:1"}},
                      "xzepr": {"api_url": "xzepr.example.com/api"}})
    r = cli.run("watch", "--brokers", "127.0.0.1:1", "--topic", "t", timeout=30)
    assert r.returncode == 2 and "xzepr.api_url needs http:// or https:// and a host" in r.stderr, r.stderr
    cli.write_config({})
    # nothing is published by a dry run: its input topic is all that must be legal (it goes on to the broker)
    log = tmp_path / "w.log"
    proc = cli.popen("watch", "--brokers", "127.0.0.1:1", "--topic", long_topic, "--dry-run", "--log-file", log)
    try:
        assert wait_for(lambda: log.exists() and "broker_unavailable" in log.read_text(), 40)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    plan = tmp_path / "p.yaml"
    plan.write_text("goal: G\ninstructions: [a]\n")
    for topic in ("bad topic", ""):
        r = cli.run("publish", "--plan", str(plan), "--topic", topic, "--brokers", "127.0.0.1:1")
        assert r.returncode == 2 and "--topic" in r.stderr and "is not a Kafka topic name" in r.stderr


def test_publish_then_watch_end_to_end(cli, fake, kafka_broker, tmp_path):
    import kafka_broker as kb
    topic = "cli-" + uuid.uuid4().hex[:8]
    kb.create_topic(kafka_broker.address, topic)
    cli.use(fake)
    cfg = __import__("yaml").safe_load(cli.config_path.read_text())
    cfg["watcher"] = {"kafka": dict(FAST, bootstrap_servers=kafka_broker.address, max_request_size=65536),
                      "max_attempts": 3, "claim_lease_seconds": 30, "max_message_bytes": 1 << 20}
    cli.write_config(cfg)
    (cli.workdir / "notes.txt").write_text("hello\n")
    (cli.workdir / "AGENTS.md").write_text("Answer tersely. WATCH-RULE\n")  # event runs get project instructions
    plan = tmp_path / "task.yaml"
    plan.write_text("goal: Count the lines of notes.txt\ninstructions: [read notes.txt, count]\n")
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps({"name": "lines", "description": "Count lines", "version": "1.2.0",
                                 "steps": [{"name": "read", "action": "read notes.txt"}]}))

    ids = []
    for args in (["--plan", str(plan)], ["--plan", str(steps), "--xzepr", "--type", "build.done"],
                 ["--plan", "-", "--key", "stdin-key"]):
        r = cli.run("publish", "--topic", topic, *args, input=plan.read_text() if "-" in args else None)
        assert r.returncode == 0, r.stderr
        ids.append(r.stdout.strip())
    uuid.UUID(ids[0])
    for _ in ids:  # each event's run reads the file, then answers (an answer without the read is unverified)
        fake.add({"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]}, {"content": "1 line"})

    r = cli.run("watch", "--topic", topic, "--max-events", "3", "--log-format", "json", "--group-id",
                "g-" + topic, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    log = [json.loads(l) for l in r.stderr.splitlines() if l.startswith("{")]
    finished = [l for l in log if l["event"] == "finished"]
    assert sorted(l["event_id"] for l in finished) == sorted(ids)
    assert all(l["status"] == "completed" for l in finished)
    assert any(l["event"] == "committed" and l["offset"] == 3 for l in log)

    results = [json.loads(m.value) for m in kb.read_all(kafka_broker.address, topic + ".results", 3)]
    assert sorted(r["subject"] for r in results) == sorted(ids)
    assert {r["data"]["answer"] for r in results} == {"1 line"}

    h = cli.run("history", "list", "--kind", "watch", "--json")
    convs = json.loads(h.stdout)
    assert len(convs) == 3 and all(c["kind"] == "watch" and c["status"] == "completed" for c in convs)
    meta = sorted((json.loads(c["source"]) for c in convs), key=lambda m: m["offset"])
    assert [m["offset"] for m in meta] == [0, 1, 2] and meta[1]["type"] == "build.done"
    assert [m["event_id"] for m in meta] == ids  # a CloudEvent's id, whatever the message key
    assert all(m["topic"] == topic and m["partition"] == 0 for m in meta)
    assert all("WATCH-RULE" in q["body"]["messages"][1]["content"] for q in fake.model_requests())
    assert {c["safety"] for c in convs} == {"restricted"}
    # a re-read (a new group from the beginning, same store) runs nothing twice
    r = cli.run("watch", "--topic", topic, "--max-events", "3", "--log-format", "json", "--group-id",
                "g2-" + topic, timeout=120)
    assert r.returncode == 0, r.stderr
    dup = [l for l in map(json.loads, r.stderr.splitlines()) if l["event"] == "duplicate"]
    assert len(dup) == 3 and len(fake.model_requests()) == 6  # two per event, none again


def _watch_setup(cli, fake, kafka_broker, **watcher):
    import kafka_broker as kb
    import yaml
    topic = "cli-" + uuid.uuid4().hex[:8]
    kb.create_topic(kafka_broker.address, topic)
    cli.use(fake)
    cfg = yaml.safe_load(cli.config_path.read_text())
    cfg["watcher"] = dict(watcher, kafka=dict(FAST, bootstrap_servers=kafka_broker.address, topic=topic,
                                              group_id="g-" + topic))
    cli.write_config(cfg)
    return topic


def _log(path):
    try:
        return [json.loads(l) for l in path.read_text().splitlines() if l.startswith("{")]
    except FileNotFoundError:
        return []


def test_sigterm_lets_the_running_plan_finish_then_exits_0(cli, fake, kafka_broker, tmp_path):
    import signal
    import kafka_broker as kb
    from conftest import wait_for
    topic = _watch_setup(cli, fake, kafka_broker)
    kb.produce(kafka_broker.address, topic, [(b"term-1", b"goal: G\ninstructions: [a]\n")])
    fake.add({"content": "finished in time", "delay": 2})
    log = tmp_path / "watch.log"
    proc = cli.popen("watch", "--log-format", "json", "--log-file", log)
    try:
        assert wait_for(lambda: any(l["event"] == "started" for l in _log(log)), 60)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out == "" and err == ""
    events = [l["event"] for l in _log(log)]
    assert events.index("stopping") < events.index("finished") < events.index("stopped")
    assert [l["status"] for l in _log(log) if l["event"] == "finished"] == ["completed"]
    assert kb.committed(kafka_broker.address, "g-" + topic, topic) == [1]


def test_sigterm_past_the_grace_cuts_off_the_model_request_and_leaves_the_group(cli, fake, kafka_broker, tmp_path):
    """Past the grace the runs are interrupted; one waiting for its model's answer waited for the server (the
    watcher exited ~20 s after SIGTERM with a 3 s grace, its consumer not closed: 'close_failed'). The request
    is now cut off, the run recorded interrupted and not committed, and the watcher leaves at once."""
    import signal
    import kafka_broker as kb
    from conftest import wait_for
    topic = _watch_setup(cli, fake, kafka_broker, shutdown_grace_seconds=1)
    kb.produce(kafka_broker.address, topic, [(b"slow-1", b"goal: G\ninstructions: [a]\n")])
    fake.add({"content": "far too late", "delay": 60})
    log = tmp_path / "watch.log"
    proc = cli.popen("watch", "--log-format", "json", "--log-file", log)
    try:
        assert wait_for(lambda: len(fake.model_requests()) == 1, 60)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - signalled
    finally:
        proc.kill()
    assert proc.returncode == 0 and out == "" and err == ""
    events = [l["event"] for l in _log(log)]
    assert "interrupted" in events and "close_failed" not in events and events[-1] == "stopped"
    assert took < 10, took  # the grace (1 s), the cut (0.25 s), closing; it was over 20 s
    assert len(fake.model_requests()) == 1  # cut off, not sent again
    assert kb.committed(kafka_broker.address, "g-" + topic, topic) == [0]  # not past it: redelivered


def test_a_storm_of_signals_while_stopping_still_exits_0_with_nothing_left(cli, fake, kafka_broker, tmp_path):
    """SIGTERM and SIGINT every few milliseconds, a run in flight: once the watcher had stopped, its handlers were
    put back to the default action while the process still cleaned up, and the storm killed it there (-15, or a
    KeyboardInterrupt traceback out of the sandbox's clean-up), its private TMPDIR left behind (attack round 13)."""
    import signal
    import kafka_broker as kb
    from conftest import wait_for
    topic = _watch_setup(cli, fake, kafka_broker, shutdown_grace_seconds=1)
    kb.produce(kafka_broker.address, topic, [(b"storm-1", b"goal: G\ninstructions: [a]\n")])
    fake.add({"content": "far too late", "delay": 60})
    log = tmp_path / "watch.log"
    proc = cli.popen("watch", "--mode", "write", "--log-format", "json", "--log-file", log)
    try:
        assert wait_for(lambda: len(fake.model_requests()) == 1, 60)
        assert list(cli.tmpdir.glob("xzatoma-run-*"))  # the sandbox's, made at start for a write-mode watcher
        deadline, n = time.monotonic() + 30, 0
        while proc.poll() is None and time.monotonic() < deadline:
            proc.send_signal(signal.SIGTERM if n % 2 else signal.SIGINT)
            n += 1
            time.sleep(0.005)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, (proc.returncode, err[-800:])
    assert not list(cli.tmpdir.glob("xzatoma-run-*")) and n > 10
    assert _log(log)[-1]["event"] == "stopped"


def test_kill_9_mid_run_then_restart_completes_the_event_once(cli, fake, kafka_broker, tmp_path):
    import signal
    import kafka_broker as kb
    from conftest import wait_for
    topic = _watch_setup(cli, fake, kafka_broker)
    kb.produce(kafka_broker.address, topic, [(b"kill-1", b"goal: G\ninstructions: [a]\n")])
    fake.add({"content": "never delivered", "delay": 30}, {"content": "done after restart"})
    log = tmp_path / "watch.log"
    proc = cli.popen("watch", "--log-format", "json", "--log-file", log)
    try:
        assert wait_for(lambda: any(l["event"] == "started" for l in _log(log)), 60)
        assert wait_for(lambda: len(fake.model_requests()) == 1, 20)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    r = cli.run("watch", "--max-events", "1", "--log-format", "json", timeout=120)
    assert r.returncode == 0, r.stderr
    finished = [json.loads(l) for l in r.stderr.splitlines() if '"finished"' in l]
    assert [(f["event_id"], f["status"]) for f in finished] == [("kill-1", "completed")]
    results = [json.loads(m.value) for m in kb.read_all(kafka_broker.address, topic + ".results", 1)]
    assert [(x["subject"], x["type"], x["data"]["answer"]) for x in results] == \
        [("kill-1", "xzatoma.plan.completed", "done after restart")]
    convs = json.loads(cli.run("history", "list", "--kind", "watch", "--json").stdout)
    assert sorted(c["status"] for c in convs) == ["completed", "interrupted"]  # the killed run is reaped


def test_sigterm_while_the_watcher_starts_exits_0_and_leaves_no_temp_dir(cli, fake, tmp_path):
    """SIGTERM in the seconds a watcher takes to start (its checks, its sandbox, a big tree) met the default action:
    killed, its sandbox's private TMPDIR left behind in /tmp (seen in attack round 12's runs). The signal is sent
    from inside the start-up, right after the sandbox's TMPDIR is made, so it comes then and no sooner."""
    import subprocess
    cli.use(fake)
    starter = tmp_path / "starter.py"
    starter.write_text(
        "import os, signal, sys\n"
        "sys.path.insert(0, %r)\n"
        "import xzatoma_core\n"
        "build = xzatoma_core.build_confinement\n"
        "def slow(*args, **kw):\n"
        "    confinement = build(*args, **kw)\n"
        "    confinement.sandbox.tmpdir  # made, as a first command makes it\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return confinement\n"
        "xzatoma_core.build_confinement = slow\n"
        "sys.exit(xzatoma_core.main(sys.argv[1:]))\n" % os.path.dirname(SCRIPT))
    done = subprocess.run([sys.executable, str(starter), "watch", "--brokers", "127.0.0.1:1", "--topic", "t",
                           "--mode", "write"], env=cli.env, cwd=str(cli.workdir), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, (done.returncode, done.stderr[-500:])
    assert "Traceback" not in done.stderr and not list(cli.tmpdir.glob("xzatoma-run-*"))


def test_unreachable_broker_is_retried_with_one_line_per_attempt(cli, tmp_path):
    pytest.importorskip("kafka")
    import socket
    import signal
    from conftest import wait_for
    # bound, never listening, and held for the whole test: a connection is refused, and no broker another test
    # starts meanwhile can take the port (a closed one could be given out again, and the watcher then connected)
    port_holder = socket.socket()
    port_holder.bind(("127.0.0.1", 0))
    port = port_holder.getsockname()[1]
    log = tmp_path / "w.log"
    proc = cli.popen("watch", "--brokers", "127.0.0.1:%d" % port, "--topic", "t", "--dry-run", "--log-file", log)
    try:
        assert wait_for(lambda: log.exists() and log.read_text().count("broker_unavailable") >= 2, 40)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        port_holder.close()
    assert proc.returncode == 0 and out == "" and err == ""  # kafka-python's own noise stays off stderr
    lines = [l for l in log.read_text().splitlines() if "broker_unavailable" in l]
    assert "attempt=1 " in lines[0] and "attempt=2 " in lines[1] and "retry_in=" in lines[0]


def test_publish_to_an_unreachable_broker_fails_with_exit_1(cli, tmp_path):
    pytest.importorskip("kafka")
    plan = tmp_path / "p.yaml"
    plan.write_text("goal: G\ninstructions: [a]\n")
    r = cli.run("publish", "--plan", plan, "--brokers", "127.0.0.1:1", "--topic", "t", timeout=90)
    assert r.returncode == 1 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "cannot reach the Kafka brokers 127.0.0.1:1" in r.stderr


def test_publish_refuses_a_plan_larger_than_a_watcher_reads_before_reading_it_all(cli, tmp_path):
    pytest.importorskip("kafka")
    r = cli.run("publish", "--plan", "/dev/zero", "--brokers", "127.0.0.1:1", "--topic", "t")
    assert (r.returncode, r.stdout) == (2, "")
    assert "plan file /dev/zero is larger than 8,388,608 bytes (watcher.max_message_bytes)" in r.stderr
    cli.write_config({"watcher": {"max_message_bytes": 2048}})
    plan = tmp_path / "p.yaml"
    plan.write_text("goal: G\ninstructions: [a]\ncontext: " + "\u20ac" * 1000 + "\n", encoding="utf-8")
    r = cli.run("publish", "--plan", plan, "--brokers", "127.0.0.1:1", "--topic", "t")  # 1,000 characters, 3,000 bytes
    assert (r.returncode, r.stdout) == (2, "") and "larger than 2,048 bytes" in r.stderr, r.stderr
    # a plan under the limit whose event is over it (round 17b: 925 bytes of plan, events of 1,166 and 2,529 bytes
    # that a watcher rejected unread): refused before any broker is asked
    plan.write_text("goal: " + "g" * 1950 + "\ninstructions: [a]\n")
    for extra in ((), ("--xzepr",)):
        r = cli.run("publish", "--plan", plan, "--brokers", "127.0.0.1:1", "--topic", "t", *extra)
        assert (r.returncode, r.stdout) == (2, "") and "over watcher.max_message_bytes (2,048): a watcher would " \
            "reject it unread; give a smaller plan" in r.stderr and "the event is " in r.stderr, r.stderr


def test_kafka_secrets_come_from_the_environment_and_are_never_shown(cli, tmp_path):
    pytest.importorskip("kafka")
    import signal
    import socket
    import yaml
    from conftest import wait_for
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    secret = "kafka-pass-Zq81xWv3"
    cli.write_config({"watcher": {"kafka": {"bootstrap_servers": "127.0.0.1:%d" % port, "topic": "t",
                                            "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                                            "username": "${KAFKA_USER}", "password": "${KAFKA_PASS}"}},
                      "xzepr": {"api_key": "${XZEPR_KEY_FOR_TEST}"}})
    env = {"KAFKA_USER": "svc", "KAFKA_PASS": secret, "XZEPR_KEY_FOR_TEST": "xzepr-key-Lk29sd8f"}
    shown = cli.run("config", "show", env=env)
    assert shown.returncode == 0 and secret not in shown.stdout and "xzepr-key" not in shown.stdout
    assert "watcher.kafka.password" in shown.stdout and "watcher.kafka.username" in shown.stdout
    log = tmp_path / "w.log"
    proc = cli.popen("watch", "--dry-run", "--log-file", log, "-v", env=env)
    try:
        assert wait_for(lambda: log.exists() and "broker_unavailable" in log.read_text(), 40)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0
    for text in (log.read_text(), out, err):
        assert secret not in text and "xzepr-key-Lk29sd8f" not in text


def test_planning_mode_event_runs_prepare_no_terminal_sandbox(fake, tmp_path, monkeypatch):
    """Issue 22: every event built a terminal sandbox (and its protected set) for a planning-mode run that has no
    terminal tool. In planning mode none is made (issue 23: the protected set is the process's, built once); the
    runs still complete and are stored as kind 'watch'."""
    import xzatoma
    import xzatoma_tools
    import xzatoma_watch as w
    from xzatoma_store import Store
    work = tmp_path / "work"
    work.mkdir()
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path), "XZATOMA_HOME": str(tmp_path / "xz")}
    cfg = xzatoma.load_config({"provider.type": "ollama", "provider.ollama.host": fake.url,
                               "provider.max_retries": 0}, env=env)
    made = []
    real = xzatoma_tools.Sandbox
    monkeypatch.setattr(xzatoma_tools, "Sandbox", lambda *a, **kw: made.append(a) or real(*a, **kw))
    store = Store(str(tmp_path / "c.db")).open()
    try:
        run_plan = xzatoma.watch_runner(cfg, xzatoma.Console(quiet=True), store, w.Settings(working_dir=str(work)),
                                        "planning", False)
        fake.add({"content": "one"}, {"content": "two"})
        outcomes = []
        for n in range(2):
            ev = w.decode_message("t", 0, n, ("p-%d" % n).encode(), b"goal: G\ninstructions: [look]\n")
            outcomes.append(run_plan(w.Job(ev, None)))
        assert [o["status"] for o in outcomes] == ["completed", "completed"]
        assert [o["answer"] for o in outcomes] == ["one", "two"]
        assert made == []
        assert [c["kind"] for c in store.list_conversations()] == ["watch", "watch"]
        tools = {t["function"]["name"] for t in fake.model_requests()[0]["body"]["tools"]}
        assert "terminal" not in tools and "read_file" in tools
    finally:
        store.close()


def test_a_watcher_s_runs_count_in_its_metrics_as_run_s_do(fake, tmp_path):
    """The watcher's /metrics served the agent's metrics with no series: its runs were given none (round 17c)."""
    pytest.importorskip("prometheus_client")
    import xzatoma
    import xzatoma_metrics
    import xzatoma_watch as w
    work = tmp_path / "work"
    work.mkdir()
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path), "XZATOMA_HOME": str(tmp_path / "xz")}
    cfg = xzatoma.load_config({"provider.type": "ollama", "provider.ollama.host": fake.url,
                               "provider.max_retries": 0}, env=env)
    metrics = xzatoma_metrics.PrometheusMetrics()
    run_plan = xzatoma.watch_runner(cfg, xzatoma.Console(quiet=True), None, w.Settings(working_dir=str(work)),
                                    "planning", False, metrics)
    fake.add({"content": "one"}, {"content": "two"})
    ev = w.decode_message("t", 0, 0, b"k", b"goal: G\ninstructions: [look]\n")
    assert run_plan(w.Job(ev, None))["status"] == "completed"
    value = metrics.registry.get_sample_value
    assert value("xzatoma_runs_total", {"status": "completed"}) == 1
    assert value("xzatoma_model_requests_total", {"provider": "ollama", "status": "ok"}) >= 1


def test_a_model_server_away_is_waited_for_and_its_events_run_when_it_is_back(kafka_broker, tmp_path):
    """A local model server down (restarting): each run failed in a millisecond, nothing listening, and the whole
    backlog was answered `failed` and committed (attack round 17c). The watcher waits for the server instead,
    backing off, one run trying it at a time, and every event runs once it is back."""
    import kafka_broker as kb
    import xzatoma
    import xzatoma_watch as w
    from conftest import wait_for
    from fake_model import FakeModel
    from test_watch import Gauges, Lines, cloudevent, new_topic, PLAN
    from xzatoma_store import Store
    work = tmp_path / "work"
    work.mkdir()
    port = kb.free_port()
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path), "XZATOMA_HOME": str(tmp_path / "xz")}
    cfg = xzatoma.load_config({"provider.type": "ollama", "provider.ollama.host": "127.0.0.1:%d" % port,
                               "provider.max_retries": 0}, env=env)
    store = Store(str(tmp_path / "c.db")).open()
    topic = new_topic(kafka_broker)
    kb.produce(kafka_broker.address, topic, [(None, cloudevent("away-%d" % i, data={"plan": PLAN})) for i in range(3)])
    run_plan = xzatoma.watch_runner(cfg, xzatoma.Console(quiet=True), store, w.Settings(working_dir=str(work)),
                                    "planning", False)
    log, fake = Lines(), None
    settings = w.Settings(brokers=kafka_broker.address, topic=topic, group_id="g-" + topic, max_events=3,
                          max_concurrent=2, backoff_initial=2.0, backoff_max=2.0, consumer_options=FAST,
                          lag_interval=0.1)
    gauges = Gauges()
    watcher = w.Watcher(settings, w.Filters(), run_plan, store=store, log=w.WatchLog(log, "json"), metrics=gauges)
    thread = __import__("threading").Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: len(log.events("model_unavailable")) >= 3, 60)
        # the wait is a stall, as the alert sees it (round 17e: it restarted at every lag report)
        assert wait_for(lambda: gauges.stalled.get(0, 0.0) > 1.5, 30), gauges.stalled
        assert not log.events("finished") and len(kb.read_all(kafka_broker.address, topic + ".results", 0, 1)) == 0
        fake = FakeModel().start(port)
        fake.generator = lambda body: {"content": "done"}
        thread.join(90)
        assert not thread.is_alive()
    finally:
        watcher.request_stop("test")
        thread.join(30)
        store.close()
        if fake is not None:
            fake.stop()
    assert len(log.events("model_available")) == 1
    results = [json.loads(r.value) for r in kb.read_all(kafka_broker.address, topic + ".results", 3)]
    assert sorted(r["subject"] for r in results) == ["away-0", "away-1", "away-2"]
    assert {r["data"]["status"] for r in results} == {"unverified"}  # answered without a tool: run, not failed


def test_a_watcher_reads_what_changed_between_events_and_only_that(fake, tmp_path, monkeypatch):
    """The watcher's Workspace reads AGENTS.md and looks for skills once, then only checks a stat (issue 22): an
    edit that keeps the size and the mtime is still seen (the ctime moves), a file removed or a skill added is
    seen by the next event, and nothing is read again while nothing changed."""
    import xzatoma
    import xzatoma_watch as w
    work = tmp_path / "work"
    work.mkdir()
    (work / ".git").mkdir()  # the instructions come from the working directory only
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path), "XZATOMA_HOME": str(tmp_path / "xz")}
    cfg = xzatoma.load_config({"provider.type": "ollama", "provider.ollama.host": fake.url,
                               "provider.max_retries": 0, "agent.tools.profile": "full",
                               "agent.skills.user_dir": str(tmp_path / "skills")}, env=env)
    agents = work / "AGENTS.md"
    agents.write_text("Answer in French.\n")
    os.utime(agents, (time.time() - 3600,) * 2)
    reads = []
    real = xzatoma.load_instructions
    monkeypatch.setattr(xzatoma, "load_instructions", lambda *a, **kw: reads.append(1) or real(*a, **kw))
    monkeypatch.setattr(xzatoma.Workspace, "RACY_SECONDS", 0)  # os.utime just moved the ctime: trust it now
    run_plan = xzatoma.watch_runner(cfg, xzatoma.Console(quiet=True), None, w.Settings(working_dir=str(work)),
                                    "planning", False)

    def environment():
        ev = w.decode_message("t", 0, 0, b"k", b"goal: G\ninstructions: [look]\n")
        fake.add({"content": "ok"})
        assert run_plan(w.Job(ev, None))["status"] in ("completed", "unverified")
        return [m["content"] for m in fake.model_requests()[-1]["body"]["messages"]
                if m["role"] == "user" and "<environment_context>" in m["content"]][0]

    assert "Answer in French." in environment()
    assert "Answer in French." in environment()
    assert len(reads) == 1
    old = agents.stat().st_mtime
    agents.write_text("Answer in German.\n")  # the same size, and (as within one clock tick) the same mtime
    os.utime(agents, (old, old))
    assert "Answer in German." in environment()
    agents.unlink()
    assert "Answer in" not in environment()
    assert "Count words." not in environment()
    skill = tmp_path / "skills" / "x"
    skill.mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: x\ndescription: Count words. Use for word counts.\n---\nBody\n")
    assert "Count words." in environment()
