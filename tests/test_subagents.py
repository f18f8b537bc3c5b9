"""Subagents: depth, tool narrowing, parallel runs, fail_fast, quotas, confirmations, Ctrl-C, metrics."""

import json
import os
import signal
import subprocess
import threading
import time
import urllib.request

import pytest

from conftest import tool_call, wait_for
from ptyrun import PtyProcess


def subagent_brain(parent_reply, delay=0.0, child_tools=None):
    """A fake model for trees: subagents answer their task (after `delay`), then summarise it."""
    def brain(body):
        msgs = body["messages"]
        if "You are a subagent" in msgs[1]["content"]:
            task = msgs[2]["content"]
            if msgs[-1]["role"] == "user" and msgs[-1]["content"].startswith("Summarise"):
                return {"content": "summary of %s" % task, "delay": delay}
            if child_tools and not any(m["role"] == "tool" for m in msgs):
                return {"tool_calls": child_tools(task)}
            return {"content": "answer to %s" % task, "delay": delay}
        if not any(m["role"] == "tool" for m in msgs):
            return {"tool_calls": [parent_reply]}
        result = [m["content"] for m in msgs if m["role"] == "tool"][-1]
        return {"content": "PARENT SAW:\n" + result}
    return brain


def child_requests(fake):
    return [q for q in fake.model_requests() if "You are a subagent" in q["body"]["messages"][1]["content"]]


def test_subagent_runs_and_reports_with_metadata(cli, fake):
    cli.use(fake)
    fake.generator = subagent_brain(tool_call("subagent", label="research", task_prompt="find the docs",
                                              allowed_tools=["read_file", "grep"], max_turns=4))
    r = cli.run("run", "--json", "--prompt", "delegate")
    assert r.returncode == 0, r.stderr
    answer = json.loads(r.stdout)["answer"]
    assert answer.startswith("PARENT SAW:\n[subagent research · depth 1 · completed · 2 turns · ")
    assert answer.endswith("summary of find the docs")
    child = child_requests(fake)
    assert {t["function"]["name"] for t in child[0]["body"]["tools"]} == {"read_file", "grep"}
    assert child[-1]["body"].get("tools") is None  # the summary request offers no tools
    assert "[research] ▶" not in r.stderr and "[research] started (depth 1, up to 4 turns)" in r.stderr
    cid = json.loads(r.stdout)["conversation_id"]
    tree = cli.run("replay", cid, "--tree").stdout.splitlines()
    assert len(tree) == 2 and "[research] depth 1 · 2 turns" in tree[1] and tree[1].endswith("completed")


def test_depth_limit(cli, fake):
    cli.use(fake, subagent={"max_depth": 1})
    nested = tool_call("subagent", label="inner", task_prompt="go deeper")
    fake.generator = subagent_brain(tool_call("subagent", label="outer", task_prompt="delegate again"),
                                    child_tools=lambda task: [nested])
    r = cli.run("run", "--json", "--prompt", "x")
    assert r.returncode == 0, r.stderr
    inner_results = [m["content"] for q in child_requests(fake) for m in q["body"]["messages"] if m["role"] == "tool"]
    assert "Error: maximum subagent depth 1 reached" in inner_results


def test_no_escalation_and_unknown_tools(cli, fake):
    cli.use(fake)
    fake.generator = subagent_brain(tool_call("subagent", label="w", task_prompt="write",
                                              allowed_tools=["write_file", "read_file", "nonsense"]))
    r = cli.run("run", "--mode", "planning", "--json", "--prompt", "x")
    answer = json.loads(r.stdout)["answer"]
    assert "Error: allowed_tools names tools this agent does not have: write_file, nonsense; valid tools:" in answer
    assert "read_file" in answer.split("valid tools:")[1] and "write_file" not in answer.split("valid tools:")[1]
    assert child_requests(fake) == []


def test_an_empty_allowed_tools_gives_no_tools_and_bad_items_are_an_error(cli, fake):
    """Round 19c: `allowed_tools: []` gave the child every tool of its parent; `[null]` was a TypeError."""
    cli.use(fake)
    fake.generator = subagent_brain(tool_call("subagent", label="none", task_prompt="think", allowed_tools=[]))
    r = cli.run("run", "--json", "--prompt", "x")
    assert r.returncode == 0, r.stderr
    assert [q["body"].get("tools") for q in child_requests(fake)] == [None, None]  # the task, the summary
    fake.generator = subagent_brain(tool_call("parallel_subagent", tasks=[
        {"label": "a", "task_prompt": "t", "allowed_tools": [None]}]))
    answer = json.loads(cli.run("run", "--json", "--prompt", "x").stdout)["answer"]
    assert "Error: parameter 'tasks[0].allowed_tools[0]' must be a string, got null" in answer, answer


def test_a_subagent_gets_at_most_its_parent_s_turns(cli, fake):
    """Round 19c: `run --max-turns 3` with `subagent {max_turns: 40}` made 44 model calls."""
    cli.use(fake)
    calls = []

    def brain(body):
        calls.append(body)
        if "You are a subagent" in body["messages"][1]["content"]:
            return {"tool_calls": [tool_call("list_directory", path=".")]}  # never done
        return {"tool_calls": [tool_call("subagent", label="long", task_prompt="loop", max_turns=40)]}
    fake.generator = brain
    r = cli.run("run", "--max-turns", "3", "--json", "--prompt", "x")
    assert r.returncode == 1, r.stderr
    children = [b for b in calls if "You are a subagent" in b["messages"][1]["content"]]
    # each subagent 3 turns, its summary included (round 19e: the summary was a call past the limit)
    assert len(children) in (3, 6, 9) and "up to 3 turns" in r.stderr
    assert len(calls) == 3 + len(children)
    calls.clear()
    r = cli.run("run", "--max-turns", "1", "--json", "--prompt", "x")
    assert len(calls) == 2, [b["messages"][1]["content"][:40] for b in calls]


def parallel_call(n, **kw):
    return tool_call("parallel_subagent", tasks=[{"label": "t%d" % i, "task_prompt": "task %d" % i}
                                                 for i in range(n)], **kw)


def test_parallel_runs_concurrently_and_keeps_task_order(cli, fake):
    cli.use(fake)
    brain = subagent_brain(parallel_call(4))
    together = threading.Barrier(4, timeout=20)  # each child's first request waits until all four are in flight

    def concurrent_brain(body):
        msgs = body["messages"]
        if "You are a subagent" in msgs[1]["content"] and len(msgs) == 3:
            try:
                together.wait()
            except threading.BrokenBarrierError:
                return {"status": 500, "body": "the four subagents were not in flight at once"}
        return brain(body)
    fake.generator = concurrent_brain
    r = cli.run("run", "--json", "--prompt", "fan out")
    assert r.returncode == 0, r.stderr
    answer = json.loads(r.stdout)["answer"]
    assert "4 of 4 tasks succeeded" in answer
    positions = [answer.index("%d. t%d — success" % (i + 1, i)) for i in range(4)]
    assert positions == sorted(positions)
    for i in range(4):
        assert "summary of task %d" % i in answer
    rows = json.loads(cli.run("history", "list", "--json", "--kind", "subagent").stdout)
    assert len(rows) == 4 and {r["parent_id"] for r in rows} == {json.loads(r.stdout)["conversation_id"]}


def test_fail_fast_stops_what_has_not_started(cli, fake):
    cli.use(fake)
    call = tool_call("parallel_subagent", max_concurrent=1, fail_fast=True, tasks=[
        {"label": "bad", "task_prompt": "x", "allowed_tools": ["no_such_tool"]},
        {"label": "later1", "task_prompt": "y"}, {"label": "later2", "task_prompt": "z"}])
    fake.generator = subagent_brain(call)
    r = cli.run("run", "--json", "--prompt", "x")
    answer = json.loads(r.stdout)["answer"]
    assert "0 of 3 tasks succeeded" in answer
    assert "1. bad — failed" in answer and answer.count("not started (fail_fast after a failure)") == 2
    assert child_requests(fake) == []


def test_quota_of_executions_and_tokens(cli, fake):
    cli.use(fake, quota={"max_executions": 1})
    fake.generator = subagent_brain(parallel_call(2, max_concurrent=1))
    r = cli.run("run", "--json", "--prompt", "x")
    answer = json.loads(r.stdout)["answer"]
    assert "1 of 2 tasks succeeded" in answer
    assert "Error: quota exceeded: 1 subagent executions, the agent.quota.max_executions limit" in answer
    cli.use(fake, quota={"max_total_tokens": 50})
    fake.generator = None
    fake.add({"tool_calls": [tool_call("list_directory")], "usage": {"prompt_tokens": 40, "completion_tokens": 20}},
             {"content": "never"})
    r = cli.run("run", "--json", "--prompt", "x")
    assert r.returncode == 1
    data = json.loads(r.stdout)
    assert data["status"] == "quota_exceeded" and "agent.quota.max_total_tokens (50)" in data["error"]


def test_quota_exhausted_inside_a_child_reaches_the_parent_model(cli, fake):
    cli.use(fake, quota={"max_total_tokens": 1000})
    inner = subagent_brain(tool_call("subagent", label="hungry", task_prompt="eat tokens"))

    def brain(body):
        child = "You are a subagent" in body["messages"][1]["content"]
        return dict(inner(body), usage={"prompt_tokens": 900 if child else 50, "completion_tokens": 200 if child else 10})
    fake.generator = brain
    r = cli.run("run", "--json", "--prompt", "x")
    parent_requests = [q for q in fake.model_requests() if "You are a subagent" not in q["body"]["messages"][1]["content"]]
    child_error = [m["content"] for m in parent_requests[-1]["body"]["messages"] if m["role"] == "tool"]
    assert child_error == ["Error: subagent hungry quota_exceeded: quota exceeded: 1,160 tokens used, over "
                           "agent.quota.max_total_tokens (1,000)"]
    assert len(child_requests(fake)) == 1  # the child stopped right after the call that crossed the limit
    data = json.loads(r.stdout)  # the parent's next call pushes the tree further over: the run stops too
    assert r.returncode == 1 and data["status"] == "quota_exceeded" and "max_total_tokens (1,000)" in data["error"]


def test_concurrent_confirmations_are_asked_one_after_the_other(cli, fake):
    (cli.workdir / "a.txt").write_text("old a\n")
    (cli.workdir / "b.txt").write_text("old b\n")
    cli.use(fake)
    writes = {"task a": [tool_call("read_file", path="a.txt"), tool_call("write_file", path="a.txt", content="new a\n")],
              "task b": [tool_call("read_file", path="b.txt"), tool_call("write_file", path="b.txt", content="new b\n")]}
    fake.generator = subagent_brain(tool_call("parallel_subagent", tasks=[
        {"label": "A", "task_prompt": "task a"}, {"label": "B", "task_prompt": "task b"}]),
        child_tools=lambda task: writes[task])
    p = PtyProcess(cli.command("chat", "--mode", "write"), dict(cli.env, TERM="xterm"), str(cli.workdir))
    try:
        p.expect(r"\[WRITE\]\[SAFE\] >> ")
        p.line("update both files")
        first = p.expect(r"Allow write_file\?\s+\[subagent (A|B)\] overwrite")
        p.expect(r"ne\[v\]er this session > ")
        assert p.seen.count("Allow write_file?") == 1, "a second question appeared before the first was answered"
        p.line("y")
        second = p.expect(r"Allow write_file\?\s+\[subagent (A|B)\] overwrite")
        assert {first.group(1), second.group(1)} == {"A", "B"}
        p.expect(r"ne\[v\]er this session > ")
        p.line("y")
        p.expect(r"PARENT SAW")
        p.expect(r"\[WRITE\]\[SAFE\] >> ")
    finally:
        p.close()
    written = ((cli.workdir / "a.txt").read_text(), (cli.workdir / "b.txt").read_text())
    results = [m["content"] for q in child_requests(fake) for m in q["body"]["messages"] if m["role"] == "tool"]
    assert written == ("new a\n", "new b\n"), (results, p.seen[-4000:])


def test_ctrl_c_stops_the_pool(cli, fake):
    cli.use(fake)
    sleeps = lambda task: [tool_call("terminal", command="echo $$ >> pgids; sleep 60")]
    fake.generator = subagent_brain(parallel_call(3), child_tools=sleeps)
    proc = cli.popen("run", "--allow-dangerous", "--json", "--prompt", "x")
    try:
        pgids = cli.workdir / "pgids"
        assert wait_for(lambda: pgids.exists() and len(pgids.read_text().split()) == 3)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert time.monotonic() - started < 5
    assert proc.returncode == 130 and json.loads(out)["status"] == "interrupted"
    from test_terminal import group_gone
    assert all(group_gone(int(p)) for p in pgids.read_text().split())
    rows = json.loads(cli.run("history", "list", "--json", "--kind", "subagent").stdout)
    assert len(rows) == 3 and {r["status"] for r in rows} == {"interrupted"}


def test_metrics_textfile_is_parsed_by_prometheus(cli, fake, tmp_path):
    from prometheus_client.parser import text_string_to_metric_families
    cli.use(fake)
    fake.generator = subagent_brain(parallel_call(2))
    path = tmp_path / "xzatoma.prom"
    r = cli.run("run", "--metrics-textfile", path, "--prompt", "x")
    assert r.returncode == 0, r.stderr
    samples = {}
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    assert samples[("xzatoma_subagent_executions_total", (("depth", "1"),))] == 2
    assert samples[("xzatoma_subagent_completions_total", (("status", "completed"),))] == 2
    assert samples[("xzatoma_runs_total", (("status", "completed"),))] == 1
    assert samples[("xzatoma_tool_calls_total", (("outcome", "ok"), ("tool", "parallel_subagent")))] == 1
    assert samples[("xzatoma_subagent_active_count", ())] == 0
    assert samples[("xzatoma_subagent_turns_used_count", (("depth", "1"),))] == 2
    assert samples[("xzatoma_subagent_turns_used_sum", (("depth", "1"),))] == 4
    assert samples[("xzatoma_model_requests_total", (("provider", "ollama"), ("status", "ok")))] == 2 + 2 * 2


def test_metrics_are_served_while_chatting(cli, fake):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cli.use(fake)
    fake.add({"content": "hello"})
    proc = subprocess.Popen(cli.command("chat", "--metrics-port", port), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=cli.env, cwd=str(cli.workdir), text=True)
    try:
        proc.stdin.write("hi\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "hello\n"
        def scrape():  # the answer may print a moment before its counter moves: scrape as Prometheus would
            return urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read().decode()
        assert wait_for(lambda: 'xzatoma_model_requests_total{provider="ollama",status="ok"} 1.0' in scrape())
        assert 'xzatoma_model_requests_total{provider="ollama",status="error"}' not in scrape()
        proc.stdin.close()
        assert proc.wait(20) == 0
    finally:
        proc.kill()


def test_metrics_without_prometheus_client(cli, fake, tmp_path):
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "prometheus_client.py").write_text("raise ImportError('not installed')\n")
    cli.use(fake)
    fake.add({"content": "fine"})
    env = {"PYTHONPATH": str(shadow)}
    r = cli.run("run", "--prompt", "x", env=env)
    assert r.returncode == 0 and r.stdout == "fine\n"
    r = cli.run("run", "--metrics-textfile", tmp_path / "m.prom", "--prompt", "x", env=env)
    assert r.returncode == 2 and "pip install 'xzatoma[metrics]'" in r.stderr


def test_lines_from_other_threads_wait_until_the_question_is_answered():
    import io
    from xzatoma import Console
    err = io.StringIO()
    console = Console(err=err, color=False)
    written = threading.Event()
    with console.hold():
        console._write("Allow write_file?")
        worker = threading.Thread(target=lambda: (console.info("  [A] completed"), written.set()))
        worker.start()
        assert written.wait(5), "a held line must not block the thread that wrote it"
        console._write("answer > y")
        assert err.getvalue() == "Allow write_file?\nanswer > y\n"
    worker.join()
    assert err.getvalue() == "Allow write_file?\nanswer > y\n  [A] completed\n"
    console.info("after")
    assert err.getvalue().endswith("completed\nafter\n")


def test_spinner_line_is_wiped_before_other_lines_and_never_drawn_over_a_question():
    import io
    from xzatoma import Console
    err = io.StringIO()
    console = Console(err=err, color=False)
    console.status("⠋ parallel_subagent 1s")
    console.info("  [A] completed")
    assert err.getvalue() == "\r⠋ parallel_subagent 1s\033[K\r\033[K  [A] completed\n"
    with console.hold():
        console.status("⠙ parallel_subagent 2s")
    console.clear_status()  # nothing on screen: nothing to wipe
    assert err.getvalue().endswith("  [A] completed\n")
