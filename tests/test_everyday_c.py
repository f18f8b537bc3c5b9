"""Everyday use, round 2 (issue 24): what a person sees and how fast a run starts. The CLI end to end against the
fake model server; what needs a terminal under a pseudo-terminal (tests/ptyrun.py)."""

import json
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
