"""Everyday use (issue 16), part B: input the usual ways, live events, per-project sessions, chat approvals."""

import json
import os
import re
import subprocess

import pytest

from conftest import said, tool_call


def user_text(fake, index=0):
    return said(fake.model_requests()[index]["body"]["messages"])[0]


# ---- run takes input the usual ways ----


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


# ---- output formats ----


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


# ---- chat: approvals people expect, editing, pasting, models, exit codes ----

PROMPT = r"\[%s\]\[%s\] >> "


def test_always_approves_the_program_and_subcommand_not_every_command(chat, fake, cli):
    fake.add({"tool_calls": [tool_call("terminal", command="touch a.txt")]}, {"content": "one"},
             {"tool_calls": [tool_call("terminal", command="touch b.txt")]}, {"content": "two"},
             {"tool_calls": [tool_call("terminal", command="mkdir newdir")]}, {"content": "three"},
             {"tool_calls": [tool_call("terminal", command="git init -q")]}, {"content": "four"},
             {"tool_calls": [tool_call("terminal", command="git config user.name x")]}, {"content": "five"},
             {"tool_calls": [tool_call("terminal", command="touch c.txt")]}, {"content": "six"})
    p = chat("--mode", "write")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    p.line("first")
    p.expect(r"\$ touch a\.txt")
    p.expect(r"\[a\]lways 'touch' this session / ne\[v\]er 'touch' / \[e\]dit > ")
    p.line("a")
    p.expect("one")
    p.line("second")  # touch again: approved without asking
    p.expect("two")
    assert (cli.workdir / "b.txt").exists() and p.seen.count("Run this command?") == 1
    p.line("third")  # another program asks
    p.expect(r"\$ mkdir newdir")
    p.expect(r"ne\[v\]er 'mkdir'")
    p.line("v")
    p.expect("three")
    assert not (cli.workdir / "newdir").exists()
    p.line("fourth")
    p.expect(r"\[a\]lways 'git init' this session")
    p.line("a")
    p.expect("four")
    p.line("fifth")  # git with another subcommand asks again
    p.expect(r"\[a\]lways 'git config' this session")
    p.line("n")
    p.expect("five")
    p.line("/approvals")
    p.expect(r"always: git init, touch")
    p.expect(r"never: +mkdir")
    p.line("/approvals clear")
    p.expect("cleared")
    p.line("sixth")  # touch asks again after the clear
    p.expect(r"\$ touch c\.txt")
    p.line("y")
    p.expect("six")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    p.eof()
    assert p.wait() == 0, p.seen[-2000:]


def test_approval_keys():
    from xzatoma import approval_key
    assert approval_key("git status --short") == "git status"
    assert approval_key("git push origin main") == "git push"
    assert approval_key("git -C sub push origin main") == "git -C sub push origin main"  # options first: exact
    assert approval_key("npm run lint") == "npm run"
    assert approval_key("make") == "make"
    assert approval_key("make test") == "make test"
    assert approval_key("touch x") == "touch"
    # wrappers, interpreters and shell syntax are approved as the exact command, never as a family
    assert approval_key("env FOO=1 rm -rf x") == "env FOO=1 rm -rf x"
    assert approval_key("timeout 5 curl x") == "timeout 5 curl x"
    assert approval_key("python3 -c 'print(1)'") == "python3 -c 'print(1)'"
    assert approval_key("touch a && rm b") == "touch a && rm b"
    assert approval_key("ls $HOME") == "ls $HOME"


def test_multi_line_paste_and_backslash_continuation_are_one_message(chat, fake):
    fake.add({"content": "got the paste"}, {"content": "got the continuation"})
    p = chat()
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.send("\x1b[200~first pasted line\nsecond pasted line\x1b[201~\r")  # a terminal's bracketed paste
    p.expect("got the paste")
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.line("one \\")
    p.expect(r"\.\.\. ")
    p.line("two")
    p.expect("got the continuation")
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.eof()
    assert p.wait() == 0
    users = [text for q in fake.model_requests() for text in said(q["body"]["messages"])]
    assert "first pasted line\nsecond pasted line" in users and "one \ntwo" in users
    assert len(fake.model_requests()) == 2


def test_model_switch_checks_the_name(chat, fake):
    fake.add({"content": "on qwen"})
    p = chat()
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.line("/model qwen4")
    p.expect(r"error: ollama has no model 'qwen4'; did you mean 'qwen3'\? \(see /models\)")
    p.line("/model qwen3")
    p.expect("Switched to model qwen3")
    p.line("hello")
    p.expect("on qwen")
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.eof()
    assert p.wait() == 0
    assert fake.model_requests()[-1]["body"]["model"] == "qwen3"


def test_piped_chat_exits_1_when_a_turn_failed(cli, fake):
    cli.use(fake)
    fake.add({"content": "fine"}, {"status": 400, "body": '{"error": "bad request"}'}, {"content": "fine again"})
    r = cli.run("chat", input="one\ntwo\nthree\n")
    assert r.returncode == 1, r.stderr
    assert r.stdout.count("fine") == 2 and "bad request" in r.stderr
    fake.add({"content": "ok"})
    assert cli.run("chat", input="only\n").returncode == 0


def test_the_exit_hint_works_as_printed(cli, fake, tmp_path):
    import shlex
    project = cli.tmp / "my project"
    project.mkdir()
    cli.use(fake)
    fake.add({"content": "first"}, {"content": "second"})
    r = cli.run("chat", "-C", project, input="remember the walrus\n")
    hint = [l for l in r.stderr.splitlines() if l.startswith("Resume this conversation with: ")][0]
    command = hint.split(": ", 1)[1]
    argv = shlex.split(command)
    assert argv[:2] == ["xzatoma", "chat"]
    again = cli.run(*argv[1:], input="and now?\n", cwd=cli.home)  # from another directory, as printed
    assert again.returncode == 0, again.stderr
    users = said(fake.model_requests()[-1]["body"]["messages"])
    assert users == ["remember the walrus", "and now?"]


# ---- sessions belong to a project ----


def test_last_is_this_directorys_and_resume_refuses_another(cli, fake):
    cli.use(fake)
    other = cli.tmp / "other"
    other.mkdir()
    fake.add({"content": "here 1"}, {"content": "there 1"}, {"content": "here 2"})
    cli.run("run", "task in work")
    cli.run("run", "task in other", cwd=other)
    r = cli.run("run", "--last", "continue")  # the latest overall is other's; --last means this directory's
    assert r.returncode == 0, r.stderr
    users = said(fake.model_requests()[-1]["body"]["messages"])
    assert users == ["task in work", "continue"]
    rows = json.loads(cli.run("history", "list", "--json").stdout)
    other_id = [x["id"] for x in rows if x["title"] == "task in other"][0]
    r = cli.run("run", "--resume", other_id[:10], "go on")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "ran in %s, not here: continue it there with --working-dir %s" % (other, other) in r.stderr
    fake.add({"content": "continued there"})
    r = cli.run("run", "--resume", other_id[:10], "--working-dir", other, "go on")
    assert r.returncode == 0 and r.stdout == "continued there\n", r.stderr
    empty = cli.tmp / "empty"
    empty.mkdir()
    r = cli.run("run", "--last", "x", cwd=empty)
    assert r.returncode == 2 and "no stored conversation to resume in %s" % empty in r.stderr
    r = cli.run("run", "--last", "--global", "x", cwd=empty)
    assert r.returncode == 2 and "ran in" in r.stderr  # found another directory's, and refused it


def test_resume_restores_provider_model_and_mode(cli, fake):
    cli.use(fake)  # ollama by default
    fake.add({"content": "one"}, {"content": "two"}, {"content": "three"}, {"content": "four"})
    r = cli.run("run", "--provider", "openai", "--model", "gpt-4.1", "--mode", "planning", "start")
    assert r.returncode == 0, r.stderr
    r = cli.run("run", "--last", "continue")
    assert r.returncode == 0, r.stderr
    q = fake.model_requests()[-1]
    assert q["path"] == "/v1/chat/completions" and q["body"]["model"] == "gpt-4.1"
    names = {t["function"]["name"] for t in q["body"]["tools"]}
    assert "read_file" in names and "write_file" not in names  # still planning
    r = cli.run("run", "--last", "--model", "gpt-test", "--mode", "write", "more")  # given again: these win
    q = fake.model_requests()[-1]
    assert q["body"]["model"] == "gpt-test" and "write_file" in {t["function"]["name"] for t in q["body"]["tools"]}
    r = cli.run("chat", "--last", input="and in chat?\n")
    assert r.returncode == 0, r.stderr
    q = fake.model_requests()[-1]
    assert q["path"] == "/v1/chat/completions" and q["body"]["model"] == "gpt-test"
    assert said(q["body"]["messages"])[-1] == "and in chat?"


def test_undo_defaults_to_this_directorys_changes(cli, fake):
    cli.use(fake)
    other = cli.tmp / "other"
    other.mkdir()
    fake.add({"tool_calls": [tool_call("write_file", path="here.txt", content="x")]}, {"content": "done"},
             {"tool_calls": [tool_call("write_file", path="there.txt", content="y")]}, {"content": "done"})
    cli.run("run", "write here")
    cli.run("run", "write there", cwd=other)
    r = cli.run("undo")  # the newest change overall is other's; undo here undoes this directory's
    assert r.returncode == 0, r.stderr
    assert not (cli.workdir / "here.txt").exists() and (other / "there.txt").exists()
    assert "nothing to undo in" in cli.run("undo").stderr
    r = cli.run("undo", "--all-projects")
    assert r.returncode == 0 and not (other / "there.txt").exists()
