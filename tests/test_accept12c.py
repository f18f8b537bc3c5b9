"""Acceptance attacks on the terminal's side of issue 12: protected paths kept read-only by the sandbox and
noticed by its ProtectedWatch when commands create them, special files and deadlines through commands, and the
process's own credentials kept from commands. Each attack is the command a prompt-injected model would send,
run end to end through the CLI with --allow-dangerous (only the sandbox and the watch stand in the way), with
harmless payloads: marker files in tmp dirs."""

import json
import os
import subprocess

import pytest

from conftest import tool_call
from test_file_safety import HEADLESS, tool_results
from xzatoma_tools import landlock_abi

pytestmark = pytest.mark.skipif(not landlock_abi(), reason="the kernel has no Landlock: nothing to attack")


def configure(cli, fake, **agent):
    """The fake model as provider, with agent settings merged in (tools:, terminal:)."""
    cli.use(fake)
    import yaml
    cfg = yaml.safe_load(cli.config_path.read_text())
    cfg.setdefault("agent", {}).update(agent)
    cli.write_config(cfg)


def run_commands(cli, fake, *commands, flags=(), env=None, timeout=90, code=0):
    """One terminal call per command, one turn each, then an answer; the CLI result and the tool results."""
    for command in commands:
        fake.add({"tool_calls": [tool_call("terminal", command=command)]})
    fake.add({"content": "done"})
    r = cli.run("run", "--allow-dangerous", "--prompt", "x", *flags, env=env, timeout=timeout)
    assert r.returncode == code, r.stderr
    return r, tool_results(fake)


def script(cli, name, body):
    (cli.workdir / name).write_text(body)
    return "sh " + name


# ---- credentials: never in a command's environment ----

@pytest.mark.parametrize("source", ["env", "keyring", "file"])
def test_no_credential_reaches_a_command_even_when_every_name_is_passed_through(cli, fake, source):
    key, cfg_key = "provider-key-%s-0001-plainvalue" % source, "config-held-0004-plainvalue"
    cli.use(fake, provider="openai")
    import yaml
    cfg = yaml.safe_load(cli.config_path.read_text())
    cfg["xzepr"] = {"api_key": cfg_key}
    cfg["agent"] = {"terminal": {"env_passthrough": ["*"]}}
    cli.write_config(cfg)
    env = {"PROXY_URL": "http://me:%s@127.0.0.1:9/" % key, "AUTH_HEADER": "Bearer " + key,
           "PLAIN_COPY": "x" + key, "ENCODED": "http://me:%s@h/" % key.replace("-", "%2D"), "CFG_COPY": cfg_key}
    if source == "env":
        env["OPENAI_API_KEY"] = key
    elif source == "keyring":
        cli.use_test_keyring()
        cli.keyring_file.write_text(json.dumps({"xzatoma/openai_api_key": key}))
    else:
        fd = os.open(str(cli.xz_home / "credentials.json"), os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"openai_api_key": key}, fh)
    # the command writes what it got to a file in the tree: the bytes on disk are not redacted
    cmd = script(cli, "dump.sh", "env > env.txt; cat /proc/self/environ > environ.bin; "
                                 "cat %s %s %s > stolen.txt 2>&1; echo dumped\n"
                 % (cli.xz_home / "credentials.json", cli.tmp / "keyring.json", cli.config_path))
    r, [out] = run_commands(cli, fake, cmd, env=env)
    assert fake.model_requests()[0]["headers"]["authorization"] == "Bearer " + key  # the key was in use
    assert "dumped" in out, out
    dumped = (cli.workdir / "env.txt").read_bytes() + (cli.workdir / "environ.bin").read_bytes() + \
        (cli.workdir / "stolen.txt").read_bytes()
    assert b"PATH=" in dumped and b"Permission denied" in dumped  # the dump really happened
    for secret in (key, key.replace("-", "%2D"), cfg_key):
        assert secret.encode() not in dumped, secret
        assert secret not in out and secret not in r.stdout + r.stderr, secret
