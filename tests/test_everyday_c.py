"""Everyday use, round 2 (issue 24): what a person sees and how fast a run starts. The CLI end to end against the
fake model server; what needs a terminal under a pseudo-terminal (tests/ptyrun.py)."""

import json
import re
import socket
import time

import pytest

from conftest import tool_call, wait_for

PROVIDERS = [("ollama", "chat"), ("openai", "chat"), ("openai", "responses")]


# ---- one connection for a whole run ----


@pytest.mark.parametrize("provider,api", PROVIDERS)
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


# ---- the sandbox is prepared for the first command, not at start ----


def sandbox_helpers(pid):
    """The sandbox helper processes `pid` started (xzatoma_tools._sandbox_helper), still running."""
    from conftest import processes
    return [p for p, ppid, _, state, cmdline in processes() if ppid == pid and state != "Z"
            and b"_sandbox_helper" in cmdline]


def test_a_run_that_runs_no_command_waits_for_no_sandbox(cli, fake):
    """The helper (a third of a one-shot run's time) starts when a command is about to run: while the model
    is asked, a run that has run none has no helper; one that has, has it."""
    cli.use(fake)
    seen = {}

    def look(name):
        def at_request(body):
            seen[name] = sandbox_helpers(proc.pid)
        return at_request
    fake.add({"content": "hello", "expect": look("no command yet")})
    proc = cli.popen("run", "say hello")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out == "hello\n", err
    fake.add({"tool_calls": [tool_call("terminal", command="ls")], "expect": look("before the command")},
             {"content": "listed", "expect": look("after the command")})
    proc = cli.popen("run", "list the files")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out == "listed\n", err
    assert seen["no command yet"] == [] and seen["before the command"] == []
    assert len(seen["after the command"]) == 1  # the same look finds a helper when there is one


# ---- a host name that does not resolve fails at once ----


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


# ---- auth status asks only the providers someone configured ----


def test_auth_status_asks_no_server_nobody_configured(cli, fake):
    from fake_model import FakeModel
    cli.write_config({"provider": {"type": "ollama", "ollama": {"host": fake.url}}})
    proxy = FakeModel().start()  # any request to a public host would go here (and nowhere else)
    try:
        r = cli.run("auth", "status", env={"https_proxy": proxy.url, "http_proxy": proxy.url, "no_proxy": "",
                                           "NO_PROXY": ""})
    finally:
        proxy.stop()
    assert r.returncode == 0, r.stderr
    lines = dict((line.split()[0], line) for line in r.stdout.splitlines())
    assert "works: 5 models" in lines["ollama"]
    for name in ("copilot", "openai"):
        assert "not configured" in lines[name] and "nothing asked" in lines[name]
    assert proxy.connections == 0 and [q["path"] for q in fake.requests] == ["/api/tags"]
    asked = cli.run("auth", "status", "--provider", "openai", env={"https_proxy": "http://127.0.0.1:9"})
    assert asked.returncode == 1 and asked.stdout.startswith("openai   none                     fails: ")  # named: asked


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


# ---- start-up: what a run does not load ----


def imported(stderr):
    """The modules a run imported, from PYTHONPROFILEIMPORTTIME's report."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


def test_a_run_imports_keyring_only_where_it_holds_something(cli, fake):
    cli.use(fake, provider="openai").use_test_keyring()
    fake.add({"content": "one"}, {"content": "two"}, {"content": "three"}, {"content": "four"})
    first = cli.run("run", "x")  # no index yet: the keyring is asked once, and what it holds written down
    assert first.returncode == 0, first.stderr
    assert json.loads((cli.xz_home / "keyring-names.json").read_text()) == []
    second = cli.run("run", "x", env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert second.returncode == 0 and "keyring" not in imported(second.stderr)
    assert "authorization" not in fake.model_requests()[-1]["headers"]
    # a key stored by `auth login` is listed, so runs look for it
    assert cli.run("auth", "login", "--provider", "openai", input="sk-in-the-keyring-0123456789\n").returncode == 0
    assert json.loads((cli.xz_home / "keyring-names.json").read_text()) == ["openai_api_key"]
    third = cli.run("run", "x")
    assert third.returncode == 0
    assert fake.model_requests()[-1]["headers"]["authorization"] == "Bearer sk-in-the-keyring-0123456789"
    # one put there by another tool is found once `auth status` has looked in the keyring itself
    cli.run("auth", "logout", "--provider", "openai")
    cli.keyring_file.write_text(json.dumps({"xzatoma/openai_api_key": "sk-set-elsewhere-0123456789"}))
    assert cli.run("auth", "status").returncode == 0
    assert cli.run("run", "x").returncode == 0
    assert fake.model_requests()[-1]["headers"]["authorization"] == "Bearer sk-set-elsewhere-0123456789"


# ---- what a person sees: the answer streams, interim words dimmed, failures marked ----


def pty(cli, *args, rows=40, cols=120, color=False):
    from ptyrun import PtyProcess
    env = dict(cli.env, TERM="xterm")
    if color:
        env.pop("NO_COLOR")
    return PtyProcess(cli.command(*args), env, str(cli.workdir), rows=rows, cols=cols)


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


# ---- Ctrl-C: a clean prompt, and what was streamed is kept ----

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
PROMPT = r"\[%s\]\[%s\] >> "


def quiet_after(p, seconds=0.6):
    """What the program writes in the next `seconds` (the spinner redraws every 0.1 s: it would show)."""
    start = len(p.seen)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        p._read(deadline - time.monotonic())
    return p.seen[start:]


def person_messages(request):
    return [m for m in request["body"]["messages"] if not str(m.get("content")).startswith("<environment_context>")]


def test_ctrl_c_in_a_streamed_answer_keeps_it_and_leaves_a_clean_prompt(chat, fake):
    fake.add({"content": "Alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu.", "chunk_delay": 0.3},
             {"content": "fine"})
    p = chat()
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    p.line("recite")
    p.expect("Alpha beta")
    p.interrupt()
    p.expect("turn cancelled; the conversation is intact")
    p.expect(PROMPT % ("PLANNING", "SAFE"))
    assert not set(quiet_after(p)) & set(SPINNER)
    p.line("go on")
    p.expect("fine")
    messages = person_messages(fake.model_requests()[-1])
    kept = [m["content"] for m in messages if m["role"] == "assistant"]
    assert len(kept) == 1 and kept[0].startswith("Alpha beta") and kept[0].endswith(
        "[cut short: the user pressed Ctrl-C while this reply was arriving]")
    assert "lambda mu." not in kept[0]  # what had arrived, not the rest


def asked_to_run(chat, fake, command, then):
    """A chat in Write/Safe mode, its model proposing `command` (then answering `then`), at the question."""
    fake.add({"tool_calls": [tool_call("terminal", command=command)]}, {"content": then})
    p = chat("--mode", "write")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    p.line("do it")
    p.expect(r"/ \[e\]dit > ")
    return p


def test_ctrl_c_at_a_confirmation_leaves_no_spinner(chat, fake, cli):
    p = asked_to_run(chat, fake, "touch never.txt", "after")
    p.interrupt()
    p.expect("turn cancelled")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    assert not set(quiet_after(p)) & set(SPINNER)
    assert not (cli.workdir / "never.txt").exists()


def test_ctrl_c_during_a_command_leaves_a_clean_prompt(chat, fake, cli):
    """Asked, approved, running: Ctrl-C stops the command and the spinner that ran beside it."""
    p = asked_to_run(chat, fake, "echo $$ > pgid; sleep 30", "next fine")
    p.line("y")
    assert wait_for(lambda: (cli.workdir / "pgid").exists() and (cli.workdir / "pgid").read_text().strip())
    p.expect(r"[%s] terminal \d+s" % SPINNER)  # the spinner ticks while the command runs
    p.interrupt()
    p.expect("turn cancelled; the conversation is intact")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    assert not set(quiet_after(p)) & set(SPINNER)
    from test_terminal import group_gone
    assert group_gone(int((cli.workdir / "pgid").read_text()))
    p.line("and now?")
    p.expect("next fine")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    assert [m["content"] for m in fake.model_requests()[-1]["body"]["messages"] if m["role"] == "tool"] == [
        "Error: cancelled by user"]


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


# ---- [e]dit: what ran is what the model and the store are told ----


def test_an_edited_command_is_what_the_model_and_the_store_see(chat, fake, cli):
    p = asked_to_run(chat, fake, "touch wanted.txt", "ran edited")
    p.line("e")
    p.expect("edit the command > touch wanted.txt")  # the line starts from the proposed command
    p.line("\x15touch edited.txt; cat nothere")  # Ctrl-U: a new line, which fails where the original would not
    p.expect(r"✗ ran as you edited it: touch edited.txt; cat nothere · exit 1 · [\d.]+s: cat: nothere")
    p.expect("ran edited")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    p.eof()
    assert p.wait() == 0
    assert (cli.workdir / "edited.txt").exists() and not (cli.workdir / "wanted.txt").exists()
    result = [m["content"] for m in fake.model_requests()[-1]["body"]["messages"] if m["role"] == "tool"][0]
    assert result.startswith("The user edited the command before it ran; it ran as: touch edited.txt; cat nothere\n"
                             "exit code: 1"), result
    conv = json.loads(cli.run("history", "list", "--json").stdout)[0]
    assert "it ran as: touch edited.txt; cat nothere" in cli.run("history", "show", conv["id"]).stdout
    assert "it ran as: touch edited.txt; cat nothere" in cli.run("replay", conv["id"]).stdout
    kept = (cli.xz_home / "chat_history").read_text().split("\n")
    assert kept[1:] == ["do it", ""]  # neither the answer 'e' nor the edited command


# ---- readline history: messages whole, answers never ----


def test_history_keeps_whole_messages_and_no_answers(chat, fake, cli):
    fake.add({"tool_calls": [tool_call("terminal", command="touch a.txt")]}, {"content": "one"},
             {"content": "two"}, {"content": "three"})
    p = chat("--mode", "write")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    p.line("make a file")
    p.expect(r"/ \[e\]dit > ")
    p.line("y")
    p.expect("one")
    p.send("\x1b[200~first pasted line\nsecond pasted line\x1b[201~\r")
    p.expect("two")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    p.eof()
    assert p.wait() == 0
    kept = (cli.xz_home / "chat_history").read_text().split("\n")
    assert kept[1:] == ["make a file", "first pasted line\\nsecond pasted line", ""]  # no 'y'
    p = chat("--mode", "write")
    p.expect(PROMPT % ("WRITE", "SAFE"))
    p.send("\x1b[A")  # the pasted message comes back whole
    p.expect("second pasted line")
    p.send("\r")
    p.expect("three")
    assert person_messages(fake.model_requests()[-1])[-1]["content"] == "first pasted line\nsecond pasted line"


# ---- a long command on a short terminal is shown, never declined unasked ----


def test_a_long_command_on_a_short_terminal_is_folded_or_paged(cli, fake):
    from ptyrun import PtyProcess
    spaced = "touch folded.txt #" + " " * 20000 + "ls -la"
    script = "\n".join("echo line %d >> paged.txt" % i for i in range(30))
    fake.add({"tool_calls": [tool_call("terminal", command=spaced)]}, {"content": "folded ran"},
             {"tool_calls": [tool_call("terminal", command=script)]}, {"content": "paged ran"})
    cli.use(fake)
    p = PtyProcess(cli.command("chat", "--mode", "write"), dict(cli.env, TERM="xterm"), str(cli.workdir), rows=14,
                   cols=60)
    try:
        p.expect(PROMPT % ("WRITE", "SAFE"))
        p.line("fold it")
        p.expect("touch folded.txt #⟨20000 spaces⟩ls -la")  # all of it on one line, the blanks counted
        p.expect(r"\[e\]dit > ")
        p.line("y")
        p.expect("folded ran")
        p.line("page it")
        p.expect(r"-- rows 1-12 of 30 of this command; Enter shows more --")
        p.line("")
        p.expect(r"-- rows 13-24 of 30")
        p.line("")
        p.expect("echo line 29 >> paged.txt")
        p.expect(r"\[e\]dit > ")
        p.line("y")
        p.expect("paged ran")
    finally:
        p.close()
    assert (cli.workdir / "folded.txt").exists() and (cli.workdir / "paged.txt").read_text().count("line") == 30
    assert "declined" not in p.seen


# ---- the command line: the words after the options are the prompt ----


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


def test_bare_xzatoma_opens_a_chat_and_text_starts_one(cli, fake):
    cli.use(fake)
    fake.add({"content": "four"})
    p = pty(cli)
    try:
        p.expect("XZatoma Interactive Chat Mode - Welcome!")
        p.expect(PROMPT % ("PLANNING", "SAFE"))
        p.eof()
        assert p.wait() == 0
    finally:
        p.close()
    p = pty(cli, "what", "is", "2+2?")
    try:
        p.expect(PROMPT % ("PLANNING", "SAFE") + r"what is 2\+2\?")
        p.expect("four")
        p.expect(PROMPT % ("PLANNING", "SAFE"))  # and the chat goes on
        p.eof()
        assert p.wait() == 0
    finally:
        p.close()
    assert person_messages(fake.model_requests()[0])[-1]["content"] == "what is 2+2?"


# ---- /context and run's summary count the same ----


def test_chat_context_agrees_with_the_runs_own_count(cli, fake):
    import subprocess
    (cli.workdir / "notes.txt").write_text("alpha\n" * 300)
    cli.use(fake)
    script = [{"tool_calls": [tool_call("read_file", path="notes.txt")]}, {"content": "ok"}]
    fake.add(*script)
    r = cli.run("run", "read notes.txt")
    run = re.search(r"([\d,]+) tokens \(([\d,]+) in / ([\d,]+) out\) · context ~([\d,]+)", r.stderr).groups()
    fake.add(*script)
    c = subprocess.run(cli.command("chat", "--mode", "write"), input="read notes.txt\n/context\n", text=True,
                       capture_output=True, env=cli.env, cwd=str(cli.workdir), timeout=60)
    session = re.search(r"this session: ([\d,]+) tokens \(([\d,]+) in / ([\d,]+) out\) over 2 model calls", c.stderr)
    now = re.search(r"context now: ~([\d,]+) tokens", c.stderr)
    assert session and now, c.stderr
    assert session.groups() + now.groups() == run
    assert "context ~%s" % run[3] in c.stderr  # the footer says the same


def test_help_and_history_import_only_what_they_show(cli, fake):
    for args in (["--help"], ["run", "--help"], ["chat", "--help"]):
        r = cli.run(*args, env={"PYTHONPROFILEIMPORTTIME": "1"})
        assert r.returncode == 0 and "usage:" in r.stdout
        loaded = imported(r.stderr)
        assert not loaded & {"xzatoma_tools", "xzatoma_skills", "xzatoma_plans", "xzatoma_store", "json",
                             "sqlite3", "difflib", "http.client"}, args
    fake.add({"content": "stored"})
    assert cli.run("run", "--provider", "ollama", "x", env={"OLLAMA_HOST": fake.url}).returncode == 0
    cid = json.loads(cli.run("history", "list", "--json").stdout)[0]["id"]
    for args in (["history", "list"], ["history", "show", cid], ["replay", cid]):
        r = cli.run(*args, env={"PYTHONPROFILEIMPORTTIME": "1"})
        assert r.returncode == 0 and cid[:12] in r.stdout, r.stderr[-300:]
        loaded = imported(r.stderr)
        assert "sqlite3" in loaded and not loaded & {"xzatoma_tools", "xzatoma_skills", "xzatoma_plans",
                                                     "http.client", "ssl", "keyring", "yaml"}, args


def test_the_plain_file_start_compiles_nothing_it_can_cache(cli, tmp_path):
    """python3 xzatoma.py: the script Python is given is compiled at every start; it is a launcher of a few
    lines, and the program comes from cached bytecode from the second start on."""
    import os
    import shutil
    import subprocess
    import sys
    from conftest import ROOT
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in os.listdir(ROOT):
        if name.startswith("xzatoma") and name.endswith(".py"):
            shutil.copy(os.path.join(ROOT, name), str(plain / name))
    assert len((plain / "xzatoma.py").read_text().splitlines()) < 30
    env = {k: v for k, v in cli.env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    first = subprocess.run([sys.executable, str(plain / "xzatoma.py"), "--version"], capture_output=True, text=True,
                           env=env, cwd=str(cli.workdir))
    second = subprocess.run([sys.executable, "-v", str(plain / "xzatoma.py"), "--version"], capture_output=True,
                            text=True, env=env, cwd=str(cli.workdir))
    assert first.stdout == second.stdout and first.stdout.startswith("xzatoma ")
    assert re.search(r"code object from '[^']*__pycache__/xzatoma_core\.[^']*\.pyc'", second.stderr)


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


def test_the_readme_starts_with_an_install_and_a_test_command_that_go_together():
    """Its first two commands: pipx's isolated virtualenv has no pytest, so the test command must run the
    interpreter the install command gave the test extra to."""
    import os
    from conftest import ROOT
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        install, test = [line.split("#")[0].strip() for line in fh.read().split("\n")[2:4]]
    assert install == 'python3 -m venv .venv && .venv/bin/pip install ".[test]"'
    assert test == ".venv/bin/python -m pytest"
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as fh:
        extra = re.search(r"^test = \[(.*)\]$", fh.read(), re.M).group(1)
    assert '"pytest' in extra


def test_start_up_holds_the_collector_back_only_until_the_work_starts(cli, fake):
    """Start-up's long-lived objects are not scanned over and over (bench/startup.py measures what that
    saves); the collector's own threshold is back once the work starts, and after a command that never
    got to work (in-process callers)."""
    import gc
    import xzatoma
    before = gc.get_threshold()
    xzatoma._startup_begins()
    try:
        assert gc.get_threshold()[0] == max(before[0], xzatoma.STARTUP_GC_THRESHOLD)
    finally:
        frozen = gc.get_freeze_count()
        xzatoma.startup_over()
    assert gc.get_threshold() == before and gc.get_freeze_count() >= frozen
    gc.unfreeze()
    assert xzatoma.main(["config", "path", "--config", str(cli.tmp / "c.yaml")]) == 0  # prints a path
    assert gc.get_threshold() == before
    # a run: the threshold is the interpreter's again from the agent loop on (its first model call)
    import os
    cli.use(fake)
    script = cli.tmp / "threshold.py"
    script.write_text("import gc, sys\nsys.path.insert(0, %r)\nimport xzatoma_core\n"
                      "seen = []\nstep = xzatoma_core.Agent.step\n"
                      "def spy(self, *a, **k):\n    seen.append(gc.get_threshold())\n    return step(self, *a, **k)\n"
                      "xzatoma_core.Agent.step = spy\ncode = xzatoma_core.main(['run', 'hi'])\n"
                      "sys.stderr.write('THRESHOLDS %%r %%r\\n' %% (seen, gc.get_threshold()))\nsys.exit(code)\n"
                      % os.path.dirname(xzatoma.__file__))
    fake.add({"content": "hello"})
    import subprocess
    import sys
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=cli.env,
                       cwd=str(cli.workdir), timeout=60)
    assert r.returncode == 0 and r.stdout == "hello\n", r.stderr
    seen = re.search(r"THRESHOLDS (.*)", r.stderr).group(1)
    assert seen == "[%r] %r" % (before, before), seen
