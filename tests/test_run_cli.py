"""`xzatoma run` end to end: the real CLI as a subprocess against the fake model server."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import SPINNER, person_messages, pty, said, tool_call, wait_for

PROVIDERS = [("ollama", "chat"), ("openai", "chat"), ("openai", "responses"), ("copilot", "chat")]


def paired(messages_or_items, fmt):
    """Every tool result follows the call that asked for it; every call gets exactly one result."""
    if fmt == "responses":
        calls = [i["call_id"] for i in messages_or_items if i.get("type") == "function_call"]
        outs = [i["call_id"] for i in messages_or_items if i.get("type") == "function_call_output"]
        assert sorted(calls) == sorted(outs), (calls, outs)
        seen = set()
        for item in messages_or_items:
            if item.get("type") == "function_call":
                seen.add(item["call_id"])
            if item.get("type") == "function_call_output":
                assert item["call_id"] in seen
        return
    pending = []
    for m in messages_or_items:
        if m["role"] == "assistant" and m.get("tool_calls"):
            assert not pending, "a new call before earlier results: %s" % pending
            pending = [c.get("id", c["function"]["name"]) for c in m["tool_calls"]]
        elif m["role"] == "tool":
            key = m.get("tool_call_id") or m.get("tool_name")
            assert key in pending, "orphan tool result %s" % key
            pending.remove(key)
        else:
            assert not pending, "tool calls left unanswered: %s" % pending
    assert not pending


@pytest.mark.parametrize("provider,api", PROVIDERS)
def test_multi_step_tool_run_on_each_provider(cli, fake, provider, api):
    (cli.workdir / "notes.txt").write_text("alpha\nbeta\ngamma\n")
    cli.use(fake, provider=provider, api=api)
    fake.add({"tool_calls": [tool_call("list_directory", path=".")]},
             {"tool_calls": [tool_call("read_file", path="notes.txt", start_line=2)]},
             {"content": "notes.txt has 3 lines.\nThe last two are beta and gamma."})
    r = cli.run("run", "--prompt", "How many lines does notes.txt have?")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "notes.txt has 3 lines.\nThe last two are beta and gamma.\n"
    assert "▶ list_directory ." in r.stderr and "▶ read_file notes.txt" in r.stderr
    assert "completed: 3 turns · 2 tool calls" in r.stderr
    calls = fake.model_requests()
    assert len(calls) == 3
    last = calls[-1]["body"]
    if provider == "ollama":
        msgs = last["messages"]
        assert [m["role"] for m in msgs] == ["system", "user", "user", "assistant", "tool", "assistant", "tool"]
        assert "<cwd>%s</cwd>" % os.path.realpath(str(cli.workdir)) in msgs[1]["content"]
        assert msgs[4]["tool_name"] == "list_directory" and "notes.txt" in msgs[4]["content"]
        assert msgs[6]["content"] == "beta\ngamma\n"
        assert msgs[5]["tool_calls"][0]["function"]["arguments"] == {"path": "notes.txt", "start_line": 2}
        assert last["options"]["num_ctx"] >= 8192 and last["stream"] is True
        offered = {t["function"]["name"] for t in last["tools"]}  # a question: the tools that read
        assert offered >= {"read_file", "grep"} and "write_file" not in offered
    elif "messages" in last:
        msgs = last["messages"]
        paired(msgs, "chat")
        assert msgs[-1]["content"] == "beta\ngamma\n"
        assert json.loads(msgs[-2]["tool_calls"][0]["function"]["arguments"]) == {"path": "notes.txt",
                                                                                 "start_line": 2}
    else:
        items = last["input"]
        paired(items, "responses")
        assert items[-1] == {"type": "function_call_output", "call_id": items[-2]["call_id"],
                             "output": "beta\ngamma\n"}
        assert "Working directory" not in last["instructions"]  # what varies comes after it: prompt caches hold
        assert items[0]["role"] == "user" and "<cwd>" in items[0]["content"]
        assert all(t["type"] == "function" and "name" in t for t in last["tools"])
    if provider == "copilot":
        headers = calls[0]["headers"]
        assert headers["authorization"] == "Bearer tid=fake-copilot-token"
        assert headers["copilot-integration-id"] == "vscode-chat" and "editor-version" in headers
        assert calls[0]["path"] == "/responses"  # the codex default is served only by /responses
        assert headers["x-initiator"] == "user" and calls[1]["headers"]["x-initiator"] == "agent"


def test_copilot_chat_model_uses_chat_completions(cli, fake):
    cli.use(fake, provider="copilot", model="gpt-4.1")
    fake.add({"content": "hi"})
    r = cli.run("run", "--prompt", "hello")
    assert r.returncode == 0, r.stderr
    assert fake.model_requests()[0]["path"] == "/chat/completions"


def test_stdout_is_only_the_answer_and_wc_counts_its_lines(cli, fake):
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("list_directory")]}, {"content": "one\ntwo\nthree"})
    cmd = " ".join(map(repr, cli.command("run", "--prompt", "x"))) + " | wc -l"
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True, env=cli.env, cwd=str(cli.workdir))
    assert r.stdout.strip() == "3"
    assert "▶ list_directory" in r.stderr


def test_json_output_is_one_object(cli, fake):
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("list_directory")], "usage": {"prompt_tokens": 100, "completion_tokens": 20}},
             {"content": "done", "usage": {"prompt_tokens": 7, "completion_tokens": 3}})
    r = cli.run("run", "--json", "--prompt", "x")
    assert r.returncode == 0
    data = json.loads(r.stdout)
    assert r.stdout.count("\n") == 1
    assert data["status"] == "completed" and data["answer"] == "done" and data["error"] is None
    assert data["turns"] == 2 and data["tool_calls"] == 1
    assert data["usage"]["prompt_tokens"] == 107 and data["usage"]["total_tokens"] == 107 + 23
    assert len(data["conversation_id"]) == 26 and data["conversation_id"] in r.stderr
    assert data["duration_seconds"] >= 0


def test_quiet_keeps_only_errors(cli, fake):
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("list_directory")]}, {"content": "ok"})
    r = cli.run("--quiet", "run", "--prompt", "x")
    assert r.returncode == 0 and r.stdout == "ok\n" and r.stderr == ""
    fake.add({"status": 400, "body": '{"error": {"message": "bad request"}}'})
    r = cli.run("run", "-q", "--prompt", "x")
    assert r.returncode == 1 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1


def test_prompt_from_stdin(cli, fake):
    cli.use(fake)
    fake.add({"content": "a"}, {"content": "b"})
    assert cli.run("run", input="piped task\n").stdout == "a\n"
    assert fake.model_requests()[0]["body"]["messages"][2]["content"] == "piped task"
    assert cli.run("run", "--prompt", "-", input="dash task").stdout == "b\n"
    assert fake.model_requests()[1]["body"]["messages"][2]["content"] == "dash task"


def test_no_instruction_is_a_usage_error(cli, fake):
    cli.use(fake)
    r = subprocess.run(cli.command("run"), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       env=cli.env, cwd=str(cli.workdir))
    assert r.returncode == 2 and "empty" in r.stderr and "Traceback" not in r.stderr
    assert fake.model_requests() == []


def test_plan_becomes_the_prompt(cli, fake):
    cli.use(fake)
    (cli.workdir / "task.yaml").write_text(
        "goal: Generate API documentation\ncontext:\n  directory: src/api/\ninstructions:\n"
        "  - List all API endpoint files\n  - Extract function signatures\n  - Create OpenAPI spec\n")
    fake.add({"content": "planned"})
    r = cli.run("run", "--plan", "task.yaml")
    # a plan to list files and write a spec, answered twice without a tool: printed, but not "completed"
    assert r.returncode == 3 and r.stdout == "planned\n" and "status unverified" in r.stderr
    prompt = fake.model_requests()[0]["body"]["messages"][2]["content"]
    assert prompt == ("You are assisting with the following task:\n\nGOAL: Generate API documentation\n\n"
                      "CONTEXT:\n- Directory: src/api/\n\nINSTRUCTIONS (follow as guidance):\n"
                      "1. List all API endpoint files\n2. Extract function signatures\n3. Create OpenAPI spec\n\n"
                      "Use the available tools to accomplish this goal. You may adapt your approach as needed, "
                      "but try to follow the instructions provided.")


def test_plan_from_stdin_detects_format(cli, fake):
    cli.use(fake)
    fake.add({"content": "ok"})
    r = cli.run("run", "--plan", "-", input='{"goal": "G", "instructions": ["a", "b"]}')
    assert r.returncode == 0
    assert "GOAL: G" in fake.model_requests()[0]["body"]["messages"][2]["content"]


@pytest.mark.parametrize("name,text,expected", [
    ("bad.yaml", "goal: x\ninstructions:\n  - a\n  - [unclosed\n", "bad.yaml:5: invalid YAML"),
    ("bad.json", '{"goal": "x",\n "instructions": [1,,2]}', "bad.json:2: invalid JSON"),
    ("nogoal.yaml", "instructions: [a]\n", "missing required key 'goal'"),
    ("nosteps.md", "# Task: T\n\n## Goal\n\nDo it\n", "no instructions found"),
    # the line of what is wrong, from the parser's marks: the empty step's own line, and the top-level goal's,
    # not a `goal:` nested under `context:` (round 18c)
    ("step.yaml", "goal: tidy\ninstructions:\n  - list\n  - count\n  - write\n  - ''\n",
     "step.yaml:6: step 4 of 'instructions' is empty"),
    ("nested.yaml", "context:\n  goal: the team's goal\ngoal: 5\ninstructions: [a]\n",
     "nested.yaml:3: 'goal' must be text"),
])
def test_bad_plan_fails_before_any_model_call(cli, fake, name, text, expected):
    cli.use(fake)
    (cli.workdir / name).write_text(text)
    r = cli.run("run", "--plan", name)
    assert r.returncode == 2
    assert expected in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""
    assert fake.requests == []


def test_missing_plan_file(cli, fake):
    cli.use(fake)
    r = cli.run("run", "--plan", "nope.yaml")
    assert r.returncode == 2 and "plan file not found: nope.yaml" in r.stderr


def test_a_plan_or_task_without_end_is_refused_not_read_to_the_end(cli, fake):
    """`--plan /dev/zero` (or a FIFO, or a log piped in by mistake) was read until memory ran out (attack round
    16a): read to a bound, then refused as a usage error."""
    cli.use(fake)
    for args, what in ((["run", "--plan", "/dev/zero"], "plan file /dev/zero is larger than 33,554,432 characters"),
                       (["run", "--plan", "-"], "the plan on stdin is larger than"),
                       (["run"], "the task on stdin is larger than"),
                       (["chat"], "a line on standard input is longer than 33,554,432 characters")):
        with open("/dev/zero", "rb") as zero:
            r = cli.run(*args, stdin=zero)
        assert (r.returncode, r.stdout) == (2, ""), r.stderr
        assert what in r.stderr and len(r.stderr.strip().splitlines()) == 1
    lines = cli.workdir / "lines.txt"  # a message of lines that each end in a backslash: bounded as a whole (16c)
    lines.write_text(("x" * (1 << 20) + "\\\n") * 33)
    with open(lines, "rb") as fh:
        r = cli.run("chat", stdin=fh)
    assert (r.returncode, r.stdout) == (2, "") and "a message on standard input is longer than" in r.stderr
    assert fake.requests == []


def test_copilot_without_token_exits_2(cli, fake):
    cli.use(fake, provider="copilot")
    r = cli.run("run", "--prompt", "x", env={"COPILOT_API_TOKEN": ""})
    assert r.returncode == 2
    assert "xzatoma auth login" in r.stderr and "COPILOT_API_TOKEN" in r.stderr
    assert fake.requests == []


def test_malformed_tool_arguments_go_back_to_the_model(cli, fake):
    (cli.workdir / "a.txt").write_text("A\n")
    cli.use(fake)
    fake.add({"tool_calls": [{"name": "read_file", "arguments": '{"path": "a.txt"'}]},
             {"tool_calls": [tool_call("read_file")]},
             {"tool_calls": [tool_call("read_file", path="a.txt")]},
             {"tool_calls": [tool_call("no_such_tool", x=1)]},
             {"content": "recovered"})
    r = cli.run("run", "--provider", "openai", "--prompt", "x")
    assert r.returncode == 0 and r.stdout == "recovered\n", r.stderr
    results = [m["content"] for m in fake.model_requests()[-1]["body"]["messages"] if m["role"] == "tool"]
    assert results[0].startswith("Error: invalid JSON in arguments for read_file")
    assert results[1] == ("Error: missing required parameter for read_file: path; expected "
                          "read_file(path: string, start_line?: integer, end_line?: integer)")
    assert results[2] == "A\n"
    assert results[3].startswith("Error: unknown tool 'no_such_tool'; available tools:")


def test_three_consecutive_malformed_calls_stop_the_run(cli, fake):
    cli.use(fake)
    fake.add(*[{"tool_calls": [{"name": "read_file", "arguments": "{nope"}]}] * 3)
    r = cli.run("run", "--json", "--prompt", "x")
    assert r.returncode == 1
    data = json.loads(r.stdout)
    assert data["status"] == "failed" and "3 malformed or invalid tool calls in a row" in data["error"]
    assert len(fake.model_requests()) == 3


def test_tool_call_printed_as_text_is_executed(cli, fake):
    (cli.workdir / "a.txt").write_text("from file\n")
    cli.use(fake)
    fake.add({"content": '```json\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n```'},
             {"content": '<tool_call>{"name": "list_directory", "arguments": {}}</tool_call>'},
             {"content": "final"})
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 0 and r.stdout == "final\n", r.stderr
    msgs = fake.model_requests()[-1]["body"]["messages"]
    tools = [m for m in msgs if m["role"] == "tool"]
    assert tools[0]["content"] == "from file\n" and "a.txt" in tools[1]["content"]
    assert msgs[3]["tool_calls"][0]["function"]["name"] == "read_file" and msgs[3]["content"] == ""


def test_think_blocks_are_stripped_and_shown_only_with_verbose(cli, fake):
    cli.use(fake)
    fake.add({"content": "<think>secret plan</think>The answer."}, {"content": "<think>again</think>Two."})
    r = cli.run("run", "--prompt", "x")
    assert r.stdout == "The answer.\n" and "secret plan" not in r.stderr
    r = cli.run("run", "--verbose", "--prompt", "x")
    assert r.stdout == "Two.\n" and "again" in r.stderr


def test_max_turns_exits_1(cli, fake):
    cli.use(fake)
    fake.add(*[{"tool_calls": [tool_call("list_directory")]}] * 5)
    r = cli.run("run", "--max-turns", "3", "--json", "--prompt", "x")
    assert r.returncode == 1
    data = json.loads(r.stdout)
    assert data["status"] == "max_turns" and data["turns"] == 3
    assert "--max-turns" in data["error"] and "error: stopped after 3 turns" in r.stderr
    assert len(fake.model_requests()) == 3


def test_max_turns_from_environment(cli, fake):
    cli.use(fake)
    fake.add(*[{"tool_calls": [tool_call("list_directory")]}] * 3)
    r = cli.run("run", "--prompt", "x", env={"XZATOMA_MAX_TURNS": "2"})
    assert r.returncode == 1 and len(fake.model_requests()) == 2


def test_timeout_exits_1(cli, fake):
    cli.use(fake)
    fake.add({"hang": 30})
    started = time.monotonic()
    r = cli.run("run", "--timeout", "1", "--json", "--prompt", "x")
    assert time.monotonic() - started < 15
    assert r.returncode == 1
    assert json.loads(r.stdout)["status"] == "timeout"


@pytest.mark.parametrize("provider", ["openai", "ollama"])
def test_timeout_holds_while_a_server_streams_keep_alives(cli, fake, provider):
    """A proxy's `: keep-alive` comments (or Ollama's slow pieces) every 0.2 s: no single read times out."""
    cli.use(fake, provider=provider)
    fake.add({"keepalive": (300, 0.2), "content": "late " * 200, "chunk_delay": 0.2})
    started = time.monotonic()
    r = cli.run("run", "--timeout", "3", "--json", "--prompt", "x", timeout=120)
    assert time.monotonic() - started < 30  # before: the stream ran its 60+ s and the answer came late
    assert r.returncode == 1, r.stderr
    assert json.loads(r.stdout)["status"] == "timeout"


def test_retries_then_success(cli, fake):
    cli.use(fake)
    fake.add({"status": 500}, {"status": 429, "headers": {"Retry-After": "0"}}, {"content": "third time"})
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 0 and r.stdout == "third time\n"
    assert r.stderr.count("retrying in") == 2
    assert len(fake.model_requests()) == 3


def test_malformed_stream_is_retried(cli, fake):
    cli.use(fake)
    fake.add({"content": "partial", "malformed": True}, {"content": "clean"})
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 0 and r.stdout == "clean\n"
    assert "malformed stream line" in r.stderr


def test_retries_exhausted_exit_1_with_clear_message(cli, fake):
    cli.use(fake)
    fake.add(*[{"status": 503, "body": '{"error": "overloaded"}'}] * 3)
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 1 and r.stdout == ""
    last = r.stderr.strip().splitlines()
    assert any("returned HTTP 503: overloaded (gave up after 3 attempts)" in line for line in last)
    assert "Traceback" not in r.stderr


def test_connection_refused_names_the_ollama_host(cli):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cli.write_config({"provider": {"type": "ollama", "max_retries": 1, "retry_backoff_seconds": 0.01}})
    r = cli.run("run", "--prompt", "x", env={"OLLAMA_HOST": "127.0.0.1:%d" % port})
    assert r.returncode == 1
    assert "cannot connect to Ollama at http://127.0.0.1:%d (connection refused)" % port in r.stderr
    assert "ollama serve" in r.stderr


def test_unauthorized_says_how_to_fix(cli, fake):
    cli.use(fake, provider="openai")
    fake.add({"status": 401, "body": '{"error": {"message": "Incorrect API key provided"}}'})
    r = cli.run("run", "--prompt", "x", env={"OPENAI_API_KEY": "sk-test-1234567890"})
    assert r.returncode == 2
    assert "rejected the credentials (HTTP 401" in r.stderr and "set OPENAI_API_KEY" in r.stderr
    assert "sk-test-1234567890" not in r.stderr
    assert fake.model_requests()[0]["headers"]["authorization"] == "Bearer sk-test-1234567890"


def test_model_not_found_lists_available_models(cli, fake):
    fake.strict_models = True
    cli.use(fake, model="nope:7b")
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 2
    assert "model 'nope:7b' not found" in r.stderr and "llama3.2:3b" in r.stderr and "ollama pull" in r.stderr
    cli.use(fake, provider="openai", model="nope")
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 2 and "available: " in r.stderr and "gpt-test" in r.stderr


def test_truncated_answer_is_not_a_success(cli, fake):
    cli.use(fake)
    fake.add({"content": "half an ans", "finish": "length"})
    r = cli.run("run", "--json", "--prompt", "x")
    assert r.returncode == 1
    data = json.loads(r.stdout)
    assert data["status"] == "failed" and "cut off" in data["error"] and data["answer"] == "half an ans"


def test_ollama_num_ctx_is_bounded_by_the_model_window(cli, fake):
    fake.models["tiny"] = {"context_length": 4096}
    cli.use(fake, model="tiny")
    fake.add({"content": "ok"})
    assert cli.run("run", "--prompt", "x").returncode == 0
    assert fake.model_requests()[0]["body"]["options"]["num_ctx"] == 4096


def test_pruning_keeps_tool_calls_paired(cli, fake):
    (cli.workdir / "big.txt").write_text(("x" * 79 + "\n") * 25)  # 2 KB per read
    cli.use(fake, provider="openai", conversation={"max_tokens": 2000, "min_retain_turns": 2,
                                                    "prune_threshold": 0.8})
    fake.add(*[{"tool_calls": [tool_call("read_file", path="big.txt"), tool_call("list_directory")],
                "usage": {"prompt_tokens": 0, "completion_tokens": 5}}] * 12)
    fake.add({"content": "finished"})
    r = cli.run("run", "--prompt", "read big.txt many times")
    assert r.returncode == 0, r.stderr
    requests = fake.model_requests()
    pruned = [q for q in requests if any("[CONTEXT PRUNED" in (m.get("content") or "")
                                         for m in q["body"]["messages"])]
    assert pruned, "pruning never happened"
    for q in requests:
        msgs = q["body"]["messages"]
        paired(msgs, "chat")
        assert msgs[0]["role"] == "system" and msgs[2] == {"role": "user", "content": "read big.txt many times"}
        assert sum("[CONTEXT PRUNED" in (m.get("content") or "") for m in msgs) <= 1
    assert "read_file ×" in [m for m in requests[-1]["body"]["messages"] if m["role"] == "system"][1]["content"]
    assert len(requests[-1]["body"]["messages"]) < 2 + 12 * 3


def test_planning_mode_offers_read_only_tools(cli, fake):
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("write_file", path="x.txt", content="no")]}, {"content": "ok"})
    r = cli.run("run", "--mode", "planning", "--prompt", "x")
    assert r.returncode == 0
    offered = {t["function"]["name"] for t in fake.model_requests()[0]["body"]["tools"]}
    assert "write_file" not in offered and "read_file" in offered
    result = [m for m in fake.model_requests()[1]["body"]["messages"] if m["role"] == "tool"][0]
    assert result["content"] == "Error: tool write_file is not available in planning mode"
    assert not (cli.workdir / "x.txt").exists()


def test_working_dir_is_the_jail(cli, fake, tmp_path):
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "inside.txt").write_text("in\n")
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("read_file", path="inside.txt"), tool_call("read_file", path="../work")]},
             {"content": "ok"})
    r = cli.run("run", "--working-dir", other, "--prompt", "x")
    assert r.returncode == 0
    results = [m["content"] for m in fake.model_requests()[1]["body"]["messages"] if m["role"] == "tool"]
    assert results == ["in\n", "Error: path outside working directory: ../work"]
    r = cli.run("run", "--working-dir", tmp_path / "missing", "--prompt", "x")
    assert r.returncode == 2 and "working directory does not exist" in r.stderr


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_signals_end_the_run_cleanly(cli, fake, sig, code):
    """SIGHUP (the ssh session closed) kept its default action: no record of the end, the temp directory left
    (round 18c)."""
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("list_directory")]}, {"hang": 30})
    proc = cli.popen("run", "--json", "--prompt", "x")
    try:
        assert wait_for(lambda: len(fake.model_requests()) == 2), "the second model call never arrived"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    data = json.loads(out)
    assert data["status"] == "interrupted" and data["turns"] == 1 and data["tool_calls"] == 1
    assert "Traceback" not in err


def test_help_and_version_need_no_third_party_packages(cli):
    for args in (["-S", cli.command()[1], "--help"], ["-S", cli.command()[1], "run", "--help"]):
        r = subprocess.run([sys.executable] + args, capture_output=True, text=True, env=cli.env)
        assert r.returncode == 0 and "exit codes:" in r.stdout
    r = subprocess.run([sys.executable, "-S", cli.command()[1], "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("xzatoma ")


def test_a_run_needs_only_the_standard_library_and_a_missing_package_is_named(cli, fake):
    fake.add({"content": "stdlib only"})
    without_site = [sys.executable, "-S", cli.command()[1], "run", "--provider", "ollama", "x"]
    r = subprocess.run(without_site, capture_output=True, text=True, env=dict(cli.env, OLLAMA_HOST=fake.url),
                       cwd=str(cli.workdir))
    assert r.returncode == 0 and r.stdout == "stdlib only\n", r.stderr  # HTTP is the standard library's
    cli.use(fake)  # a configuration file needs PyYAML
    r = subprocess.run(without_site, capture_output=True, text=True, env=cli.env, cwd=str(cli.workdir))
    assert r.returncode == 2
    assert "needs the Python package 'pyyaml'" in r.stderr and "pip install pyyaml" in r.stderr


def test_global_flags_work_after_the_subcommand(cli, fake):
    cli.use(fake, provider="copilot")
    fake.add({"content": "via openai"})
    r = cli.run("run", "--prompt", "x", "--provider", "openai", "--model", "gpt-test")
    assert r.returncode == 0 and r.stdout == "via openai\n"
    assert fake.model_requests()[0]["path"] == "/v1/chat/completions"


def test_bad_flag_is_usage_error(cli):
    r = cli.run("run", "--max-turns", "many")
    assert r.returncode == 2 and "invalid int value" in r.stderr
    r = cli.run("run", "--prompt", "x", "--max-turns", "0")
    assert r.returncode == 2 and "agent.max_turns must be at least 1" in r.stderr


def test_installed_console_script_matches_the_file(cli):
    import shutil
    exe = shutil.which("xzatoma")
    if exe is None:
        pytest.skip("xzatoma is not installed in this environment")
    a = subprocess.run([exe, "--help"], capture_output=True, text=True, env=cli.env)
    b = cli.run("--help")
    assert a.returncode == b.returncode == 0 and a.stdout == b.stdout


# ---- one connection for a whole run; hosts that cannot be reached; proxies ----


ONE_CONNECTION_PROVIDERS = [("ollama", "chat"), ("openai", "chat"), ("openai", "responses")]


@pytest.mark.parametrize("provider,api", ONE_CONNECTION_PROVIDERS)
def test_a_ten_turn_run_uses_one_connection(cli, fake, provider, api):
    for i in range(9):
        (cli.workdir / ("notes%d.txt" % i)).write_text("alpha %d\n" % i)
    cli.use(fake, provider=provider, api=api)
    fake.add(*[{"tool_calls": [tool_call("read_file", path="notes%d.txt" % i)]} for i in range(9)],
             {"content": "read all nine"})
    r = cli.run("run", "read the nine notes files")
    assert r.returncode == 0 and r.stdout == "read all nine\n", r.stderr
    assert len(fake.model_requests()) == 10
    assert fake.connections == 1  # every stream read to its end, so the connection served all ten turns


def test_a_connection_the_server_closed_is_replaced(cli, fake):
    """A server that closes idle connections (a keep-alive timeout) costs a new connection, not a failed turn."""
    (cli.workdir / "notes.txt").write_text("alpha\n")
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("read_file", path="notes.txt")]}, {"content": "done"})
    fake.close_after_each = True
    r = cli.run("run", "read notes.txt")
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr
    assert fake.connections == len(fake.requests) >= 2 and "retrying" not in r.stderr


def test_an_unresolvable_host_fails_at_once_with_one_line(monkeypatch, tmp_path):
    import xzatoma
    asked = []

    def no_such_name(host, *args, **kwargs):
        asked.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    monkeypatch.setattr(socket, "getaddrinfo", no_such_name)
    cfg = xzatoma.load_config({"provider.type": "openai"}, env={
        "XZATOMA_HOME": str(tmp_path), "HOME": str(tmp_path), "OPENAI_BASE_URL": "http://model-box.invalid:8080/v1",
        "OPENAI_API_KEY": "sk-test-0123456789abcdef"}, config_path=None)
    provider = xzatoma.make_provider(cfg, xzatoma.Console(quiet=True))
    started = time.monotonic()
    with pytest.raises(xzatoma.ProviderError) as caught:
        provider.complete([{"role": "user", "content": "hi"}], [])
    assert time.monotonic() - started < 1.0 and asked == ["model-box.invalid"]  # one attempt, no backoff
    message = str(caught.value)
    assert "\n" not in message and "host not found" in message and "OPENAI_BASE_URL" in message
    assert "gave up" not in message and not caught.value.retryable
    # asked again at once (a run's window probe, then its first call): answered from memory, not looked up
    assert not provider.is_local()
    with pytest.raises(xzatoma.ProviderError):
        provider.complete([{"role": "user", "content": "hi"}], [])
    assert asked == ["model-box.invalid"]
    # but not for ever (a watcher runs for days; the network comes back)
    failure, when = provider.session._unresolved["model-box.invalid"]
    provider.session._unresolved["model-box.invalid"] = (failure, when - xzatoma.UNRESOLVED_SECONDS)
    with pytest.raises(xzatoma.ProviderError):
        provider.complete([{"role": "user", "content": "hi"}], [])
    assert asked == ["model-box.invalid"] * 2


def test_a_run_against_an_unresolvable_host_fails_at_once_with_one_line(cli, tmp_path):
    """The CLI as a person meets it: a mistyped host name. Name look-ups for *.invalid fail here as they do on
    a real resolver (EAI_NONAME), in the run's own process: nothing leaves the machine."""
    import time as clock
    site = tmp_path / "site"
    site.mkdir()
    asked = tmp_path / "asked.txt"
    (site / "sitecustomize.py").write_text(
        "import socket\n"
        "_real = socket.getaddrinfo\n"
        "def getaddrinfo(host, *args, **kwargs):\n"
        "    if str(host).endswith('.invalid'):\n"
        "        with open(%r, 'a') as fh:\n"
        "            fh.write(str(host) + '\\n')\n"
        "        raise socket.gaierror(socket.EAI_NONAME, 'Name or service not known')\n"
        "    return _real(host, *args, **kwargs)\n"
        "socket.getaddrinfo = getaddrinfo\n" % str(asked))
    env = {"PYTHONPATH": str(site), "XZATOMA_PROVIDER": "ollama", "OLLAMA_HOST": "http://model-box.invalid:11434"}
    started = clock.monotonic()
    r = cli.run("run", "hi", env=env)  # the default retries (3 attempts, seconds apart) apply
    took = clock.monotonic() - started
    assert r.returncode == 1 and r.stdout == "", r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "host not found" in errors[0] and "OLLAMA_HOST" in errors[0], r.stderr
    assert "Traceback" not in r.stderr and "retrying" not in r.stderr
    assert asked.read_text().splitlines() == ["model-box.invalid"]  # one look-up: no retry
    assert took < 10, took  # not the backoff of three attempts


def test_proxies_from_the_environment(cli, fake):
    """A plain-HTTP proxy gets the absolute URL; loopback and no_proxy hosts are reached directly."""
    import xzatoma
    assert xzatoma._bypass_proxy("127.0.0.1", 80, "") and xzatoma._bypass_proxy("localhost", 80, "")
    assert xzatoma._bypass_proxy("api.example.com", 443, "example.com")
    assert xzatoma._bypass_proxy("api.example.com", 443, ".example.com,other")
    assert not xzatoma._bypass_proxy("example.org", 443, "example.com")
    assert xzatoma._bypass_proxy("10.1.2.3", 443, "10.0.0.0/8") and not xzatoma._bypass_proxy("11.1.2.3", 443, "10.0.0.0/8")
    assert xzatoma._bypass_proxy("gpu", 8080, "gpu:8080") and not xzatoma._bypass_proxy("gpu", 11434, "gpu:8080")
    assert xzatoma._bypass_proxy("anything", 1, "*")
    session = xzatoma.HttpSession({"proxies": {"http": "http://u:p%%40ss@127.0.0.1:%d" % fake.port}})
    resp = session.request("GET", "http://models.internal:11434/api/tags")
    assert resp.status_code == 404  # the fake, as a proxy, was asked for the whole URL
    seen = fake.requests[-1]
    assert seen["path"] == "http://models.internal:11434/api/tags"
    assert seen["headers"]["proxy-authorization"] == "Basic dTpwQHNz"  # u:p@ss


# ---- on a terminal: the answer streams, interim words dimmed, failures marked ----


def test_run_streams_its_answer_on_a_terminal_and_prints_it_whole_when_piped(cli, fake):
    cli.use(fake)
    answer = "The first half arrives now, and the second half arrives a while later."
    fake.add({"content": answer, "chunk_delay": 0.15})
    p = pty(cli, "run", "tell me")
    try:
        p.expect("The first half")
        assert p.proc.poll() is None and "a while later" not in p.seen  # shown before the reply is complete
        p.expect("a while later")
        assert p.wait() == 0
        assert p.seen.count("The first half") == 1  # streamed, not printed again at the end
    finally:
        p.close()
    fake.add({"content": "Let me look.", "tool_calls": [tool_call("list_directory")]}, {"content": answer})
    r = cli.run("run", "tell me")  # piped: the answer alone, byte for byte; the interim words are progress
    assert r.returncode == 0 and r.stdout == answer + "\n"
    assert "Let me look." in r.stderr and "\x1b" not in r.stderr + r.stdout


def test_interim_words_are_dimmed_and_failing_commands_marked(cli, fake):
    cli.use(fake)
    (cli.workdir / "lines.txt").write_text("".join("%d\n" % i for i in range(1, 21)))
    command = "cat lines.txt nothere"  # 20 lines of output, then a failure
    fake.add({"content": "Let me list the files first.", "tool_calls": [tool_call("terminal", command=command)]},
             {"content": "There is nothing called nothere."})
    p = pty(cli, "run", "-v", "is nothere here?", color=True)
    try:
        assert p.wait() == 0
    finally:
        p.close()
    seen = p.seen
    # streamed as it came, then (the reply asked for a tool) rewritten in place, dimmed
    assert "Let me list the files first.\r\n\x1b[1A\r\x1b[J\x1b[2mLet me list the files first.\x1b[0m" in seen
    assert re.search(r"\x1b\[33m  ✗ exit 1 · [\d.]+s: cat: nothere: No such file or directory", seen), seen
    assert "✓" not in seen
    # --verbose: the last lines of its output (the last 8 of 21), and how many came before them
    detail = re.findall(r"    │ ([^\r\x1b]*)", seen)
    assert detail == ["… 13 lines above", "14", "15", "16", "17", "18", "19", "20",
                      "cat: nothere: No such file or directory"], detail
    assert "There is nothing called nothere.\r\n" in seen
    # without --verbose: the mark and the exit code, no output lines; a command that succeeds is a ✓
    fake.add({"tool_calls": [tool_call("terminal", command=command)]},
             {"tool_calls": [tool_call("terminal", command="head -3 lines.txt")]}, {"content": "done"})
    r = cli.run("run", "count")
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr
    assert re.search(r"^  ✗ exit 1 · [\d.]+s: cat: nothere: No such file or directory$", r.stderr, re.M), r.stderr
    assert re.search(r"^  ✓ exit 0 · [\d.]+s · 3 lines of output$", r.stderr, re.M), r.stderr
    assert "│" not in r.stderr


def test_quiet_erases_interim_words_and_edits_are_counted(cli, fake):
    (cli.workdir / "notes.txt").write_text("one\ntwo\n")
    cli.use(fake)
    fake.add({"content": "Editing.", "tool_calls": [tool_call("edit_file", path="notes.txt", old_text="two\n",
                                                              new_text="2\n3\n4\n")]},
             {"content": "Done."})
    p = pty(cli, "run", "--quiet", "edit notes.txt", color=True)
    try:
        assert p.wait() == 0
    finally:
        p.close()
    assert "Editing.\r\n\x1b[1A\r\x1b[JDone.\r\n" in p.seen
    assert cli.run("undo").returncode == 0  # the same edit once more, without --quiet
    fake.add({"tool_calls": [tool_call("edit_file", path="notes.txt", old_text="two\n", new_text="2\n3\n4\n")]},
             {"content": "Done."})
    r = cli.run("run", "edit notes.txt")
    assert "✓ notes.txt: +3 −1 lines" in r.stderr, r.stderr


def test_ctrl_c_in_run_keeps_what_was_streamed(cli, fake):
    cli.use(fake)
    fake.add({"content": "One two three four five six seven eight nine ten eleven twelve.", "chunk_delay": 0.3})
    p = pty(cli, "run", "count")
    try:
        p.expect("One two")
        p.interrupt()
        assert p.wait() == 130
    finally:
        p.close()
    assert "interrupted" in p.seen and not set(p.seen[p.seen.index("One two"):]) & set(SPINNER)
    conv = json.loads(cli.run("history", "list", "--json").stdout)[0]
    shown = json.loads(cli.run("history", "show", conv["id"], "--json").stdout)
    last = shown["messages"][-1]
    assert last["role"] == "assistant" and last["content"].startswith("One two") and "cut short" in last["content"]


def test_a_piped_or_json_run_cut_short_keeps_what_was_said(cli, fake):
    """Round 18c: on a terminal the words of a reply cut short were kept; piped (Ctrl-C) or with --json and its
    time limit, nothing was, and --json answered ""."""
    cli.use(fake)
    words = "One two three four five six seven eight nine ten eleven twelve thirteen fourteen."
    fake.add({"content": words, "chunk_delay": 0.3})
    proc = cli.popen("run", "count")
    assert wait_for(lambda: fake.chunks >= 3, timeout=30)  # "One two three" went out
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and out == "", err
    fake.add({"content": words, "chunk_delay": 0.3})
    r = cli.run("run", "--json", "--timeout", "2", "count")
    assert r.returncode == 1
    result = json.loads(r.stdout)
    assert result["status"] == "timeout" and result["answer"].startswith("One two"), result
    for conv, why in zip(json.loads(cli.run("history", "list", "--json").stdout)[:2], ("time limit", "Ctrl-C")):
        last = json.loads(cli.run("history", "show", conv["id"], "--json").stdout)["messages"][-1]
        assert last["role"] == "assistant" and last["content"].startswith("One two") and why in last["content"]


def test_an_answer_that_did_not_stream_is_shown_in_chat_and_run(cli, fake):
    import subprocess
    cli.use(fake, provider="openai")
    fake.add({"content": "in one piece", "plain_json": True}, {"content": "in one piece", "plain_json": True})
    c = subprocess.run(cli.command("chat"), input="hello\n", capture_output=True, text=True, env=cli.env,
                       cwd=str(cli.workdir), timeout=60)
    assert c.returncode == 0 and c.stdout == "in one piece\n", c.stderr
    p = pty(cli, "run", "hello")
    try:
        assert p.wait() == 0 and p.seen.count("in one piece") == 1
    finally:
        p.close()


# ---- the command line: the words after the options are the task ----


def test_run_takes_every_word_after_its_options_as_the_task(cli, fake):
    cli.use(fake)
    fake.add({"content": "a"}, {"content": "b"}, {"content": "c"})
    r = cli.run("run", "explain", "what", "ls", "-v", "does")
    assert r.returncode == 0 and "debug:" not in r.stderr, r.stderr  # -v is the task's, not --verbose
    assert person_messages(fake.model_requests()[0])[-1]["content"] == "explain what ls -v does"
    r = cli.run("run", "-v", "--", "-q", "means", "quiet?")
    assert r.returncode == 0 and "debug:" in r.stderr
    assert person_messages(fake.model_requests()[1])[-1]["content"] == "-q means quiet?"
    r = cli.run("--provider", "ollama", "what", "is", "--json")  # no terminal: xzatoma TEXT runs it
    assert r.returncode == 0 and r.stdout == "c\n"
    assert person_messages(fake.model_requests()[2])[-1]["content"] == "what is --json"
    fake.add({"content": "d"})
    r = cli.run("summarise the notes, briefly")  # xzatoma "text", as a shell passes it: one word
    assert r.returncode == 0 and r.stdout == "d\n", r.stderr
    assert person_messages(fake.model_requests()[3])[-1]["content"] == "summarise the notes, briefly"
    r = cli.run("chta")
    assert r.returncode == 2 and "did you mean 'chat'?" in r.stderr and len(fake.model_requests()) == 4
    # a subcommand's own word (round 18c: `xzatoma login` went to a write-mode model as its task)
    r = cli.run("login")
    assert (r.returncode, r.stdout) == (2, "") and "did you mean 'xzatoma auth login'?" in r.stderr
    assert len(fake.model_requests()) == 4


# ---- run takes input the usual ways; live events ----


def user_text(fake, index=0):
    return said(fake.model_requests()[index]["body"]["messages"])[0]


def test_positional_prompt(cli, fake):
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("list_directory", pattern="*.py")]}, {"content": "two"},
             {"tool_calls": [tool_call("list_directory")]}, {"content": "three"})
    r = cli.run("run", "List the Python files")
    assert r.returncode == 0 and r.stdout == "two\n", r.stderr
    assert user_text(fake) == "List the Python files"
    r = cli.run("run", "count", "the", "files")  # several words, no quotes needed
    assert r.returncode == 0 and user_text(fake, 2) == "count the files"
    both = cli.run("run", "--prompt", "other", "task")  # options go before the task (words after it are the task)
    assert both.returncode == 2 and "give the task once" in both.stderr


def test_piped_stdin_plus_a_prompt_is_context_after_it(cli, fake):
    cli.use(fake, mentions={"max_file_size": 64})
    fake.add({"content": "the linker failed"}, {"content": "short"})
    log = "step 1 ok\nerror: undefined reference to @main\n"
    r = cli.run("run", "Why did this fail?", input=log)
    assert r.returncode == 0 and r.stdout == "the linker failed\n", r.stderr
    text = user_text(fake)
    assert text.startswith("Why did this fail?\n\n[Content of standard input]\nstep 1 ok\nerror: undefined")
    assert text.endswith("[End of standard input]") and "@main" in text  # data: never a mention
    big = "x" * 200
    cli.run("run", "--prompt", "summarise", input=big)
    text = user_text(fake, 1)
    assert "x" * 64 in text and "x" * 65 not in text
    assert "[standard input cut at 64 bytes (agent.mentions.max_file_size); the rest was not read]" in text


def test_stdin_alone_stays_the_prompt(cli, fake):
    cli.use(fake)
    fake.add({"content": "ok"})
    r = cli.run("run", input="just this\n")
    assert r.returncode == 0 and user_text(fake) == "just this"


def test_mentions_in_run_and_plans(cli, fake):
    (cli.workdir / "app.py").write_text("".join("line %d\n" % i for i in range(1, 31)))
    (cli.workdir / "plan.yaml").write_text("goal: Explain @app.py#L10-12\ninstructions: [look at @app.py#L2]\n")
    cli.use(fake)
    fake.add({"content": "ok"}, {"content": "ok"}, {"content": "ok"})
    r = cli.run("run", "Explain @app.py#L10-12 and @missing.txt")
    assert r.returncode == 0, r.stderr
    text = user_text(fake)
    assert "[Content of @app.py#L10-12]\nline 10\nline 11\nline 12\n[End of @app.py#L10-12]" in text
    assert "Failed to include @missing.txt" in text
    assert "@app.py#L10-12: loaded" in r.stderr
    r = cli.run("run", "--plan", "plan.yaml")
    assert r.returncode == 0, r.stderr
    text = user_text(fake, 1)
    assert "line 11" in text and "[Content of @app.py#L2]\nline 2\n" in text
    outside = cli.run("run", "read @../../etc/passwd")
    assert "root:" not in user_text(fake, 2) and "Failed to include" in user_text(fake, 2)


def test_path_mentions_end_as_url_mentions_do(cli, fake):
    """round 19a: one rule for @path and @url: the sentence's punctuation is not the mention's, a closing bracket
    the mention opened is (doc(1).txt.), and a mention may stand in brackets."""
    (cli.workdir / "doc(1).txt").write_text("in brackets\n")
    (cli.workdir / "notes.txt").write_text("plain notes\n")
    cli.use(fake)
    fake.add({"content": "ok"})
    r = cli.run("run", "Compare @doc(1).txt. with the notes (@notes.txt#L1).")
    assert r.returncode == 0, r.stderr
    text = user_text(fake)
    assert "[Content of @doc(1).txt.]\nin brackets" in text and "plain notes" in text, text


def test_stream_json_one_object_per_line(cli, fake):
    (cli.workdir / "notes.txt").write_text("alpha\n")
    cli.use(fake, provider="openai")
    fake.add({"content": "let me look", "tool_calls": [tool_call("read_file", path="notes.txt")],
              "usage": {"prompt_tokens": 100, "completion_tokens": 5}},
             {"content": "It says alpha.", "usage": None})
    r = cli.run("run", "--output-format", "stream-json", "what is in notes.txt?")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(l) for l in r.stdout.splitlines()]
    kinds = [l["type"] for l in lines]
    assert kinds == ["start", "usage", "message", "tool_call", "tool_result", "usage", "message", "result"]
    start, result = lines[0], lines[-1]
    assert start["provider"] == "openai" and start["model"] == "gpt-test" and start["conversation_id"]
    assert lines[1] == {"type": "usage", "prompt_tokens": 100, "completion_tokens": 5, "total_tokens": 105,
                        "estimated": False}
    assert lines[2]["content"] == "let me look" and lines[2]["tool_calls"][0]["name"] == "read_file"
    assert lines[3]["name"] == "read_file" and lines[3]["arguments"] == {"path": "notes.txt"}
    assert lines[4]["success"] is True and "alpha" in lines[4]["preview"] and lines[4]["id"] == lines[3]["id"]
    assert lines[5]["estimated"] is True
    assert result["status"] == "completed" and result["answer"] == "It says alpha."
    assert result["conversation_id"] == start["conversation_id"]
    assert set(result) == {"type", "conversation_id", "status", "answer", "turns", "tool_calls", "usage",
                           "duration_seconds", "error", "warnings", "steps", "review"}  # the --json object's fields
    assert result["usage"]["estimated"] is True and result["tool_calls"] == 1
    assert "▶ read_file notes.txt" in r.stderr  # progress for people stays on stderr


def test_json_alias_and_conflicts(cli, fake):
    cli.use(fake)
    fake.add({"content": "a"}, {"content": "b"})
    one = json.loads(cli.run("run", "--json", "x").stdout)
    two = json.loads(cli.run("run", "--output-format", "json", "x").stdout)
    assert set(one) == set(two) and one["answer"] == "a" and two["answer"] == "b"
    r = cli.run("run", "--json", "--output-format", "stream-json", "x")
    assert r.returncode == 2 and "--json means --output-format json" in r.stderr


def test_run_spinner_on_a_terminal_and_request_timing_with_verbose(cli, fake):
    from ptyrun import PtyProcess
    cli.use(fake)
    fake.add({"content": "slow answer", "delay": 1.5}, {"content": "fast"})
    p = PtyProcess(cli.command("run", "--verbose", "x"), dict(cli.env, TERM="xterm"), str(cli.workdir))
    try:
        p.expect(r"waiting for the model 1s")  # the elapsed time, redrawn in place
        p.expect(r"debug: POST http://127\.0\.0\.1:\d+/api/chat: HTTP 200 after 1\.\d\ds \(attempt 1 of 3\)")
        p.expect("slow answer")
        assert p.wait() == 0
    finally:
        p.close()
    r = cli.run("run", "x")  # no terminal: no spinner, no carriage returns in what a log collects
    assert r.returncode == 0 and "\r" not in r.stderr and "waiting for the model" not in r.stderr


@pytest.mark.parametrize("quiet", [False, True])
def test_a_dumb_terminal_gets_no_escape_sequences(cli, fake, quiet):
    """TERM=dumb (emacs' shell, some CI consoles): colour was off, but the spinner was drawn and wiped with \\x1b[K
    (round 18c); nor are interim words erased with cursor moves there."""
    from ptyrun import PtyProcess
    (cli.workdir / "notes.txt").write_text("one\n")
    cli.use(fake)
    fake.add({"content": "Reading.", "delay": 1.5, "tool_calls": [tool_call("read_file", path="notes.txt")]},
             {"content": "plain answer"})
    env = dict(cli.env, TERM="dumb")
    env.pop("NO_COLOR")
    p = PtyProcess(cli.command("run", *(["--quiet"] if quiet else []), "read notes.txt"), env, str(cli.workdir))
    try:
        assert p.wait() == 0
        p.expect("plain answer")
    finally:
        p.close()
    assert "\x1b" not in p.seen, repr(p.seen)
    assert "Reading." in p.seen and "waiting for the model" not in p.seen


# ---- failing fast and honestly ----


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def error_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("provider", ["ollama", "openai"])
def test_connection_refused_is_one_line_within_seconds(cli, provider):
    port = free_port()
    # the default retry policy (3 retries, 1 s backoff): a retried refusal would take several seconds
    cli.write_config({"provider": {"type": provider, "ollama": {"host": "127.0.0.1:%d" % port},
                                   "openai": {"base_url": "http://localhost:%d/v1" % port}}})
    started = time.monotonic()
    r = cli.run("run", "--prompt", "summarise big.txt " + "context " * 3000)
    elapsed = time.monotonic() - started
    assert r.returncode == 1 and r.stdout == ""
    assert elapsed < 5, elapsed
    assert "retrying" not in r.stderr and "gave up" not in r.stderr
    assert len(error_lines(r.stderr)) == 1 and "(connection refused)" in r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2, r.stderr  # the run's header line and the error


def loopback_server(answer):
    """A listener on 127.0.0.1 that hands every connection to `answer(conn)`, in a thread; the caller closes it."""
    import threading
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            answer(conn)
    threading.Thread(target=serve, daemon=True).start()
    return listener


@pytest.mark.parametrize("provider", ["ollama", "openai"])
@pytest.mark.parametrize("banner", [b"SSH-2.0-OpenSSH_9.6\r\n", b"\x1b[2J220 smtp ready\r\n"])
def test_a_service_that_is_not_http_is_one_line_showing_what_answered(cli, provider, banner):
    """A wrong port (an SSH or SMTP banner) was retried 4 times and said as "cannot connect … start it with
    'ollama serve'", though it connected (round 18c): one line, what answered (escaped), no retry."""
    accepted = []

    def answer(conn):
        accepted.append(1)
        conn.sendall(banner)
        time.sleep(0.2)
        conn.close()
    listener = loopback_server(answer)
    port = listener.getsockname()[1]
    cli.write_config({"provider": {"type": provider, "max_retries": 3, "retry_backoff_seconds": 0.5,
                                   "ollama": {"host": "127.0.0.1:%d" % port},
                                   "openai": {"base_url": "http://127.0.0.1:%d/v1" % port}}})
    try:
        r = cli.run("run", "--prompt", "hi", env={"OPENAI_API_KEY": "sk-test"})
    finally:
        listener.close()
    assert r.returncode == 1 and r.stdout == ""
    errors = error_lines(r.stderr)
    assert len(errors) == 1, r.stderr
    assert "not in HTTP" in errors[0] and "127.0.0.1:%d" % port in errors[0], errors
    assert json.dumps(banner.decode("latin-1")[:60]) in errors[0]  # escaped: \x1b is shown, not sent
    assert "\x1b" not in r.stderr and "retrying" not in r.stderr and "ollama serve" not in r.stderr
    assert "cannot connect" not in r.stderr and "gave up" not in r.stderr and "Traceback" not in r.stderr
    assert accepted  # it was reached


@pytest.mark.parametrize("argv", [["run", "hi"], ["undo"], ["run", "-C", "rel", "hi"], ["history", "list", "--here"]])
def test_a_current_directory_that_was_removed_is_a_usage_error(cli, fake, argv):
    """A shell left in a removed directory (a rebuilt build dir, a removed worktree): 'internal error:
    FileNotFoundError', exit 1, for run and undo (round 18c)."""
    cli.use(fake)
    gone = cli.tmp / "gone"
    gone.mkdir()
    script = 'cd "$1" && rmdir "$1" && shift && exec "$@"'
    r = subprocess.run(["sh", "-c", script, "sh", str(gone)] + cli.command(*argv), capture_output=True, text=True,
                       env=cli.env, stdin=subprocess.DEVNULL, timeout=60)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.strip().splitlines() == error_lines(r.stderr) and len(error_lines(r.stderr)) == 1, r.stderr
    assert "the current directory no longer exists" in r.stderr and "internal error" not in r.stderr
    assert fake.requests == []


def test_timeouts_are_still_retried(cli, fake):
    cli.use(fake, provider="openai")
    cfg = cli.config_path.read_text().replace("request_timeout_seconds: 20", "request_timeout_seconds: 1")
    cli.config_path.write_text(cfg)
    fake.add({"hang": 3}, {"content": "second try"})
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 0 and r.stdout == "second try\n", r.stderr
    assert r.stderr.count("retrying in") == 1 and "timed out" in r.stderr


def test_the_window_probe_is_one_attempt(cli, fake):
    cli.use(fake, provider="ollama")
    fake.raw_routes["/api/show"] = (503, "application/json", '{"error": "busy"}')
    fake.add({"content": "fine"})
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 0 and r.stdout == "fine\n", r.stderr
    shows = [q for q in fake.requests if q["path"] == "/api/show"]
    assert len(shows) == 1, "the probe was retried %d times" % (len(shows) - 1)
    assert "retrying" not in r.stderr


@pytest.mark.parametrize("provider,path", [("openai", "/web/v1/chat/completions"), ("ollama", "/api/chat")])
def test_a_web_page_instead_of_an_api_is_one_line(cli, fake, provider, path):
    cli.use(fake, provider=provider)
    page = "<html><head><title>Welcome to nginx!</title>\x1b[31m</head></html>"
    fake.raw_routes[path] = (200, "text/html", page)
    fake.raw_routes["/api/show"] = (200, "text/html", page)
    cfg = cli.config_path.read_text().replace(fake.url + "/v1", fake.url + "/web/v1")
    cli.config_path.write_text(cfg)
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 1 and r.stdout == ""
    errors = error_lines(r.stderr)
    assert len(errors) == 1, r.stderr
    assert fake.url in errors[0] and "text/html" in errors[0] and "Welcome to nginx" in errors[0]
    assert ("Ollama" if provider == "ollama" else "OpenAI-compatible") in errors[0]
    assert "Expecting value" not in r.stderr and "JSONDecodeError" not in r.stderr
    assert "\x1b" not in r.stderr  # what the server sent is shown, never interpreted by the terminal


def test_models_listing_that_is_not_json(cli, fake):
    cli.use(fake, provider="openai")
    fake.raw_routes["/v1/models"] = (200, "text/plain", "")
    r = cli.run("models")
    assert r.returncode == 1
    assert error_lines(r.stderr) == [e for e in error_lines(r.stderr) if "an empty body" in e] != []


# ---- mistakes on the command line ----


@pytest.mark.parametrize("argv,prog,hint", [
    (["run", "--jsno", "-p", "x"], "xzatoma run", "unrecognized argument: --jsno (did you mean --json?)"),
    (["history", "list", "--hre"], "xzatoma history list", "--hre (did you mean --here?)"),
    (["chat", "--json"], "xzatoma chat", "unrecognized argument: --json (see xzatoma chat --help)"),
    (["rnu"], "xzatoma", "invalid choice: 'rnu'"),
    (["history", "lsit"], "xzatoma history", "did you mean 'list'?"),
])
def test_unknown_flags_show_the_subcommand_usage_and_a_guess(cli, argv, prog, hint):
    r = cli.run(*argv)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("usage: %s " % prog), r.stderr
    assert hint in r.stderr.splitlines()[-1]
    if argv == ["rnu"]:
        assert "did you mean 'run'?" in r.stderr


@pytest.mark.parametrize("argv", [["--mode=planning", "run", "fix it"], ["--mode=planning", "fix it"],
                                  ["--mod=planning", "run", "fix it"], ["--mode", "planning", "run", "fix it"],
                                  ["--model", "m", "-C", ".", "fix it"]])
def test_a_command_s_option_before_the_command_is_a_usage_error(cli, fake, argv):
    """Round 19c: argparse read `--mode=planning` before `run` as an abbreviation of the global --model, and the
    run went on in write mode with a model named "planning"; `--mode planning run` was a traceback."""
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("write_file", path="marker", content="x")]}, {"content": "done"})
    r = cli.run(*argv)
    assert r.returncode == 2 and r.stdout == "" and fake.model_requests() == []
    assert r.stderr.startswith("error: -") and "put it after the command" in r.stderr and len(
        r.stderr.splitlines()) == 1, r.stderr
    assert not (cli.workdir / "marker").exists()


# ---- the time limit counts from the start ----
# Round 18c: before the loop, nothing was bounded by --timeout: the server's probes against a server that never
# answers (60-90 s for `run --timeout 5`), a stdin pipe left open without a word (CI runners, ssh without -n).

@pytest.mark.parametrize("provider", ["ollama", "openai"])
def test_a_silent_model_server_cannot_hold_a_run_past_its_time_limit(cli, fake, provider):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # accepts (the kernel's backlog) and never answers
    try:
        url = "http://127.0.0.1:%d" % silent.getsockname()[1]
        cli.use(fake, provider=provider)
        cli.write_config({"provider": {"type": provider, "max_retries": 1, "request_timeout_seconds": 30,
                                       "ollama": {"host": url, "model": "llama3.2:3b"},
                                       "openai": {"base_url": url + "/v1", "model": "gpt-test"}}})
        started = time.monotonic()
        r = cli.run("run", "--timeout", "3", "hello", timeout=60)
        took = time.monotonic() - started
    finally:
        silent.close()
    assert r.returncode == 1 and r.stdout == "", r.stderr
    assert took < 15, took
    assert "timed out after 3s (agent.timeout_seconds)" in r.stderr or "time limit" in r.stderr, r.stderr


def test_a_stdin_left_open_without_a_word_ends_at_the_time_limit(cli, fake):
    cli.use(fake)
    fake.add({"content": "hi"})
    proc = subprocess.Popen(cli.command("run", "--timeout", "2", "hello"), env=cli.env, cwd=str(cli.workdir),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        proc.wait(timeout=30)  # stdin stays open (communicate() would close it)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    finally:
        proc.stdin.close()
    out, err = proc.stdout.read(), proc.stderr.read()
    assert proc.returncode == 1 and out == "", err
    assert "</dev/null" in err and len(err.strip().splitlines()) == 1, err


# ---- standard output and error that fail ----
# Round 18c: a full disk under `--json > result.json` exited 120 with Python's own messages; a reader that stopped
# reading (`| head -c 10`) made a completed task exit 1 and, streaming, a history of "killed or crashed"; with
# stderr closed (2>&-) the answer was lost.

def test_a_full_disk_on_stdout_is_one_line_and_exit_1(cli, fake):
    cli.use(fake)
    fake.add({"content": "the answer"})
    for args in (("run", "--json", "hi"), ("history", "list")):
        with open("/dev/full", "w") as full:
            r = subprocess.run(cli.command(*args), env=cli.env, cwd=str(cli.workdir), stdout=full,
                               stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, timeout=60)
        assert r.returncode == 1, r.stderr
        assert "cannot write standard output: No space left on device" in r.stderr
        assert "Exception ignored" not in r.stderr and "internal error" not in r.stderr and "Traceback" not in r.stderr
    conv = json.loads(cli.run("history", "list", "--json").stdout)[0]
    assert conv["status"] == "completed"  # the run itself did its work, and it is recorded


@pytest.mark.parametrize("fmt", ["text", "stream-json"])
def test_a_reader_that_stops_reading_leaves_the_task_its_own_exit_code(cli, fake, fmt):
    cli.use(fake)
    fake.add({"content": "".join("w%d " % (i * 7919 % 100003) for i in range(30000))})  # more than a pipe holds
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write
    proc = subprocess.Popen(cli.command("run", "--output-format", fmt, "hi"), env=cli.env, cwd=str(cli.workdir),
                            stdout=write, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    os.close(write)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "internal error" not in err and "Traceback" not in err
    conv = json.loads(cli.run("history", "list", "--json").stdout)[0]
    assert conv["status"] == "completed", conv


def test_a_closed_stderr_loses_no_answer(cli, fake):
    cli.use(fake)
    fake.add({"content": "the answer"})
    r = subprocess.run(cli.command("run", "hi"), env=cli.env, cwd=str(cli.workdir), capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=60, preexec_fn=lambda: os.close(2))
    assert (r.returncode, r.stdout) == (0, "the answer\n")


def test_with_stderr_redirected_the_words_between_tool_calls_reach_its_log(cli, fake, tmp_path):
    """Round 18c: `run "…" 2>run.log` on a terminal streamed a reply that then asked for tools onto stdout."""
    import pty as ptymod
    cli.use(fake)
    fake.add({"content": "INTERIM words before a tool", "tool_calls": [tool_call("list_directory")]},
             {"content": "FINAL answer"})
    master, slave = ptymod.openpty()
    log = tmp_path / "run.log"
    with open(log, "w") as errf:
        proc = subprocess.Popen(cli.command("run", "look"), env=dict(cli.env, TERM="xterm"), cwd=str(cli.workdir),
                                stdin=subprocess.DEVNULL, stdout=slave, stderr=errf)
        os.close(slave)
        out = b""
        while True:  # read until the child closes its end (EIO on Linux)
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            out += data
        assert proc.wait(timeout=30) == 0
    os.close(master)
    assert b"FINAL answer" in out and b"INTERIM" not in out, out
    assert "INTERIM words before a tool" in log.read_text()


def test_the_task_or_plan_read_from_a_pipe_left_open_ends_at_the_time_limit(cli, fake, tmp_path):
    """Round 18f: only the piped context was bounded; the task on stdin, --plan - and a named pipe were not."""
    cli.use(fake)
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(str(fifo))
    for args in (("run", "--timeout", "2", "-"), ("run", "--timeout", "2", "--plan", "-"),
                 ("run", "--timeout", "2", "--plan", str(fifo))):
        proc = subprocess.Popen(cli.command(*args), env=cli.env, cwd=str(cli.workdir), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            proc.wait(timeout=30)
        finally:
            proc.kill()
            proc.stdin.close()
        err = proc.stderr.read()
        assert proc.returncode == 1 and proc.stdout.read() == "", (args, err)
        assert "time limit (agent.timeout_seconds)" in err and len(err.strip().splitlines()) == 1, (args, err)


def _wchan(pid):
    try:
        with open("/proc/%d/wchan" % pid) as fh:
            return fh.read()
    except OSError:
        return ""


def test_sigterm_before_the_loop_is_a_clean_exit(cli, fake):
    """Round 18f: SIGTERM or SIGHUP while stdin was read (or MCP servers started) killed run by default action."""
    cli.use(fake)
    for sig, code in ((signal.SIGTERM, 143), (signal.SIGHUP, 129)):
        proc = subprocess.Popen(cli.command("run", "--timeout", "60", "-"), env=cli.env, cwd=str(cli.workdir),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # the child waits on stdin (its main thread in select(): the kernel's wait channel says so)
            assert wait_for(lambda: any(w in _wchan(proc.pid) for w in ("poll_schedule_timeout", "do_select",
                                                                        "do_sys_poll")), timeout=30)
            proc.send_signal(sig)
            proc.wait(timeout=30)
        finally:
            proc.kill()
            proc.stdin.close()
        err = proc.stderr.read()
        assert proc.returncode == code and "terminated (%s)" % sig.name in err and "Traceback" not in err, err


def test_a_closed_stdout_is_said_and_exit_1(cli, fake):
    cli.use(fake)
    fake.add({"content": "the answer"})
    r = subprocess.run(cli.command("run", "hi"), env=cli.env, cwd=str(cli.workdir), stderr=subprocess.PIPE,
                       stdin=subprocess.DEVNULL, text=True, timeout=60, preexec_fn=lambda: os.close(1))
    assert r.returncode == 1 and "cannot write standard output: standard output is closed" in r.stderr, r.stderr


def test_a_time_limit_of_centuries_is_no_internal_error(cli, fake):
    cli.use(fake)
    fake.add({"content": "ok"})
    r = cli.run("run", "--timeout", "9999999999", "explain", input="some context\n")
    assert (r.returncode, r.stdout) == (0, "ok\n"), r.stderr


@pytest.mark.parametrize("provider", ["ollama", "openai", "copilot"])
def test_a_server_that_resets_the_connection_is_not_told_to_be_started(cli, fake, provider):
    """Round 18c: a port where something took the connection and reset it said "cannot connect … start it with
    'ollama serve'"; Copilot's named provider.openai.base_url."""
    import struct

    def reset(conn):
        conn.recv(100)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()  # RST
    resetting = loopback_server(reset)
    url = "http://127.0.0.1:%d" % resetting.getsockname()[1]
    try:
        cli.use(fake, provider=provider)
        cfg = {"provider": {"type": provider, "max_retries": 1, "retry_backoff_seconds": 0.01,
                            "ollama": {"host": url, "model": "llama3.2:3b"},
                            "openai": {"base_url": url + "/v1", "model": "gpt-test"},
                            "copilot": {"api_url": url, "model": "gpt-4.1", "github_url": url,
                                        "github_api_url": url}}}
        cli.write_config(cfg)
        r = cli.run("run", "--timeout", "30", "hi")
    finally:
        resetting.close()
    assert r.returncode == 1 and r.stdout == "", r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "closed the connection without an answer" in last and "ollama serve" not in last, last
    if provider == "copilot":
        assert "provider.copilot.api_url" in last and "provider.openai.base_url" not in last, last
