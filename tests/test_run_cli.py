"""`xzatoma run` end to end: the real CLI as a subprocess against the fake model server."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import last_json, tool_call, wait_for

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


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signals_end_the_run_cleanly(cli, fake, sig, code):
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
