"""Everyday use (issue 16): failing fast, honest usage, auth status, metrics warnings, per-project history,
project instructions. End to end through the CLI against the fake model server."""

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from conftest import last_json, tool_call


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def error_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("error:")]


# ---- Failing fast and honestly ----


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


# ---- Honest usage ----


@pytest.mark.parametrize("provider,api", [("openai", "chat"), ("ollama", "chat"), ("openai", "responses")])
def test_a_server_without_usage_gets_an_estimate(cli, fake, provider, api):
    (cli.workdir / "notes.txt").write_text("alpha\n" * 200)
    cli.use(fake, provider=provider, api=api)
    fake.add({"tool_calls": [tool_call("read_file", path="notes.txt")], "usage": None},
             {"content": "two hundred alphas", "usage": None})
    r = cli.run("run", "--json", "--prompt", "count the alphas")
    assert r.returncode == 0, r.stderr
    usage = json.loads(r.stdout)["usage"]
    assert usage["estimated"] is True
    # the second request carries the first plus a 1,200-character tool result: about 300 tokens more
    assert usage["prompt_tokens"] > 2 * 300 and usage["completion_tokens"] > 0
    assert "(estimated: the server sent no usage)" in r.stderr
    if provider == "openai" and api == "chat":
        assert all(q["body"]["stream_options"] == {"include_usage": True} for q in fake.model_requests())


def test_reported_usage_is_not_marked_estimated(cli, fake):
    cli.use(fake, provider="openai")
    fake.add({"content": "ok", "usage": {"prompt_tokens": 123, "completion_tokens": 4}})
    r = cli.run("run", "--json", "--prompt", "x")
    usage = json.loads(r.stdout)["usage"]
    assert usage == {"prompt_tokens": 123, "completion_tokens": 4, "total_tokens": 127, "estimated": False}
    assert "estimated" not in r.stderr


def test_token_quota_counts_estimates(cli, fake):
    (cli.workdir / "big.txt").write_text("word " * 2000)
    cli.use(fake, provider="openai", quota={"max_total_tokens": 5000})
    fake.add(*[{"tool_calls": [tool_call("read_file", path="big.txt", start_line=1, end_line=i)], "usage": None}
               for i in range(1, 11)])  # ten different reads: the same call twice in a row is refused as a loop
    r = cli.run("run", "--json", "--prompt", "read it again and again")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["status"] == "quota_exceeded", r.stderr
    assert out["turns"] < 10 and out["usage"]["estimated"] is True


def test_chat_footer_says_estimated(cli, fake):
    cli.use(fake, provider="openai")
    fake.add({"content": "hello there", "usage": None})
    r = cli.run("chat", input="hi\n")
    assert r.returncode == 0 and "hello there" in r.stdout
    assert "this session (estimated: the server sent no usage)" in r.stderr


# ---- auth status checks what the environment gives ----


def test_auth_status_checks_the_environment_token_not_the_stored_one(cli, fake):
    cli.use(fake, provider="copilot", github=True, model="gpt-4.1")
    fake.copilot_valid = set()
    assert cli.run("auth", "login", "--provider", "copilot").returncode == 0  # stores a GitHub and a Copilot token
    good = cli.run("auth", "status", "--provider", "copilot")
    assert good.returncode == 0 and "works:" in good.stdout
    bad = cli.run("auth", "status", "--provider", "copilot", env={"GITHUB_TOKEN": "ghp_revokedTOKENrevokedTOKEN0123"})
    assert bad.returncode == 1, bad.stdout
    assert "env GITHUB_TOKEN" in bad.stdout and "works:" not in bad.stdout
    r = cli.run("auth", "status", "--provider", "copilot", env={"COPILOT_API_TOKEN": "tid=not-a-valid-one"})
    assert r.returncode == 1 and "env COPILOT_API_TOKEN" in r.stdout and "works:" not in r.stdout
    # and a run with the environment's token uses it, not the stored login's
    fake.add({"content": "never"})
    run = cli.run("run", "--prompt", "x", env={"GITHUB_TOKEN": "ghp_revokedTOKENrevokedTOKEN0123"})
    assert run.returncode == 2 and "GitHub refused the Copilot token exchange" in run.stderr
    assert "GITHUB_TOKEN (from the environment)" in run.stderr


# ---- Metrics are a side product ----


def test_an_unwritable_metrics_textfile_is_a_warning(cli, fake, tmp_path):
    cli.use(fake)
    not_a_dir = tmp_path / "a-file"  # unwritable even for root, unlike a mode-0555 folder
    not_a_dir.write_text("")
    for path, code, reply in ((tmp_path / "missing" / "m.prom", 0, {"content": "the answer"}),
                              (not_a_dir / "m.prom", 1, {"status": 400, "body": '{"error": "bad request"}'})):
        fake.add(reply)
        r = cli.run("run", "--metrics-textfile", path, "--prompt", "x")
        assert r.returncode == code, r.stderr
        assert r.stdout == ("the answer\n" if code == 0 else "")
        assert "warning: cannot write the metrics textfile %s" % path in r.stderr
        assert "Traceback" not in r.stderr and "internal error" not in r.stderr


def test_metrics_port_in_use_is_a_usage_error(cli, fake):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        cli.use(fake)
        r = cli.run("run", "--metrics-port", busy.getsockname()[1], "--prompt", "x")
        assert r.returncode == 2 and "cannot serve metrics on 127.0.0.1:%d" % busy.getsockname()[1] in r.stderr
        assert not fake.model_requests()
    finally:
        busy.close()


def test_metrics_install_hint_under_pipx(cli, fake, tmp_path):
    """pipx keeps xzatoma in a venv of its own: the hint must name `pipx inject`."""
    import sysconfig
    venv = tmp_path / "pipx-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (venv / "pipx_metadata.json").write_text("{}")
    python = str(venv / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    shadow = tmp_path / "shadow"  # the test environment has prometheus_client: hide it
    shadow.mkdir()
    (shadow / "prometheus_client.py").write_text("raise ImportError('not installed')\n")
    with open(os.path.join(purelib, "deps.pth"), "w") as fh:
        fh.write("%s\n%s\n" % (shadow, sysconfig.get_paths()["purelib"]))
    cli.use(fake)
    r = subprocess.run([python, cli.command()[1], "run", "--metrics-port", "1", "--prompt", "x"],
                       capture_output=True, text=True, env=cli.env, cwd=str(cli.workdir))
    assert r.returncode == 2, r.stderr
    assert "pipx inject xzatoma prometheus_client" in r.stderr and "pip install" not in r.stderr
    assert not fake.model_requests()


# ---- Sessions belong to a project: the store and history ----


def test_every_conversation_records_where_and_how_it_ran(cli, fake):
    cli.use(fake)
    other = cli.tmp / "other-project"
    other.mkdir()
    fake.add({"content": "a"}, {"content": "b"}, {"content": "c"})
    assert cli.run("run", "--prompt", "in work").returncode == 0
    assert cli.run("run", "--allow-dangerous", "--mode", "planning", "--prompt", "in other", cwd=other).returncode == 0
    assert cli.run("chat", "--safety", "yolo", "--mode", "write", input="hello\n").returncode == 0
    rows = {r["title"]: r for r in json.loads(cli.run("history", "list", "--json").stdout)}
    work, elsewhere, chat = rows["in work"], rows["in other"], rows["hello"]
    assert work["working_dir"] == os.path.realpath(str(cli.workdir)) and elsewhere["working_dir"] == str(other)
    assert (work["provider"], work["model"], work["mode"], work["safety"]) == ("ollama", "llama3.2:3b", "write",
                                                                                "restricted")
    assert (elsewhere["mode"], elsewhere["safety"]) == ("planning", "yolo")
    assert (chat["kind"], chat["mode"], chat["safety"]) == ("chat", "write", "yolo")
    show = cli.run("history", "show", work["id"]).stdout
    assert "mode write · safety restricted · " + work["working_dir"] in show


def test_history_list_shows_directories_local_times_and_filters_here(cli, fake):
    cli.use(fake)
    other = cli.tmp / "other-project"
    other.mkdir()
    fake.add({"content": "a"}, {"tool_calls": [tool_call("list_directory", path=".")]}, {"content": "b"})
    cli.run("run", "--prompt", "first")
    cli.run("run", "--prompt", "second", cwd=other)
    lines = cli.run("history", "list", env={"TZ": "UTC"}).stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "STARTED", "(UTC)"] and "DIRECTORY" in lines[0]
    assert " 1 turn " in lines[2] and " 2 turns " in lines[1]
    assert re.search(r"/other-project +second$", lines[1]) and re.search(r"/work +first$", lines[2]), lines
    here = cli.run("history", "list", "--here", cwd=other).stdout.splitlines()
    assert len(here) == 2 and here[1].rstrip().endswith("second")
    assert json.loads(cli.run("history", "list", "--here", "--json").stdout)[0]["title"] == "first"
    stored = json.loads(cli.run("history", "list", "--json").stdout)[0]["started_at"]  # '…T13:40:00Z' in UTC
    tokyo = cli.run("history", "list", env={"TZ": "Asia/Tokyo"}).stdout.splitlines()
    assert "STARTED (JST)" in tokyo[0]
    utc_hour = int(stored[11:13])
    assert tokyo[1].split()[2].startswith("%02d:" % ((utc_hour + 9) % 24))


def test_prune_everything_asks_or_needs_yes(cli, fake):
    cli.use(fake)
    fake.add({"content": "a"})
    cli.run("run", "--prompt", "keep me")
    r = cli.run("history", "prune", "--older-than", "0d")
    assert r.returncode == 2 and "add --yes" in r.stderr and "1 conversation" in r.stderr
    assert len(json.loads(cli.run("history", "list", "--json").stdout)) == 1
    assert cli.run("history", "prune", "--older-than", "30d").returncode == 0  # a real age needs no answer
    from ptyrun import PtyProcess
    p = PtyProcess(cli.command("history", "prune", "--older-than", "0d"), cli.env, str(cli.workdir))
    try:
        p.expect(r"delete 1 conversation \(everything last used more than 0d ago\)\? \[y/N\] ")
        p.line("n")
        p.expect("nothing deleted")
        assert p.wait() == 0
    finally:
        p.close()
    assert len(json.loads(cli.run("history", "list", "--json").stdout)) == 1
    p = PtyProcess(cli.command("history", "prune", "--older-than", "0d"), cli.env, str(cli.workdir))
    try:
        p.expect(r"\[y/N\] ")
        p.line("y")
        p.expect("deleted 1 conversation older than 0d")
        assert p.wait() == 0
    finally:
        p.close()
    assert json.loads(cli.run("history", "list", "--json").stdout) == []


def test_migration_adds_safety_to_an_old_database(tmp_path):
    import sqlite3
    from xzatoma_store import MIGRATIONS, SCHEMA_VERSION, Store
    path = str(tmp_path / "v2.db")
    conn = sqlite3.connect(path)
    for script in MIGRATIONS[:2]:
        conn.executescript(script)
    conn.execute("PRAGMA user_version = 2")
    conn.execute("INSERT INTO conversations (id, kind, status, started_at, updated_at, working_dir) VALUES "
                 "('01OLD0000000000000000000000', 'run', 'completed', '2025-01-01T00:00:00Z', "
                 "'2025-01-01T00:00:00Z', '/src/app')")
    conn.commit()
    conn.close()
    s = Store(path).open()
    assert s.conn().execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert s.conversation("01OLD0000000000000000000000")["safety"] is None
    assert s.latest(working_dir="/src/app") == "01OLD0000000000000000000000"
    s.resume_conversation("01OLD0000000000000000000000", provider="openai", safety="safe")
    assert s.conversation("01OLD0000000000000000000000")["safety"] == "safe"


# ---- policy verdicts as exit status ----


def test_policy_exit_status_is_for_scripts(cli):
    assert cli.run("policy", "command", "ls").returncode == 0
    deny = cli.run("policy", "command", "rm -rf ~")
    assert deny.returncode == 1 and deny.stdout.startswith("deny: ") and deny.stderr == ""
    assert cli.run("policy", "command", "make test").returncode == 0  # confirm is not a refusal
    assert cli.run("policy", "url", "http://169.254.169.254/latest/meta-data").returncode == 1
    assert cli.run("policy", "path", "../secrets").returncode == 1
    assert cli.run("policy", "path", "notes.txt").returncode == 0
    mixed = cli.run("policy", "command", "-", input="ls\nsudo ls\n")
    assert mixed.returncode == 1 and len(mixed.stdout.splitlines()) == 2
    assert "exit status: 0 when every verdict" in cli.run("policy", "--help").stdout


# ---- Mistakes on the command line ----


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


# ---- Project instructions (AGENTS.md) ----


def system_text(fake, index=0):
    """The system prompt and the environment message after it (where AGENTS.md goes)."""
    return "\n".join(m["content"] for m in fake.model_requests()[index]["body"]["messages"][:2])


def test_agents_md_from_the_git_root_down_nearest_last(cli, fake):
    repo = cli.tmp / "repo"
    sub = repo / "pkg" / "sub"
    sub.mkdir(parents=True)
    (repo / ".git").mkdir()
    (cli.tmp / "AGENTS.md").write_text("ABOVE THE REPO: never shown\n")  # above the git root
    (repo / "AGENTS.md").write_text("Use tabs. REPO-RULE\n")
    (sub / "AGENTS.md").write_text("In this package use spaces. SUB-RULE\n")
    (sub / "CLAUDE.md").symlink_to("AGENTS.md")  # the same file under another name: once
    (repo / ".github").mkdir()
    (repo / ".github" / "copilot-instructions.md").write_text("COPILOT-RULE\n")
    cli.use(fake, instructions_files=["AGENTS.md", "CLAUDE.md", ".github/copilot-instructions.md"])
    fake.add({"content": "ok"})
    r = cli.run("--verbose", "run", "-C", sub, "--prompt", "x")
    assert r.returncode == 0, r.stderr
    prompt = system_text(fake)
    assert "ABOVE THE REPO" not in prompt
    assert prompt.index("REPO-RULE") < prompt.index("COPILOT-RULE") < prompt.index("SUB-RULE")
    assert prompt.count("SUB-RULE") == 1
    assert "--- ../../AGENTS.md ---" in prompt and "--- AGENTS.md ---" in prompt
    assert "project instructions: ../../AGENTS.md, ../../.github/copilot-instructions.md, AGENTS.md" in r.stderr


def test_instructions_are_read_through_the_jail_and_capped(cli, fake, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-KEY-MATERIAL\n")
    (cli.workdir / "AGENTS.md").symlink_to(secret)
    (cli.workdir / "CLAUDE.md").write_text("A" * 300 + "TAIL-NEVER-SENT")
    (cli.workdir / "fifo.md").parent.mkdir(exist_ok=True)
    os.mkfifo(str(cli.workdir / "fifo.md"))  # a reader would block forever on a FIFO
    (cli.tmp / "AGENTS.md").write_text("SHARED-PARENT: no git root or home above, so never read\n")
    cli.use(fake, instructions_files=["AGENTS.md", "fifo.md", "CLAUDE.md"], instructions_max_bytes=100)
    fake.add({"content": "ok"})
    r = cli.run("--verbose", "run", "--prompt", "x", timeout=20)
    assert r.returncode == 0, r.stderr
    prompt = system_text(fake)
    assert "SECRET-KEY-MATERIAL" not in prompt and "SHARED-PARENT" not in prompt
    assert "A" * 100 in prompt and "A" * 101 not in prompt and "TAIL-NEVER-SENT" not in prompt
    assert "AGENTS.md skipped: it leads outside" in r.stderr
    assert "fifo.md skipped: not a regular file" in r.stderr
    assert "CLAUDE.md cut at agent.instructions_max_bytes" in r.stderr


def test_parent_instructions_others_can_write_are_skipped(cli, fake):
    work = cli.home / "project"  # no git root: the walk stops at the home directory
    work.mkdir()
    (cli.home / "AGENTS.md").write_text("HOME-RULE\n")
    (cli.home / "AGENTS.md").chmod(0o666)
    (work / "AGENTS.md").write_text("PROJECT-RULE\n")
    cli.use(fake)
    fake.add({"content": "ok"}, {"content": "ok"})
    r = cli.run("--verbose", "run", "--prompt", "x", cwd=work)
    assert "PROJECT-RULE" in system_text(fake) and "HOME-RULE" not in system_text(fake)
    assert "../AGENTS.md skipped: others can write it" in r.stderr
    (cli.home / "AGENTS.md").chmod(0o644)
    cli.run("run", "--prompt", "x", cwd=work)
    assert system_text(fake, 1).index("HOME-RULE") < system_text(fake, 1).index("PROJECT-RULE")


def test_subagents_and_chat_get_the_instructions_too(cli, fake):
    (cli.workdir / "AGENTS.md").write_text("Always answer in French. FRENCH-RULE\n")
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("subagent", label="look", task_prompt="look around")]},
             {"content": "sub done"}, {"content": "summary"}, {"content": "fini"})
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 0, r.stderr
    assert all("FRENCH-RULE" in system_text(fake, i) for i in range(4))
    from ptyrun import PtyProcess
    fake.add({"content": "bonjour"})
    p = PtyProcess(cli.command("chat"), dict(cli.env, TERM="xterm"), str(cli.workdir))
    try:
        p.expect(r"\[PLANNING\]\[SAFE\] >> ")
        p.line("/status")
        p.expect(r"Instructions: +AGENTS\.md")
        p.line("salut")
        p.expect("bonjour")
        p.expect(r"\[PLANNING\]\[SAFE\] >> ")
        p.eof()
        assert p.wait() == 0
    finally:
        p.close()
    assert "FRENCH-RULE" in system_text(fake, -1)
