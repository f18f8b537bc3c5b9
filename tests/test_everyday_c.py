"""Everyday use, round 2 (issue 24): what a person sees and how fast a run starts. The CLI end to end against the
fake model server; what needs a terminal under a pseudo-terminal (tests/ptyrun.py)."""

import json
import re
import socket
import time

import pytest

from conftest import tool_call

PROVIDERS = [("ollama", "chat"), ("openai", "chat"), ("openai", "responses")]


# ---- one connection for a whole run ----


@pytest.mark.parametrize("provider,api", PROVIDERS)
def test_a_ten_turn_run_uses_one_connection(cli, fake, provider, api):
    (cli.workdir / "notes.txt").write_text("alpha\n")
    cli.use(fake, provider=provider, api=api)
    fake.add({"tool_calls": [tool_call("read_file", path="notes.txt")], "repeat": 9}, {"content": "read it nine times"})
    r = cli.run("run", "read notes.txt nine times")
    assert r.returncode == 0 and r.stdout == "read it nine times\n", r.stderr
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


# ---- auth status asks only the providers someone configured ----


def test_auth_status_asks_no_server_nobody_configured(cli, fake):
    from fake_model import FakeModel
    cli.write_config({"provider": {"type": "ollama", "ollama": {"host": fake.url}}})
    proxy = FakeModel().start()  # any request to a public host would go here (and nowhere else)
    try:
        r = cli.run("auth", "status", env={"https_proxy": proxy.url, "http_proxy": proxy.url})
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
    fake.add({"content": "Let me list the files first.", "tool_calls": [tool_call("terminal", command="ls nothere")]},
             {"content": "There is nothing called nothere."})
    p = pty(cli, "run", "-v", "is nothere here?", color=True)
    try:
        assert p.wait() == 0
    finally:
        p.close()
    seen = p.seen
    # streamed as it came, then (the reply asked for a tool) rewritten in place, dimmed
    assert "Let me list the files first.\r\n\x1b[1A\r\x1b[J\x1b[2mLet me list the files first.\x1b[0m" in seen
    assert re.search(r"\x1b\[33m  ✗ exit 2 · [\d.]+s: ls: cannot access 'nothere': No such file or directory", seen)
    assert "│ ls: cannot access 'nothere'" in seen  # --verbose: the last lines of its output
    assert "There is nothing called nothere.\r\n" in seen


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
