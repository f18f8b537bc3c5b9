"""Credentials: the device flow, keyring and 0600 file storage, refresh, env overrides, models, secret hygiene."""

import json
import os
import stat
import time

import pytest

from conftest import tool_call
from xzatoma import next_poll_interval


def login(cli, *extra, **kw):
    return cli.run("auth", "login", "--provider", "copilot", *extra, **kw)


def requests_to(fake, path):
    return [r for r in fake.requests if r["path"] == path]


def test_device_flow_pending_then_success_stores_in_the_keyring(cli, fake):
    cli.use(fake, provider="copilot", github=True).use_test_keyring()
    fake.device_responses = [{"error": "authorization_pending"}, {"error": "authorization_pending"}]
    r = login(cli)
    assert r.returncode == 0, r.stderr
    assert "open %s/login/device and enter the code WDJB-MJHT" % fake.url in r.stderr
    assert "stored in the system keyring" in r.stderr
    polls = requests_to(fake, "/login/oauth/access_token")
    assert len(polls) == 3 and polls[0]["body"]["device_code"] == "dev-code-1"
    assert polls[0]["body"]["grant_type"] == "urn:ietf:params:oauth:grant-type:device_code"
    code_request = requests_to(fake, "/login/device/code")[0]
    assert code_request["body"] == {"client_id": "Iv1.b507a08c87ecfe98", "scope": "read:user"}
    assert code_request["headers"]["accept"] == "application/json"
    exchange = requests_to(fake, "/copilot_internal/v2/token")[0]
    assert exchange["headers"]["authorization"] == "token " + fake.github_token
    stored = json.loads(cli.keyring_file.read_text())
    assert stored["xzatoma/github_token"] == fake.github_token
    assert json.loads(stored["xzatoma/copilot_token"])["token"] == fake.issued[0]
    assert not (cli.xz_home / "credentials.json").exists()

    fake.copilot_valid = set(fake.issued)
    fake.add({"content": "hello from copilot"})
    r = cli.run("run", "--prompt", "hi")
    assert r.returncode == 0 and r.stdout == "hello from copilot\n", r.stderr
    assert fake.model_requests()[-1]["headers"]["authorization"] == "Bearer " + fake.issued[0]
    status = cli.run("auth", "status", "--provider", "copilot")
    assert status.returncode == 0 and status.stdout.startswith("copilot  keyring")
    assert "works: 5 models · Copilot token expires" in status.stdout
    assert status.stdout.splitlines()[-1] == "stored credentials go to the system keyring (service 'xzatoma')"


def test_slow_down_expiry_and_denial(cli, fake):
    cli.use(fake, provider="copilot", github=True)
    fake.device_responses = [{"error": "slow_down", "interval": 0}, {"error": "authorization_pending"}]
    assert login(cli).returncode == 0
    fake.device_responses = [{"error": "expired_token"}]
    r = login(cli)
    assert r.returncode == 1 and "the login code expired before it was used; run 'xzatoma auth login' again" in r.stderr
    fake.device_responses = [{"error": "access_denied"}]
    (cli.xz_home / "credentials.json").unlink()
    r = login(cli)
    assert r.returncode == 1 and "the authorisation was declined on GitHub; nothing was stored" in r.stderr
    assert not (cli.xz_home / "credentials.json").exists()


def test_slow_down_adds_five_seconds_unless_told():
    assert next_poll_interval(5, {"error": "slow_down"}) == 10
    assert next_poll_interval(5, {"error": "slow_down", "interval": 12}) == 12
    assert next_poll_interval(5, {"error": "authorization_pending"}) == 5


def test_file_fallback_is_0600_and_refused_when_readable(cli, fake):
    cli.use(fake, provider="copilot", github=True)
    r = login(cli)
    assert r.returncode == 0
    path = cli.xz_home / "credentials.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert r.stderr.count("no system keyring works here; credentials are stored in %s (mode 0600)" % path) == 1
    assert fake.github_token not in r.stderr + r.stdout
    os.chmod(path, 0o644)
    fake.add({"content": "never"})
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 2 and "is readable by other users (mode 0o644)" in r.stderr and "chmod 600" in r.stderr
    assert fake.model_requests() == []


def test_expired_copilot_token_is_refreshed_before_use(cli, fake):
    cli.use(fake, provider="copilot", github=True, model="gpt-4.1").use_test_keyring()
    cli.keyring_file.write_text(json.dumps({
        "xzatoma/github_token": fake.github_token,
        "xzatoma/copilot_token": json.dumps({"token": "tid=old", "expires_at": time.time() + 30, "api": fake.url})}))
    fake.copilot_valid = set()
    fake.add({"content": "fresh"})
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 0 and r.stdout == "fresh\n", r.stderr
    assert len(fake.issued) == 1
    assert fake.model_requests()[0]["headers"]["authorization"] == "Bearer " + fake.issued[0]
    stored = json.loads(json.loads(cli.keyring_file.read_text())["xzatoma/copilot_token"])
    assert stored["token"] == fake.issued[0]


def test_401_refreshes_once_and_retries_once(cli, fake):
    cli.use(fake, provider="copilot", github=True, model="gpt-4.1").use_test_keyring()
    cli.keyring_file.write_text(json.dumps({
        "xzatoma/github_token": fake.github_token,
        "xzatoma/copilot_token": json.dumps({"token": "tid=revoked", "expires_at": time.time() + 3600})}))
    fake.copilot_valid = set()  # the stored token was revoked on the server
    fake.add({"content": "after refresh"})
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 0 and r.stdout == "after refresh\n", r.stderr
    auths = [q["headers"]["authorization"] for q in fake.requests if q["path"] in ("/models", "/chat/completions")]
    assert auths[0] == "Bearer tid=revoked" and auths[1:] == ["Bearer " + fake.issued[0]] * (len(auths) - 1)
    assert len(fake.issued) == 1


class Refusing(set):
    """A server that refuses every Copilot token, even fresh ones."""

    def add(self, item):
        pass


def test_a_refused_fresh_token_ends_with_a_login_hint(cli, fake):
    cli.use(fake, provider="copilot", github=True, model="gpt-4.1").use_test_keyring()
    cli.keyring_file.write_text(json.dumps({
        "xzatoma/github_token": fake.github_token,
        "xzatoma/copilot_token": json.dumps({"token": "tid=revoked", "expires_at": time.time() + 3600})}))
    fake.copilot_valid = Refusing()
    fake.add({"content": "never"})
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 2 and "rejected the credentials (HTTP 401" in r.stderr and "xzatoma auth login" in r.stderr
    assert len(fake.issued) == 1, "one refresh after the first 401, none after the fresh token was refused too"


def test_environment_overrides_bypass_storage(cli, fake):
    cli.use(fake, provider="copilot", github=True, model="gpt-4.1")
    fake.copilot_valid = set()
    fake.add({"content": "via GITHUB_TOKEN"})
    r = cli.run("run", "--prompt", "x", env={"GITHUB_TOKEN": fake.github_token})
    assert r.returncode == 0 and r.stdout == "via GITHUB_TOKEN\n", r.stderr
    assert not (cli.xz_home / "credentials.json").exists()
    fake.copilot_valid = None
    fake.add({"content": "via COPILOT_API_TOKEN"})
    r = cli.run("run", "--prompt", "x", env={"COPILOT_API_TOKEN": "tid=ready-made"})
    assert r.stdout == "via COPILOT_API_TOKEN\n"
    assert fake.model_requests()[-1]["headers"]["authorization"] == "Bearer tid=ready-made"
    assert len(fake.issued) == 1
    cli.use(fake, provider="ollama")
    fake.add({"content": "ollama"})
    cli.run("run", "--prompt", "x", env={"OLLAMA_API_KEY": "ollama-key-123"})
    assert fake.model_requests()[-1]["headers"]["authorization"] == "Bearer ollama-key-123"


def test_missing_copilot_credentials_exit_2(cli, fake):
    cli.use(fake, provider="copilot", github=True)
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 2 and "no Copilot credentials: run 'xzatoma auth login' or set COPILOT_API_TOKEN" in r.stderr


def test_openai_key_login_status_logout(cli, fake):
    cli.use(fake, provider="openai")
    r = cli.run("auth", "login", "--provider", "openai", input="sk-stored-key-abcdefghijklmnop\n")
    assert r.returncode == 0 and "stored the openai API key" in r.stderr
    fake.add({"content": "ok"})
    assert cli.run("run", "--prompt", "x").returncode == 0
    assert fake.model_requests()[-1]["headers"]["authorization"] == "Bearer sk-stored-key-abcdefghijklmnop"
    status = cli.run("auth", "status")
    lines = dict((l.split()[0], l) for l in status.stdout.splitlines())
    assert "openai   file" in lines["openai"] and "works: 5 models" in lines["openai"]
    assert lines["ollama"].startswith("ollama   none")
    assert "no Copilot credentials" in lines["copilot"]
    assert status.stdout.splitlines()[-1] == ("stored credentials go to %s (mode 0600): no system keyring backend "
                                              "works here" % (cli.xz_home / "credentials.json"))
    assert "sk-stored" not in status.stdout + status.stderr
    r = cli.run("auth", "status", env={"OPENAI_API_KEY": "sk-env-key-abcdefghijklmnopq"})
    assert "env OPENAI_API_KEY" in r.stdout
    r = cli.run("auth", "logout", "--provider", "openai")
    assert r.returncode == 0 and "removed stored openai credentials (file)" in r.stderr
    assert cli.run("auth", "logout", "--provider", "openai").stderr.strip() == "no stored openai credentials"
    assert cli.run("auth", "login", "--provider", "openai", input="\n").returncode == 2


@pytest.mark.parametrize("provider", ["ollama", "openai", "copilot"])
def test_models_on_each_provider(cli, fake, provider):
    cli.use(fake, provider=provider, model={"ollama": "qwen3", "openai": "gpt-test", "copilot": "gpt-4.1"}[provider])
    r = cli.run("models", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    rows = {m["id"]: m for m in data["models"]}
    configured = [m["id"] for m in data["models"] if m["configured"]]
    assert configured == [data["configured"]]
    assert rows["llama3.2:3b"]["context_window"] == 131072
    if provider == "ollama":
        assert rows["qwen3"]["tools"] is True and rows["qwen3"]["context_window"] == 32768
    else:
        assert rows["gpt-4.1"]["tools"] is True and rows["gpt-5.3-codex"]["context_window"] == 264000
    before = len(fake.requests)
    table = cli.run("models")
    assert len(fake.requests) == before, "the second listing should come from the 5-minute cache"
    assert table.stdout.splitlines()[0].split() == ["MODEL", "CONTEXT", "TOOLS"]
    assert any(line.startswith("* ") for line in table.stdout.splitlines())
    cli.run("models", "--refresh")
    assert len(fake.requests) > before


def test_secrets_never_leak(cli, fake):
    cli.use(fake, provider="copilot", github=True, model="gpt-4.1")
    fake.copilot_valid = set()
    outputs = [login(cli, "--verbose")]
    fake.add({"tool_calls": [tool_call("terminal", command="env"), tool_call("write_file", path="a.txt", content="x")]},
             {"status": 401}, {"content": "done"})
    outputs.append(cli.run("--verbose", "run", "--allow-dangerous", "--json", "--prompt", "x",
                           env={"OPENAI_API_KEY": "sk-never-show-me-0123456789"}))
    outputs.append(cli.run("auth", "status", "--verbose"))
    outputs.append(cli.run("history", "show", json.loads(outputs[1].stdout)["conversation_id"], "--full"))
    secrets = [fake.github_token] + fake.issued + ["sk-never-show-me-0123456789"]
    assert len(fake.issued) >= 2
    for out in outputs:
        for secret in secrets:
            assert secret not in out.stdout and secret not in out.stderr
    env_result = [m["content"] for m in fake.model_requests()[1]["body"]["messages"] if m["role"] == "tool"][0]
    assert "PATH=" in env_result and not any(s in env_result for s in secrets)
    for path in cli.xz_home.rglob("*"):
        if path.is_file() and path.name != "credentials.json":
            data = path.read_bytes()
            for secret in secrets:
                assert secret.encode() not in data, "%s leaked into %s" % (secret[:8], path.name)


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
