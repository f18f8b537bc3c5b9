"""Secrets and file modes: credentials never reach the store, a terminal or a log; XZATOMA_HOME is private.

Tokens here are fake but have the real shapes; the store is checked as FILE BYTES (the database and its
write-ahead log), so an index or a journal cannot keep what the tables do not.
"""

import json
import os
import re
import stat

import pytest

from conftest import assert_clean, needs_landlock, run_calls, run_commands, script, tool_call, tool_results, wait_for
from xzatoma_store import REDACTED, redact, redaction_spans, register_secret

# one token per family: (family, value)
TOKENS = [
    ("aws-id", "AKIAIOSFODNN7EXAMPLQ"),
    ("aws-secret", "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEQ"),
    ("stripe", "sk_live_4eC39HqLyjWDarjtT1zdp7dQ"),
    ("stripe-restricted", "rk_live_51H8abcdefghijklmnopqrsT"),
    ("slack", "xoxb-2048-4096-abcdefghijklmnopqrsT"),
    ("gitlab", "glpat-xYz12345678901234567890"),
    ("github", "ghp_abcdefghijklmnopqrstuvwxyz0123456789"),
    ("github-fine", "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz"),
    ("huggingface", "hf_abcdefghijklmnopqrstuvwxyzABCD"),
    ("npm", "npm_abcdefghijklmnopqrstuvwxyz0123456789"),
    ("google", "AIzaSyDdI0hCZtE6vySjMm-WEfRq3CPzqKqqsHI"),
    ("openai", "sk-proj-abcdefghijklmnopqrstuvwx1234"),
    ("anthropic", "sk-ant-api03-abcdefghijklmnopqrstuvwxyz-0123456789"),
    ("jwt", "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6y"),
    ("bearer", "Authorization: Bearer 0a1b2c3d4e5f6a7b8c9d"),
    ("basic", "Authorization: Basic dXNlcjpodW50ZXIyaHVudGVyMg=="),
    ("url", "postgres://admin:Tr0ub4dor3xyz@db.internal:5432/app"),
    ("docker", "dckr_pat_2b3e36beeb386dfdaacb9b46004ccb7c"),
    ("linear", "lin_api_abcdefghijklmnopqrstuvwxyz0123456789ABCD"),
    ("notion", "ntn_123456789012abcdefghijklmnopqrstuvwxyzABCDEFGH"),
    ("postman", "PMAK-5f8a1b2c3d4e5f6a7b8c9d0e-0123456789abcdef0123456789abcdef01"),
    ("square", "sq0atp-abcdefghijklmnopqrstuv"),
    ("groq", "gsk_abcdefghijklmnopqrstuvwxyz0123456789ABCD"),
    ("xai", "xai-abcdefghijklmnopqrstuvwxyz0123456789ABCD"),
    ("replicate", "r8_abcdefghijklmnopqrstuvwxyz0123456789"),
    ("doppler", "dp.st.dev.abcdefghijklmnopqrstuvwxyz0123456789"),
    ("mailgun", "key-0123456789abcdef0123456789abcdef"),
    ("twilio", "SK0123456789abcdef0123456789abcdef"),
    ("azure", "AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="),
    ("discord", "MTA4NzY1NDMyMTA5ODc2NTQzMg.GhIjKl.abcdefghijklmnopqrstuvwxyz0123456"),
]
PEM = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA1c2VjcmV0a2V5bWF0ZXJpYWwxMjM0NTY3ODkw\n"
       "c2Vjb25kbGluZW9mdGhla2V5bWF0ZXJpYWwxMjM0NTY3ODkwYWJj\n-----END RSA PRIVATE KEY-----")
#: the same key as kubeconfig's client-key-data holds it (round 18a: stored whole)
PEM64 = __import__("base64").b64encode(PEM.encode()).decode()
#: round 18e: a Secret holding a kubeconfig (base64 twice), and base64 wrapped in an indented YAML block
PEM64TWICE = __import__("base64").b64encode(("users:\n- user:\n    client-key-data: " + PEM64 * 3).encode()).decode()
PEM64YAML = "key: |\n" + "\n".join("    " + line for line in __import__("base64").encodebytes(
    (PEM * 3).encode()).decode().splitlines())


def secret_part(value):
    """What must disappear: the whole token, or what follows its label."""
    for label in ("aws_secret_access_key=", "Authorization: Bearer ", "Authorization: Basic ", "AccountKey="):
        if value.startswith(label):
            return value[len(label):]
    if value.startswith("postgres://"):
        return "Tr0ub4dor3xyz"
    return value


@pytest.mark.parametrize("family,value", TOKENS + [("pem", PEM), ("pem-base64", PEM64)])
def test_each_token_family_is_redacted(family, value):
    text = "before %s after" % value
    out = redact(text)
    assert secret_part(value) not in out, family
    assert out.startswith("before ") and out.endswith(" after") and REDACTED in out
    # also inside JSON text (tool-call arguments are stored as JSON)
    assert secret_part(value).split("\n")[1 if family == "pem" else 0] not in redact(json.dumps({"v": text}))


def test_the_quick_look_at_short_text_misses_no_shape(monkeypatch):
    """Short text is first looked at once for any shape's trigger (issue 22: most of what a run stores is short,
    and a test per trigger cost 36 us each time); what it then redacts is what testing every trigger does."""
    import xzatoma_store
    xzatoma_store._compile()
    tail = "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    texts = ["done", "ok: " + tail] + [form % (t, tail) for ts, _ in xzatoma_store.TOKEN_SHAPES for t in ts
                                       for form in ("%s%s", "x %s %s", "%s=%s\n", '"%s": "%s"')]
    texts += [t.upper() for t in texts]
    texts = [t for t in texts if len(t) <= xzatoma_store.SHORT_TEXT]
    monkeypatch.setattr(xzatoma_store, "QUICK_AFTER", 0)
    quick = [redact(t) for t in texts]
    monkeypatch.setattr(xzatoma_store, "SHORT_TEXT", -1)
    assert quick == [redact(t) for t in texts]
    assert sum(REDACTED in t for t in quick) > 100  # the corpus does hold secrets (of many shapes)


def test_ordinary_text_is_left_alone():
    for text in ("token = get_token()", "password = request.form['password']", "the tokens: 12345678901234",
                 "see https://example.com/a:b@c?", "sk-learn is a library", "eyJ is how JWTs start",
                 "def api_key(self): return self._key"):
        assert redact(text) == text


def test_known_secrets_of_eight_characters_or_more_are_redacted():
    register_secret("short7!")  # too short: would redact ordinary words
    register_secret("a-known-value-42")
    assert redact("short7! and a-known-value-42") == "short7! and [REDACTED]"
    assert redact("url a-known-value-42 in json \"a-known-value-42\"") == "url [REDACTED] in json \"[REDACTED]\""


def db_bytes(cli):
    data = b""
    for name in ("conversations.db", "conversations.db-wal"):
        path = cli.xz_home / name
        if path.exists():
            data += path.read_bytes()
    assert data
    return data


def test_token_shapes_never_reach_the_database_or_history(cli, fake):
    cli.use(fake, terminal={"default_mode": "restricted_autonomous"})
    everything = "\n".join(v for _, v in TOKENS) + "\n" + PEM + "\nclient-key-data: " + PEM64
    (cli.workdir / "creds.txt").write_text(everything + "\n")
    fake.add({"tool_calls": [tool_call("read_file", path="creds.txt")]},
             {"tool_calls": [tool_call("terminal", command="echo %s" % TOKENS[0][1])]},
             {"content": "here they are:\n" + everything})
    r = cli.run("run", "--json", "--prompt", "my keys: " + " ".join(v for _, v in TOKENS))
    assert r.returncode == 0, r.stderr
    cid = json.loads(r.stdout)["conversation_id"]
    shown = cli.run("history", "show", "--full", cid).stdout + cli.run("history", "show", "--json", cid).stdout \
        + cli.run("replay", cid).stdout
    data = db_bytes(cli)
    audit = (cli.xz_home / "audit.log").read_text()
    for family, value in TOKENS + [("pem", PEM), ("pem-base64", PEM64[20:])]:
        part = secret_part(value)
        needle = part.split("\n")[1] if family == "pem" else part
        assert needle.encode() not in data, family
        assert needle not in shown, family
        assert needle not in r.stdout and needle not in r.stderr, family  # the answer too, and --json
        assert needle not in audit, family


def write_credentials(cli, data):
    path = cli.xz_home / "credentials.json"
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)


def test_a_stored_key_echoed_in_a_401_reaches_no_output(cli, fake):
    key = "plain-stored-value-0042-no-known-shape"
    cli.use(fake, provider="openai")
    write_credentials(cli, {"openai_api_key": key})
    fake.add({"status": 401, "echo_auth": True})
    r = cli.run("run", "--prompt", "hello")
    assert r.returncode == 2
    assert fake.model_requests()[0]["headers"]["authorization"] == "Bearer " + key  # it was really echoed
    assert "invalid credentials: Bearer [REDACTED]" in r.stderr
    assert key not in r.stderr and key not in r.stdout
    assert key.encode() not in db_bytes(cli)
    cid = json.loads(cli.run("history", "list", "--json").stdout)[0]["id"]
    for args in (("history", "show", "--full", cid), ("history", "show", "--json", cid), ("replay", cid)):
        out = cli.run(*args)
        assert key not in out.stdout + out.stderr


def test_the_answer_never_prints_a_known_key(cli, fake):
    key = "env-key-value-that-is-long-9"
    cli.use(fake, provider="openai")
    fake.add({"content": "your key is %s, keep it safe" % key})
    r = cli.run("run", "--prompt", "what is my key?", env={"OPENAI_API_KEY": key})
    assert r.returncode == 0
    assert r.stdout == "your key is [REDACTED], keep it safe\n"
    assert key.encode() not in db_bytes(cli)


def test_a_base_url_password_reaches_no_output(cli, fake):
    password = "Url-Pa55word-xyz"
    cli.use(fake, provider="openai")
    cfg = {"provider": {"type": "openai", "max_retries": 0, "openai": {
        "base_url": fake.url.replace("http://", "http://bob:%s@" % password) + "/v1", "model": "gpt-test"}}}
    cli.write_config(cfg)
    fake.add({"status": 500, "body": '{"error": "broken"}'}, {"status": 500, "body": '{"error": "broken"}'})
    outputs = []
    for args in (("config", "show"), ("config", "show", "--json"), ("run", "--prompt", "x"),
                 ("run", "--json", "--prompt", "x"), ("auth", "status"), ("auth", "status", "--provider", "openai"),
                 ("history", "list", "--json")):
        r = cli.run(*args)
        outputs.append((args, r.stdout + r.stderr))
    for args, text in outputs:
        assert password not in text, args
    assert "bob:[REDACTED]@127.0.0.1" in dict(outputs)[("config", "show")]
    assert password.encode() not in db_bytes(cli)
    # requests sends the userinfo as Basic credentials: it was really used
    assert any(r["headers"].get("authorization", "").startswith("Basic ") for r in fake.requests)


# -- file modes --


def mode(path):
    return stat.S_IMODE(os.stat(str(path)).st_mode)


def test_xzatoma_home_and_its_files_are_private_during_and_after_a_run(cli, fake):
    home = cli.tmp / "fresh-home"  # created by xzatoma
    cli.env["XZATOMA_HOME"] = str(home)
    cli.use(fake, terminal={"default_mode": "restricted_autonomous"})
    fake.add({"tool_calls": [tool_call("terminal", command="ls")]}, {"content": "ok", "delay": 3})
    proc = cli.popen("run", "--prompt", "x")
    try:  # while the run waits for its second reply, the database has its write-ahead log open
        assert wait_for(lambda: len(fake.model_requests()) == 2 and (home / "conversations.db-wal").exists())
        live = [home / n for n in ("conversations.db", "conversations.db-wal", "conversations.db-shm", "audit.log")]
        modes = {p.name: mode(p) for p in live if p.exists()}
        assert mode(home) == 0o700
    finally:
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert len(modes) == 4 and set(modes.values()) == {0o600}, modes
    for path in home.iterdir():
        assert mode(path) == 0o600, path


def test_a_loose_home_and_old_files_are_tightened(cli, fake):
    home = cli.xz_home
    os.chmod(str(home), 0o755)
    for name in ("conversations.db", "audit.log"):
        (home / name).write_bytes(b"")
        os.chmod(str(home / name), 0o644)
    cli.use(fake, terminal={"default_mode": "restricted_autonomous"})
    fake.add({"tool_calls": [tool_call("terminal", command="ls")]}, {"content": "ok"})
    r = cli.run("run", "--prompt", "x")
    assert r.returncode == 0, r.stderr
    assert mode(home) == 0o700
    for name in ("conversations.db", "audit.log", "conversations.db-wal", "conversations.db-shm"):
        if (home / name).exists():
            assert mode(home / name) == 0o600, name


def test_rotated_audit_log_stays_private(cli, fake):
    cli.use(fake, terminal={"default_mode": "restricted_autonomous", "audit_max_bytes": 200})
    fake.add({"tool_calls": [tool_call("terminal", command="ls")]}, {"tool_calls": [tool_call("terminal", command="ls -a")]},
             {"tool_calls": [tool_call("terminal", command="ls -l")]}, {"content": "ok"})
    assert cli.run("run", "--prompt", "x").returncode == 0
    assert (cli.xz_home / "audit.log.1").exists()
    assert mode(cli.xz_home / "audit.log.1") == 0o600 and mode(cli.xz_home / "audit.log") == 0o600


def test_credentials_file_is_private(cli):
    r = cli.run("auth", "login", "--provider", "openai", input="sk-typed-in-key-1234567890\n")
    assert r.returncode == 0, r.stderr
    assert mode(cli.xz_home / "credentials.json") == 0o600 and mode(cli.xz_home) == 0o700
    assert "sk-typed-in-key-1234567890" not in r.stdout + r.stderr


def test_chat_history_file_is_private_and_redacted(cli, fake):
    from ptyrun import PtyProcess
    cli.use(fake)
    fake.add({"content": "hi"})
    p = PtyProcess(cli.command("chat"), dict(cli.env, TERM="xterm"), str(cli.workdir))
    try:
        p.expect(r"\[PLANNING\]\[SAFE\] >> ")
        p.line("hello there, my key is sk_live_4eC39HqLyjWDarjtT1zdp7dcXYZ and ghp_16C7e42F292c6912E7710c838347Ae178B4a")
        p.expect("hi")
        p.expect(r"\[PLANNING\]\[SAFE\] >> ")
        p.eof()
        assert p.wait() == 0
    finally:
        p.close()
    assert mode(cli.xz_home / "chat_history") == 0o600
    assert mode(cli.xz_home / "conversations.db") == 0o600 and mode(cli.xz_home) == 0o700
    history = (cli.xz_home / "chat_history").read_text()  # what was typed stays, the keys do not
    assert "hello there, my key is" in history
    assert "sk_live_4eC39" not in history and "ghp_16C7e42F" not in history


def test_the_process_credentials_never_reach_the_model_in_a_tool_result(cli, fake):
    key = "stored-api-key-for-the-model-77"
    cli.use(fake, provider="openai")
    write_credentials(cli, {"openai_api_key": key})
    (cli.workdir / "notes.txt").write_text("the key is %s\n" % key)
    fake.add({"tool_calls": [tool_call("read_file", path="notes.txt")]}, {"content": "ok"})
    r = cli.run("run", "--prompt", "read notes")
    assert r.returncode == 0, r.stderr
    results = [m["content"] for m in fake.model_requests()[-1]["body"]["messages"] if m["role"] == "tool"]
    assert results and key not in results[0] and "the key is [REDACTED]" in results[0]


def test_a_keyring_key_echoed_in_a_401_reaches_no_output(cli, fake):
    key = "keyring-held-value-31337-plain"
    cli.use(fake, provider="openai").use_test_keyring()
    cli.keyring_file.write_text(json.dumps({"xzatoma/openai_api_key": key}))
    fake.add({"status": 401, "echo_auth": True})
    r = cli.run("run", "--json", "--prompt", "hello")
    assert r.returncode == 2
    assert fake.model_requests()[0]["headers"]["authorization"] == "Bearer " + key
    assert key not in r.stdout + r.stderr and "Bearer [REDACTED]" in json.loads(r.stdout)["error"]
    assert key.encode() not in db_bytes(cli)


def test_environment_and_config_credentials_are_redacted_everywhere(cli, fake):
    env_secret, config_secret = "env-only-service-token-4711", "xzepr-config-api-key-0815"
    cli.use(fake)
    cfg = json.loads(json.dumps(__import__("yaml").safe_load(cli.config_path.read_text())))
    cfg["xzepr"] = {"api_key": config_secret}
    cli.write_config(cfg)
    fake.add({"tool_calls": [tool_call("list_directory")]},
             {"content": "env %s and config %s" % (env_secret, config_secret)})
    r = cli.run("--verbose", "run", "--prompt", "say %s" % env_secret, env={"DEPLOY_SERVICE_TOKEN": env_secret})
    assert r.returncode == 0, r.stderr
    assert r.stdout == "env [REDACTED] and config [REDACTED]\n"
    data = db_bytes(cli)
    for secret in (env_secret, config_secret):
        assert secret not in r.stderr and secret.encode() not in data
    shown = cli.run("config", "show").stdout + cli.run("config", "show", "--json").stdout
    assert config_secret not in shown


def test_an_old_database_is_redacted_on_upgrade_and_deleted_text_is_gone(tmp_path):
    import sqlite3
    from xzatoma_store import MIGRATIONS, Store, _redact_stored
    path = str(tmp_path / "old.db")
    store = Store(path).open()
    store.start_conversation("01OLD", "run", title="t")
    store.close()
    token, doomed = "sk_live_" + "Z9" * 12, "delete-me-marker-" + "q" * 20
    conn = sqlite3.connect(path)  # what an earlier version wrote: no redaction of this shape
    conn.execute("INSERT INTO messages (conversation_id, seq, role, content, created_at) VALUES "
                 "('01OLD', 0, 'user', ?, 'x')", ("stripe key %s here" % token,))
    conn.execute("UPDATE conversations SET error = ? WHERE id = '01OLD'", ("failed with " + token,))
    conn.execute("PRAGMA user_version = %d" % MIGRATIONS.index(_redact_stored))
    conn.commit()
    conn.close()
    assert token.encode() in open(path, "rb").read()
    store = Store(path).open()
    assert store.messages("01OLD")[0]["content"] == "stripe key [REDACTED] here"
    assert store.conversation("01OLD")["error"] == "failed with [REDACTED]"
    assert store.search(token) == []
    store.start_conversation("01DOOMED", "run", title="doomed")
    store.append_message("01DOOMED", {"role": "user", "content": doomed})
    store.delete_conversation("01DOOMED")
    store.close()
    data = b"".join(open(p, "rb").read() for p in (path, path + "-wal") if os.path.exists(p))
    assert token.encode() not in data and b"Z9Z9Z9Z9" not in data
    assert doomed.encode() not in data  # history delete removes the text from the file, not just the row


def test_one_line_of_a_huge_text_never_shows_a_known_key_cut_by_its_bound():
    """one_line reads the first 64 KB of a long text (redacting a whole stored tool result per line of
    `history show` cost 0.3 s a MB); the word its bound cuts in two is left out, not shown half redacted."""
    from xzatoma_store import _ONE_LINE_SCAN, one_line
    key = "kq-7f3b2c9d8e1a4f6b0c5d2e9a"
    register_secret(key)
    for offset in range(1, len(key)):  # the key starts `offset` characters before the bound
        text = " " * (_ONE_LINE_SCAN - offset) + key + " more words after it" * 10
        shown = one_line(text, 200)
        assert key[:offset] not in shown, (offset, shown)
    assert one_line("x " * 40000 + key, 40).startswith("x x x")


# ---- issue 23: credential names by family, and a known secret however it was re-encoded ----

def reencodings(key):
    """The common re-encodings of `key`: the way servers, shells and serializers write it back."""
    import base64
    import subprocess
    import textwrap
    from urllib.parse import quote
    b64 = base64.b64encode(key.encode()).decode()
    bearer = base64.b64encode(("Bearer " + key).encode()).decode()
    quoted = subprocess.run(["bash", "-c", 'printf %q "$K"'], env={"K": key}, capture_output=True,
                            text=True).stdout if os.path.exists("/bin/bash") else None
    out = {"double-url": quote(quote(key, safe=""), safe=""), "triple-url": quote(quote(quote(key, safe="")), safe=""),
           "every-char-u": "".join("\\u%04x" % ord(c) for c in key),
           "every-char-U": "".join("\\u%04X" % ord(c) for c in key),
           "json-twice": json.dumps(json.dumps({"key": key})),
           "html-refs": "".join("&#%d;" % ord(c) for c in key),
           "mixed": "".join(("%%%02X" % ord(c)) if i % 3 == 0 else ("\\x%02x" % ord(c)) if i % 3 == 1 else c
                            for i, c in enumerate(key))}
    for width in (4, 7, 12, 60, 64, 76):
        out["base64-%d" % width] = "\n".join(textwrap.wrap(b64, width))
        out["bearer-base64-%d-crlf" % width] = "\r\n".join(textwrap.wrap(bearer, width))
    out["base64-in-json"] = json.dumps("\n".join(textwrap.wrap(b64, 20)))
    if quoted:
        out["printf-q"] = quoted
    return out


def middle(text):
    """What must not survive of an encoding: all but its first and last few characters (base64's edge groups
    mix in the bytes around the key), whitespace ignored."""
    flat = "".join(text.split())
    return flat[8:-8]


KEY23 = "Zq9+/Xk$w'3!~aB7=%p&<x>-Lm"


def test_a_known_secret_is_found_in_every_common_reencoding():
    register_secret(KEY23)
    for name, encoded in reencodings(KEY23).items():
        out = redact("before %s after" % encoded)
        assert REDACTED in out and out.startswith("before ") and out.endswith(" after"), (name, out)
        assert middle(encoded) not in "".join(out.split()), (name, out)
        assert redaction_spans("x " + encoded), name  # streams and questions see it too
    for text in ("a %20 b \\n c &amp; d \\u0041", "C:\\\\new\\\\table", "100%% sure &#9731;"):
        assert redact(text) == text


def test_credential_names_by_family():
    from xzatoma_store import is_credential_env
    token = "b9Y2x0ZW5kc2VjcmV0c2Vzc2lvbnRva2VuMTIzNDU2Nzg5MA=="
    for name in ("BW_SESSION", "OP_SESSION_myteam", "OP_SESSION_my_team", "VAULT_SESSION", "JIRA_COOKIE", "NPM_JWT"):
        assert is_credential_env(name, token), name
    for name, value in (("DESKTOP_SESSION", "gnome-xorg"), ("XDG_SESSION_PATH", "/org/freedesktop/Session0"),
                        ("XDG_SESSION_ID", "c2"), ("SESSION_MANAGER", "local/h:@/tmp/.ICE-unix/12,unix/h:/tmp/x"),
                        ("GITHUB_SHA", "0123456789abcdef0123456789abcdef01234567"), ("PATH", "/usr/bin")):
        assert not is_credential_env(name, value), name


def test_session_tokens_and_reencoded_keys_reach_no_model_output_store_or_command(cli, fake):
    bw = "b9Y2x0ZW5kc2VjcmV0c2Vzc2lvbnRva2VuMTIzNDU2Nzg5MA=="
    op = "x8Kd93Hh1Bq0ZzL2p4Y7vR6tW9uN3mS5cA0eF2gH4iJ"
    encodings = reencodings(KEY23)
    lines = ["%s: %s" % kv for kv in sorted(encodings.items())] + ["bw: " + bw, "op: " + op]
    (cli.workdir / "leak.txt").write_text("\n".join(lines) + "\n")
    cli.use(fake, provider="openai", terminal={"env_passthrough": ["BW_*", "OP_*"]})
    fake.add({"tool_calls": [tool_call("read_file", path="leak.txt")]},
             {"tool_calls": [tool_call("terminal", command="cat leak.txt; env > env.txt")]},
             {"content": "here:\n" + "\n".join(lines)})
    r = cli.run("run", "--allow-dangerous", "--prompt", "read leak.txt",
                env={"OPENAI_API_KEY": KEY23, "BW_SESSION": bw, "OP_SESSION_myteam": op})
    assert r.returncode == 0, r.stderr
    assert fake.model_requests()[0]["headers"]["authorization"] == "Bearer " + KEY23  # the key was in use
    seen = [m["content"] for m in fake.model_requests()[-1]["body"]["messages"] if m["role"] == "tool"]
    assert len(seen) == 2 and all("[REDACTED]" in text for text in seen), seen
    cid = [json.loads(line) for line in cli.run("history", "list", "--json").stdout.splitlines()][0]
    shown = cli.run("history", "show", "--full", (cid[0] if isinstance(cid, list) else cid)["id"]).stdout
    flat_db = b"".join(db_bytes(cli).split())
    for name, encoded in list(encodings.items()) + [("bw", bw), ("op", op)]:
        part = middle(encoded) if name not in ("bw", "op") else encoded
        for where, text in [("tool result", t) for t in seen] + [("stdout", r.stdout), ("stderr", r.stderr),
                                                                 ("history", shown)]:
            assert part not in "".join(text.split()), (name, where)
        assert part.encode() not in flat_db and json.dumps(part)[1:-1].encode() not in flat_db, name
    env_file = (cli.workdir / "env.txt").read_text()
    assert "PATH=" in env_file and bw not in env_file and op not in env_file  # passed through by name, not value


# ---- credentials: never in a command's environment ----


@needs_landlock
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
    assert b"PATH=" in dumped and (b"Permission denied" in dumped or  # the dump really happened (as root,
                                   b"No such file or directory" in dumped)  # nothing under its 0700 tmp is there)
    for secret in (key, key.replace("-", "%2D"), cfg_key):
        assert secret.encode() not in dumped, secret
        assert secret not in out and secret not in r.stdout + r.stderr, secret


def test_a_stored_key_echoed_encoded_in_a_provider_error_reaches_no_output(cli, fake):
    """A server that echoes the credential base64-encoded (as in Basic auth), URL-encoded or JSON-escaped
    the PHP/Java way (`\\/`) leaks it as surely as one echoing it plain."""
    import base64
    import json
    import urllib.parse
    key = "sec/ret+value=0042-no/known+shape"
    cli.use(fake, provider="openai")
    write_credentials(cli, {"openai_api_key": key})
    spellings = [base64.b64encode(key.encode()).decode(), base64.b64encode(("Bearer " + key).encode()).decode()[12:-4],
                 base64.urlsafe_b64encode(("user:" + key).encode()).decode()[8:-4],
                 urllib.parse.quote(key, safe=""), key.replace("/", "\\/")]
    fake.add({"status": 500, "body": json.dumps({"error": "bad " + " | ".join(spellings)})})
    r = cli.run("run", "--prompt", "hello")
    assert r.returncode == 1 and "bad [REDACTED]" in r.stderr, r.stderr
    for spelling in spellings:
        assert spelling not in r.stderr and spelling.encode() not in db_bytes(cli), spelling


@pytest.fixture
def web():
    """A loopback page server; /redirect sends the client to a URL carrying a token."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            if self.path.startswith("/redirect"):
                self.send_response(302)
                self.send_header("Location", "/landing?api_key=sk_live_" + "R" * 24)
                self.end_headers()
                return
            body = b"a page\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield "127.0.0.1:%d" % httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def test_a_credential_in_a_fetched_url_never_reaches_the_database(cli, fake, web):
    """The fetch cache kept its key, the URL, verbatim: a password in the userinfo, a token in the query,
    a token in the URL a redirect landed on, all in conversations.db's bytes."""
    secrets = ["Passw0rdInUrl", "ghp_" + "Q" * 36, "sk_live_" + "R" * 24]
    cli.use(fake, tools={"fetch": {"allowed_hosts": ["127.0.0.1"]}})
    r, results = run_calls(cli, fake, [
        tool_call("fetch", url="http://deploy:%s@%s/a" % (secrets[0], web)),
        tool_call("fetch", url="http://%s/b?access_token=%s" % (web, secrets[1])),
        tool_call("fetch", url="http://%s/redirect" % web)])
    assert r.returncode == 0, r.stderr
    assert all(x.endswith("a page\n") for x in results), results
    data = db_bytes(cli)
    for secret in secrets:
        assert secret.encode() not in data, secret
        assert secret not in r.stderr and secret not in r.stdout


def test_the_watcher_never_publishes_a_credential_in_a_result(cli, fake, kafka_broker, tmp_path):
    """`run` redacts its answer; the watcher published the same answer (and the run's error) to the results
    topic as the model wrote it: a token read from a file, echoed in the answer, left for every consumer."""
    import json
    import uuid

    import kafka_broker as kb
    import yaml
    from test_watch_cli import FAST
    token = "ghp_" + "W" * 36
    topic = "rt-" + uuid.uuid4().hex[:8]
    kb.create_topic(kafka_broker.address, topic)
    cli.use(fake)
    cfg = yaml.safe_load(cli.config_path.read_text())
    cfg["watcher"] = {"kafka": dict(FAST, bootstrap_servers=kafka_broker.address)}
    cli.write_config(cfg)
    plan = tmp_path / "task.yaml"
    plan.write_text("goal: Say the token\ninstructions: [say it]\n")
    assert cli.run("publish", "--topic", topic, "--plan", str(plan)).returncode == 0
    fake.add({"content": "the token is %s" % token})
    r = cli.run("watch", "--topic", topic, "--max-events", "1", "--log-format", "json", "--group-id", "g-" + topic,
                timeout=120)
    assert r.returncode == 0, r.stderr
    results = [json.loads(m.value) for m in kb.read_all(kafka_broker.address, topic + ".results", 1)]
    assert results and results[0]["data"]["answer"] == "the token is [REDACTED]", results
    assert token not in r.stderr


def test_a_credential_in_a_file_the_agent_changed_never_reaches_the_database(cli, fake):
    """Editing .env kept its previous content, token and all, verbatim in conversations.db for undo. The
    content is now sealed with a key kept beside the database (0600): undo still restores it byte for byte,
    and without the key it refuses instead of writing garbage."""
    token = "AKIA" + "Z" * 16
    env = "AWS_ACCESS_KEY_ID=%s\nDEBUG=1\n" % token
    (cli.workdir / ".env").write_text(env)
    (cli.workdir / "cfg").mkdir()
    (cli.workdir / "cfg" / "a.ini").write_text("token = ghp_%s\n" % ("T" * 36))
    cli.use(fake)
    r, results = run_calls(cli, fake, [tool_call("edit_file", path=".env", old_text="DEBUG=1", new_text="DEBUG=0"),
                                       tool_call("delete_path", path="cfg", recursive=True)])
    assert r.returncode == 0 and results[1] == "Deleted cfg (2 items)", (r.stderr, results)
    data = db_bytes(cli)
    assert token.encode() not in data and b"ghp_" + b"T" * 36 not in data
    assert oct(os.stat(str(cli.xz_home / "undo.key")).st_mode & 0o777) == "0o600"
    u = cli.run("undo", "--all")
    assert u.returncode == 0, u.stderr
    assert (cli.workdir / ".env").read_text() == env
    assert (cli.workdir / "cfg" / "a.ini").read_text() == "token = ghp_%s\n" % ("T" * 36)
    # a lost key: nothing is written from content that cannot be checked
    fake.add({"tool_calls": [tool_call("read_file", path=".env"), tool_call("write_file", path=".env",
                                                                          content="replaced\n")]}, {"content": "done"})
    assert cli.run("run", "--prompt", "again").returncode == 0
    os.unlink(str(cli.xz_home / "undo.key"))
    u = cli.run("undo")
    assert u.returncode == 1 and "not restored" in u.stderr and len(u.stderr.strip().splitlines()) == 1, u.stderr
    assert (cli.workdir / ".env").read_text() == "replaced\n"


def test_a_base_url_password_never_reaches_the_model_cache(cli, fake):
    """`xzatoma models` cached the list under a key holding the base URL, userinfo and all: the password was
    in conversations.db's bytes although every printed output redacted it."""
    import yaml
    password = "Hunter2Passw0rdXYZ"
    cli.use(fake, provider="openai")
    cfg = yaml.safe_load(cli.config_path.read_text())
    cfg["provider"]["openai"]["base_url"] = fake.url.replace("http://", "http://bob:%s@" % password) + "/v1"
    cli.write_config(cfg)
    for _ in range(2):  # the second is served from the cache: the key is found again
        r = cli.run("models")
        assert r.returncode == 0 and "gpt-test" in r.stdout and password not in r.stdout + r.stderr, r.stderr
    assert len([q for q in fake.requests if q["path"].endswith("/models")]) == 1
    assert password.encode() not in db_bytes(cli)


def test_a_known_secret_of_many_words_is_never_streamed_in_part():
    """The chat's stream held the last three words back so a secret split across deltas is redacted whole;
    a known credential of more words (a passphrase) went out word by word before it was complete."""
    from xzatoma_store import register_secret
    from xzatoma_tools import UntrustedStream
    secret = "correct horse battery staple under the moon"
    register_secret(secret)
    stream, shown = UntrustedStream(), ""
    for word in ("the passphrase is " + secret + " and more text follows here").split(" "):
        shown += stream.feed(word + " ")
        assert "correct horse" not in shown and "battery staple under" not in shown, shown
    shown += stream.finish()
    assert "the passphrase is [REDACTED] and more text follows here" in shown, shown


# ---- credentials named the way real services name them, and their real shapes ----


# environment variables real tools read credentials from, named the way they are named
ENV_CREDENTIALS = {
    "PGPASSWORD": "pg-pass-value-7a7a",
    "MYSQL_PWD": "mysql-pwd-value-8b8b",
    "SECRET_KEY_BASE": "rails-key-base-0c0c0c0c",
    "GPG_PASSPHRASE": "gpg-pass-phrase-9d9d",
    "API_KEY_PROD": "api-key-prod-1e1e-value",
    "CLIENTSECRET": "client-secret-5f5f-value",
    "GITHUB_TOKEN_RO": "read-only-token-4a4a-value",
    "SENTRY_DSN": "https://0a1b2c3d4e5f60718293a4b5c6d7e8f9@o1.ingest.sentry.io/1",
    "UPSTREAM_URL": "https://deploy:upstream-pw-3c3c@git.example.com/repo.git",
}


ENV_NEEDLES = ["pg-pass-value-7a7a", "mysql-pwd-value-8b8b", "rails-key-base-0c0c0c0c", "gpg-pass-phrase-9d9d",
               "api-key-prod-1e1e-value", "client-secret-5f5f-value", "read-only-token-4a4a-value",
               "0a1b2c3d4e5f60718293a4b5c6d7e8f9", "upstream-pw-3c3c"]


def test_credentials_in_the_environment_under_their_real_names_reach_no_output(cli, fake):
    cli.use(fake)
    (cli.workdir / "notes.txt").write_text("\n".join(ENV_NEEDLES) + "\n")
    fake.add({"tool_calls": [tool_call("read_file", path="notes.txt")]},
             {"content": "found: " + " ".join(ENV_NEEDLES)})
    r = cli.run("--verbose", "run", "--json", "--prompt", "say " + ENV_NEEDLES[0], env=ENV_CREDENTIALS)
    assert r.returncode == 0, r.stderr
    cid = json.loads(r.stdout)["conversation_id"]
    shown = cli.run("history", "show", "--full", cid).stdout + cli.run("replay", cid).stdout
    tool_result = [m["content"] for m in fake.model_requests()[1]["body"]["messages"] if m["role"] == "tool"][0]
    data = db_bytes(cli)
    for needle in ENV_NEEDLES:
        assert needle not in r.stdout and needle not in r.stderr, needle
        assert needle not in shown and needle not in tool_result, needle
        assert needle.encode() not in data, needle
    assert json.loads(r.stdout)["answer"].startswith("found: " + REDACTED)


def test_a_token_as_the_user_name_of_a_base_url_reaches_no_output(cli, fake):
    token = "tok3nAsUserName0123456789"
    cli.use(fake, provider="openai")
    cli.write_config({"provider": {"type": "openai", "max_retries": 0, "openai": {
        "base_url": fake.url.replace("http://", "http://%s@" % token) + "/v1", "model": "gpt-test"}}})
    fake.add({"status": 500, "body": '{"error": "broken"}'}, {"status": 500, "body": '{"error": "broken"}'})
    outputs = []
    for args in (("config", "show"), ("config", "show", "--json"), ("run", "--prompt", "x"),
                 ("run", "--json", "--prompt", "x"), ("auth", "status"), ("history", "list", "--json")):
        r = cli.run(*args)
        outputs.append((args, r.stdout + r.stderr))
    for args, text in outputs:
        assert token not in text, args
    assert token.encode() not in db_bytes(cli)
    assert fake.model_requests()  # the runs reached the server through that URL


def test_a_url_password_holding_an_at_sign_is_redacted_whole():
    # urllib and requests split userinfo at the last '@': the part after the first one leaked
    assert redact("see https://bob:p@ss-w0rd-99@host.example/x now") == "see https://bob:[REDACTED]@host.example/x now"
    assert redact("clone https://x-token-0123456789abcdefXYZ@github.com/o/r") == \
        "clone https://[REDACTED]@github.com/o/r"
    for ordinary in ("ssh://git@github.com/o/r", "postgres://postgres@localhost/db", "mailto://me@example.com",
                     "see https://example.com/a:b@c?"):
        assert redact(ordinary) == ordinary


# real-world shapes a command line, a config file or an HTTP exchange carries: (text, what must go)
SHAPES = [
    ("X-Api-Key: 0a1b2c3d4e5f60718293", "0a1b2c3d4e5f60718293"),
    ("api-key: 9f8e7d6c5b4a39281706abcd", "9f8e7d6c5b4a39281706abcd"),  # Azure OpenAI's header
    ("curl -s -u admin:Sup3rS3cretPw https://h/", "Sup3rS3cretPw"),
    ("curl --user deploy:Hunter2Hunter2 https://h/", "Hunter2Hunter2"),
    ("tool --password S3cretPassw0rd2 --verbose", "S3cretPassw0rd2"),
    ("sshpass -p 'S3cretPassw0rd3' ssh host", "S3cretPassw0rd3"),
    ("mysql -u root -pS3cretPassw0rd1 app", "S3cretPassw0rd1"),
    ('{"auths": {"r.io": {"auth": "YWRtaW46czNjcmV0cGFzc3dvcmQ1"}}}', "YWRtaW46czNjcmV0cGFzc3dvcmQ1"),
    ("_auth=YWRtaW46czNjcmV0cGFzc3dvcmQ2", "YWRtaW46czNjcmV0cGFzc3dvcmQ2"),  # .npmrc
    ("Cookie: sessionid=q1w2e3r4t5y6u7i8o9p0", "q1w2e3r4t5y6u7i8o9p0"),
    ("Set-Cookie: connect.sid=s%3A0a1b2c3d4e5f6071; Path=/", "s%3A0a1b2c3d4e5f6071"),
    ("https://acct.blob.core.windows.net/c?sv=2020-08-04&sig=Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5%2B", "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5"),
    ("https://b.s3.amazonaws.com/k?X-Amz-Signature=0a1b2c3d4e5f60718293a4b5c6d7e8f9", "0a1b2c3d4e5f60718293a4b5c6d7e8f9"),
    ("GPG_PASSPHRASE=correct7horse8battery", "correct7horse8battery"),
    ("access_key = AbCdEf0123456789GhIj", "AbCdEf0123456789GhIj"),
    ("glsa_" + "Ab1" * 10 + "Ab_0a1b2c3d", "glsa_"),
    ("sntrys_eyJpYXQiOjE2ODQwMDAwMDAsInVybCI6Imh0dHBzOi8vc2VudHJ5LmlvIn0_abcdef", "sntrys_"),
    ("EAACEdEose0cBA" + "Zx9" * 10, "EAACEdEose0cBA"),  # Meta
    ("LTAI5tAbCdEfGh1234567", "LTAI5tAbCdEfGh1234567"),  # Alibaba Cloud
    ("https://discord.com/api/webhooks/123456789012345678/" + "aB3-" * 17, "aB3-aB3-"),
]


@pytest.mark.parametrize("text,secret", SHAPES, ids=[s[0][:24] for s in SHAPES])
def test_more_real_world_token_shapes_are_redacted(text, secret):
    out = redact("before %s after" % text)
    assert secret not in out and REDACTED in out, out
    assert out.startswith("before ") and out.endswith(" after")


GH = "ghp_" + "A1b2C3d4E5" * 4


@pytest.mark.parametrize("text,secret", [
    ("id_" + GH, GH), ("v1" + GH, GH), ("\u00e9" + GH, GH), ("repo=x_sk-proj-" + "Ab1_" * 6, "Ab1_Ab1_"),
    ("token%3D" + GH, GH), ("key%3DAKIAABCDEFGHIJKLMNOP", "AKIAABCD"), ("AKIAIOSFODNN7EXAMPLE_prod", "AKIAIOSF"),
    ('"line\\nsk-' + "q9W8e7R6t5Y4u3I2" + '"', "q9W8e7R6t5Y4u3I2"), ("a\\tSG.%s.%s" % ("x1" * 9, "y2" * 9), "x1x1"),
    ("%2Cxoxb-1234567890-abcdefghij", "abcdefghij"), ("key\\x3d" + GH, GH), ('{"k":"\\u003c' + GH + '"}', GH),
    ("https://api.telegram.org/bot1234567890:AAH" + "x9Y8z7" * 6 + "/sendMessage", "AAHx9Y8z7"),
])
def test_a_token_glued_to_what_comes_before_it_is_redacted(text, secret):
    """Shapes began at a word boundary: a token right after a digit, an underscore or an escape (URL-encoded,
    JSON's \\n and \\u003c, C's \\x3d) was kept whole, in a result's error, a dead-letter reason and the log
    (rounds 17b, 17d). Right after a letter it is a word's end (helpdesk-admin-...), left alone."""
    out = redact(text)
    assert secret not in out and REDACTED in out, out


def test_ordinary_command_lines_and_code_are_left_alone():
    for text in ("docker run -u 1000:1000 img", "git push -u origin main", "sort -u a:bcdef",
                 "session_factory = make_session(config)", "mysql -p app", "the --password flag asks for it",
                 "author: Jane Doe", "signature = sign(body)", "sid = 42", "task-abcdefghijklmnopqrstuvwxyz",
                 "risk-management-framework-for-2024", "mask-0123456789abcdef0123", "ASKIAABCDEFGHIJKLMNOPQ",
                 "helpdesk-admin-dashboard-settings", "task-proj-" + "settings" * 3, "kiosk-admin-panel-" * 2,
                 "benchmark_test_ThroughputLargeBatch", "bookmark_live_" + "Folder" * 4, "weighs_" + "ABCDEF" * 4,
                 "laughs_" + "Abc1" * 6):
        assert redact(text) == text


def test_new_shapes_never_reach_the_database_or_history(cli, fake):
    cli.use(fake)
    everything = "\n".join(text for text, _ in SHAPES)
    (cli.workdir / "shapes.txt").write_text(everything + "\n")
    fake.add({"tool_calls": [tool_call("read_file", path="shapes.txt")]}, {"content": "echo:\n" + everything})
    r = cli.run("run", "--json", "--prompt", "keys:\n" + everything)
    assert r.returncode == 0, r.stderr
    cid = json.loads(r.stdout)["conversation_id"]
    shown = cli.run("history", "show", "--full", cid).stdout
    data = db_bytes(cli)
    for text, secret in SHAPES:
        assert secret.encode() not in data, text
        assert secret not in shown and secret not in r.stdout, text


def test_a_credential_in_an_event_is_not_echoed_by_dry_run_or_the_result(cli, fake, kafka_broker):
    # --dry-run printed the goal as it came (only escaped), and the result event repeated it to every
    # consumer of the results topic; the answer was redacted, the goal beside it was not
    import uuid

    import kafka_broker as kb
    from test_watch_cli import FAST
    secret = "sk_live_4eC39HqLyjWDarjtT1zdp7dQ"
    topic = "a12b-" + uuid.uuid4().hex[:8]
    kb.create_topic(kafka_broker.address, topic)
    cli.use(fake)
    cfg = __import__("yaml").safe_load(cli.config_path.read_text())
    cfg["watcher"] = {"kafka": dict(FAST, bootstrap_servers=kafka_broker.address)}
    cli.write_config(cfg)
    event = {"specversion": "1.0", "id": "ev-" + uuid.uuid4().hex[:6], "source": "ci\x1b[2J", "type": "build\u202e",
             "data": {"goal": "deploy with %s \x1b]0;pwned\x07" % secret, "instructions": ["step \x9b2J"]}}
    kb.produce(kafka_broker.address, topic, [(b"k", json.dumps(event).encode())])
    log = cli.tmp / "watch.log"
    r = cli.run("watch", "--topic", topic, "--max-events", "1", "--dry-run", "--group-id", "g-" + topic,
                "--log-file", log, timeout=120)
    assert r.returncode == 0, r.stderr
    assert oct(os.stat(str(log)).st_mode & 0o777) == oct(0o600)  # the decision log quotes events: private
    assert secret not in log.read_text() and "received" in log.read_text()
    assert json.loads(r.stdout)["event_id"] == event["id"]
    assert secret not in r.stdout + r.stderr and REDACTED in json.loads(r.stdout)["goal"]
    assert_clean(r.stdout + r.stderr, "watch --dry-run")
    fake.add({"content": "deployed"})
    r = cli.run("watch", "--topic", topic, "--max-events", "1", "--group-id", "g2-" + topic, timeout=120)
    assert r.returncode == 0, r.stderr
    assert secret not in r.stderr
    assert_clean(r.stderr, "watch")
    result = json.loads(kb.read_all(kafka_broker.address, topic + ".results", 1)[0].value)
    assert result["data"]["status"] == "completed" and result["data"]["answer"] == "deployed"
    assert secret not in json.dumps(result) and result["data"]["goal"].startswith("deploy with " + REDACTED)


def test_kafka_client_lines_with_verbose_are_cleaned(capsys):
    import logging

    import xzatoma
    import xzatoma_watch
    logger = logging.getLogger("kafka")
    before = list(logger.handlers)
    try:
        xzatoma_watch.quiet_client_logs(True, xzatoma.Console.clean)
        # what kafka-python logs quotes the broker: its advertised host names and error texts
        logging.getLogger("kafka.conn").warning("connect to %s failed: %s", "evil\x1b]0;pwned\x07host",
                                                "sasl://svc:Kafka-Pa55word-x@b:9092 \u202ereversed")
    finally:
        for handler in list(logger.handlers):
            if handler not in before:
                logger.removeHandler(handler)
    err = capsys.readouterr().err
    assert "kafka: WARNING connect to evil\\x1b]0;pwned\\x07host failed" in err
    assert "Kafka-Pa55word-x" not in err
    assert_clean(err, "stderr")


def test_a_key_echoed_encoded_by_a_provider_reaches_no_output(cli, fake):
    # a server quoting the key form-encoded, %-encoded with lower-case hex, HTML-escaped, JSON as Go writes it
    # (Ollama is Go: '&' becomes \u0026) or in hex: each spelling went out as the server wrote it
    import html
    from urllib.parse import quote, quote_plus
    key = "kr/Key+with space&<x>=0042"
    spellings = {"plus": quote_plus(key, safe=""), "path": quote(key),
                 "lowerhex": re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), quote(key, safe="")),
                 "html": html.escape(key), "go": json.dumps(key)[1:-1].replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e"),
                 "hex": key.encode().hex()}
    cli.use(fake, provider="openai").use_test_keyring()
    cli.keyring_file.write_text(json.dumps({"xzatoma/openai_api_key": key}))
    body = json.dumps({"error": {"message": "bad key: " + " | ".join("%s=%s" % kv for kv in spellings.items())}})
    fake.add({"status": 401, "body": body})
    r = cli.run("run", "--json", "--prompt", "hello")
    assert r.returncode == 2
    assert fake.model_requests()[0]["headers"]["authorization"] == "Bearer " + key
    error = json.loads(r.stdout)["error"]
    cid = json.loads(cli.run("history", "list", "--json").stdout)[0]["id"]
    shown = cli.run("history", "show", "--full", cid)
    data = db_bytes(cli)
    assert error.count(REDACTED) >= 3, error  # the line is cut to its width: the first few are in it
    for name, spelling in spellings.items():
        for text in (r.stdout, r.stderr, shown.stdout, shown.stderr):
            assert spelling not in text, name
        assert spelling.encode() not in data, name


def test_files_an_older_version_left_loose_are_tightened_at_the_next_run(cli, fake):
    # the database and audit.log were tightened, but undo.key (it seals undo's saved contents), a rotated
    # audit.log.1 and chat_history stayed 0644 in a home tightened back to 0700
    cli.use(fake, terminal={"default_mode": "restricted_autonomous"})
    fake.add({"tool_calls": [tool_call("terminal", command="ls")]}, {"content": "ok"})
    (cli.workdir / "f.txt").write_text("old\n")
    fake.add({"tool_calls": [tool_call("read_file", path="f.txt"), tool_call("write_file", path="f.txt",
                                                                           content="new\n")]}, {"content": "ok"})
    assert cli.run("run", "--prompt", "x").returncode == 0
    assert cli.run("run", "--mode", "write", "--prompt", "y").returncode == 0
    assert (cli.xz_home / "undo.key").exists()
    for name in ("audit.log.1", "chat_history"):
        (cli.xz_home / name).write_text("older lines\n")
    os.chmod(str(cli.xz_home), 0o755)
    loose = sorted(os.listdir(str(cli.xz_home)))
    for name in loose:
        os.chmod(str(cli.xz_home / name), 0o644)
    fake.add({"content": "ok"})
    assert cli.run("run", "--prompt", "z").returncode == 0
    assert os.stat(str(cli.xz_home)).st_mode & 0o777 == 0o700
    modes = {name: oct(os.stat(str(cli.xz_home / name)).st_mode & 0o777) for name in loose}
    assert set(modes.values()) == {oct(0o600)}, modes


def test_a_config_error_never_quotes_a_credential(cli):
    # YAML reads an all-digit password as a number: neither registered nor credential-shaped, and the type
    # error quoted it whole on stderr
    for value in (98765432109876, ["list-held-Pa55word-77"], 3.14159265358979):
        cli.write_config({"watcher": {"kafka": {"password": value}}, "xzepr": {"api_key": value}})
        r = cli.run("config", "show")
        assert r.returncode == 2 and "watcher.kafka.password must be text" in r.stderr, r.stderr
        for secret in ("98765432109876", "Pa55word", "3.14159265"):
            assert secret not in r.stdout + r.stderr


def test_a_secret_cut_by_a_line_width_is_redacted_before_the_cut(cli, fake):
    # progress lines, result previews and the stored title were cut to their width first and redacted after:
    # the half of a key before the cut was no longer a secret redact() knew, and went out as it was
    key = "plainKnownValue0042xyzwABCDefgh"
    cli.use(fake, provider="openai")
    fake.add({"tool_calls": [tool_call("read_file", path="q" * 66 + key)]},
             {"tool_calls": [tool_call("terminal", command="echo " + "r" * 64 + key)]},
             {"tool_calls": [tool_call("list_directory", path="s" * 90 + key)]},
             {"content": "ok"})
    r = cli.run("run", "--output-format", "stream-json", "--prompt", "p" * 108 + " " + key,
                env={"OPENAI_API_KEY": key})
    assert r.returncode == 0, r.stderr
    assert "q" * 66 + REDACTED in r.stderr and "r" * 64 + REDACTED in r.stderr
    cid = json.loads(r.stdout.splitlines()[-1])["conversation_id"]
    listed = cli.run("history", "list").stdout + cli.run("history", "list", "--json").stdout
    data = db_bytes(cli)
    half = key[:10]
    for where, text in (("stderr", r.stderr), ("stream-json", r.stdout), ("history list", listed)):
        assert half not in text, where
    assert half.encode() not in data
    assert cid


def test_a_stored_key_of_another_provider_is_redacted_too(cli, fake):
    # credentials.json's values were registered only when read for the provider in use: a run on Ollama
    # returned the stored OpenAI key from a file to the model, the store and the answer as it was
    key = "stored-openai-value-0077-plain"
    cli.use(fake)  # ollama: needs no key, so credentials.json was never read
    path = cli.xz_home / "credentials.json"
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"openai_api_key": key}, fh)
    (cli.workdir / "notes.txt").write_text("deploy key: %s\n" % key)
    fake.add({"tool_calls": [tool_call("read_file", path="notes.txt")]}, {"content": "the key is " + key})
    r = cli.run("run", "--prompt", "read notes")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "the key is %s\n" % REDACTED
    result = [m["content"] for m in fake.model_requests()[1]["body"]["messages"] if m["role"] == "tool"][0]
    assert key not in result and "deploy key: " + REDACTED in result
    assert key.encode() not in db_bytes(cli)


def test_a_long_text_redacted_before_a_secret_was_known_is_redacted_again_after():
    """Long texts redacted lately are remembered (a watcher stores the same prompt for every event); a secret
    registered since must still be removed from them."""
    text = "the deployment notes say: " + "x" * 400 + " key=q7Zr2LmXw9VbTn4K_late_registered"
    assert redact(text) == text  # nothing known, no shape
    register_secret("q7Zr2LmXw9VbTn4K_late_registered")
    assert redact(text).endswith("key=" + REDACTED) and redact(text) == redact(text)


@pytest.mark.parametrize("text", [PEM64TWICE, PEM64YAML])
def test_a_key_in_base64_twice_or_wrapped_in_yaml_is_redacted_whole(text):
    out = redact("before\n" + text + "\nafter")
    assert REDACTED in out and out.endswith("\nafter")
    pieces = [text[i:i + 24] for i in range(80, len(text) - 24, 24) if "\n" not in text[i:i + 24]]
    assert pieces and not [p for p in pieces if p in out]  # nothing of the encoded key is left


# ---- round 19d: a known value through colour codes, markup and hex dumps; streams agree with the whole text ----

KEY19 = "qZ7xKp2LmN9vR4tW8yB3cD6fG1hJ5kLs"


def hex_dumps(data):
    """`data` as xxd -p (60 columns), od -An -tx1, xxd, hexdump -C, xxd -i and a colon list print it."""
    h = data.hex()
    lines16 = [data[i:i + 16] for i in range(0, len(data), 16)]
    return {
        "xxd-p": "\n".join(h[i:i + 60] for i in range(0, len(h), 60)) + "\n",
        "od": "".join(" " + " ".join("%02x" % b for b in line) + "\n" for line in lines16),
        "xxd": "".join("%08x: %-40s  %s\n" % (16 * n, " ".join(line[i:i + 2].hex() for i in range(0, len(line), 2)),
                                               "".join(chr(b) if 32 <= b < 127 else "." for b in line))
                       for n, line in enumerate(lines16)),
        "hexdump-C": "".join("%08x  %-49s |%s|\n" % (16 * n, " ".join("%02x" % b for b in line[:8]) + "  " +
                                                      " ".join("%02x" % b for b in line[8:]),
                                                      "".join(chr(b) if 32 <= b < 127 else "." for b in line))
                             for n, line in enumerate(lines16)),
        "xxd-i": ",\n  ".join(", ".join("0x%02x" % b for b in data[i:i + 12]) for i in range(0, len(data), 12)),
        "colons": ":".join("%02X" % b for b in data),
    }


def test_a_known_value_is_found_through_colour_codes_markup_and_hex_dumps():
    """Round 19d: `grep --color=always` put ESC[01;31m…ESC[m inside a key, an HTML error page split one by
    tags, and xxd -p (wrapped at 60 columns) or od -An -tx1 (spaced) printed one as hex: each went whole to
    the model and the store. The view redact() searches looks through all of them."""
    register_secret(KEY19)
    data = ("SERVICE_TOKEN=%s\nPORT=80\n" % KEY19).encode()
    forms = {"grep-color": "k.txt:qZ7xKp\x1b[01;31m\x1b[K2LmN\x1b[m\x1b[K9vR4tW8yB3cD6fG1hJ5kLs\n",
             "osc-link": "\x1b]8;;https://x.test\x1b\\qZ7xKp2LmN\x1b]8;;\x1b\\9vR4tW8yB3cD6fG1hJ5kLs",
             "json-colour": json.dumps("qZ7xKp\x1b[31m2LmN9vR4tW8y\x1b[0mB3cD6fG1hJ5kLs"),
             "html": "<html>Invalid key <b>qZ7xKp2LmN9v</b><i>R4tW8yB3cD6fG1hJ5kLs</i></html>",
             "html-attrs": '<span class="k">qZ7xKp2LmN</span>\n<span class="k">9vR4tW8yB3cD6fG1hJ5kLs</span>'}
    forms.update(hex_dumps(data))
    for name, text in forms.items():
        out = redact("before\n" + text + "\nafter")
        assert REDACTED in out and out.startswith("before\n") and out.endswith("\nafter"), (name, out)
        flat = re.sub(r"\x1b\[[0-9;]*[mK]|<[^>]*>|\s|0x|[:,]", "", out)
        for piece in (KEY19[4:14], KEY19[14:24], KEY19[22:], KEY19.encode().hex()[8:28], KEY19.encode().hex()[-20:]):
            assert piece not in flat and piece.upper() not in flat, (name, out)
        assert redaction_spans(text), name  # a stream and a question see it too
    # what is not a known value stays as it was: markup, colours and hex around other text
    for text in ("<b>bold</b> and \x1b[01;31mred\x1b[m", "xxd: 7a 7a 7a 7a 7a 7a 7a 7a", "if a<b and c>d: pass",
                 "00000000: 5345 5256 4943 455f 544f 4b45 4e3d 0a0a  SERVICE_TOKEN=..", "de:ad:be:ef:00:11"):
        assert redact(text) == text


def test_a_known_value_split_by_spaces_is_never_streamed_in_part():
    """Round 19d: an answer showing a known token split by spaces into six pieces was redacted when piped and
    in the store, but streamed to a terminal whole (the stream held the last three words). The stream holds
    whatever the whole-text redactor could still join, so both show the same."""
    from xzatoma_tools import UntrustedStream
    register_secret(KEY19)
    pieces = " ".join(KEY19[i:i + 6] for i in range(0, len(KEY19), 6))
    for answer in ("Here it is: %s and that is all for today, thanks." % pieces,
                   "Here it is: <b>%s</b><i>%s</i> and more words after it." % (KEY19[:12], KEY19[12:]),
                   "Here it is: %s and more words after it." % " ".join("%02x" % b for b in KEY19.encode()),
                   "Here it is: %s and more words after it." % KEY19.replace("x", "\\u0078")):
        for size in (1, 3, 7):
            stream, shown = UntrustedStream(), ""
            for i in range(0, len(answer), size):
                shown += stream.feed(answer[i:i + size])
                assert KEY19[:6] not in shown and "qZ7x" not in shown and "71 5a 37" not in shown, (size, shown)
            shown += stream.finish()
            assert shown == redact(answer) and REDACTED in shown, (size, shown)


def test_a_key_in_colour_codes_or_hex_from_a_command_reaches_neither_the_model_nor_the_store(cli, fake):
    """Round 19d, end to end: grep --color=always, xxd -p and od -An -tx1 printing a key the process knows."""
    (cli.workdir / "k.txt").write_text(KEY19 + "\n")
    cli.use(fake)
    r, results = run_commands(cli, fake, "grep --color=always 2LmN k.txt", "xxd -p k.txt", "od -An -tx1 k.txt",
                              env={"MY_SERVICE_TOKEN": KEY19})
    assert len(results) == 3 and all(REDACTED in t for t in results), results
    hexkey = KEY19.encode().hex()
    flat_db = b"".join(db_bytes(cli).split())
    for part in (KEY19[10:], hexkey[:24], hexkey[-24:]):
        assert not any(part in "".join(t.split()) for t in results), (part, results)
        assert part.encode() not in flat_db


def test_a_key_split_by_markup_in_an_html_error_page_reaches_no_output(cli, fake):
    """Round 19d: a 401 page `<b>half</b><i>half</i>` showed the whole key on stderr and in the store."""
    key = "kq9ZmW3xLp7RtV2nYc8BdF4h"
    cli.use(fake, provider="openai")
    write_credentials(cli, {"openai_api_key": key})
    fake.add({"status": 401, "headers": {"Content-Type": "text/html"},
              "body": "<html><body>Invalid key <b>%s</b><i>%s</i></body></html>" % (key[:12], key[12:])})
    r = cli.run("run", "--prompt", "hi")
    assert r.returncode != 0 and REDACTED in r.stderr, r.stderr
    for half in (key[:12], key[12:]):
        assert half not in r.stderr and half.encode() not in db_bytes(cli), r.stderr


def test_credential_named_variables_holding_ordinary_values_are_not_redacted():
    """Round 19d: GOOGLE_APPLICATION_CREDENTIALS (a path), CSRF_COOKIE_NAME=csrftoken and
    API_KEY_HEADER=Authorization were registered by name alone. A value is a credential by what it is too;
    a password-named one whatever it looks like, and real keys always."""
    from xzatoma_store import env_credential
    for name, value in (("GOOGLE_APPLICATION_CREDENTIALS", "/etc/gcp/service-account.json"),
                        ("CSRF_COOKIE_NAME", "csrftoken"), ("API_KEY_HEADER", "Authorization"),
                        ("CSRF_TOKEN_HEADER", "X-CSRF-Token"), ("SESSION_COOKIE_NAME", "sessionid"),
                        ("SECRET_KEY_FILE", "~/.config/app/secret.key"), ("TOKEN_FILE", "/run/secrets/token"),
                        ("OAUTH_TOKEN_URL", "https://oauth2.googleapis.com/token"), ("AUTH_TOKEN_TYPE", "accessToken")):
        assert not env_credential(name, value), (name, value)
    for name, value in (("MY_SERVICE_TOKEN", KEY19), ("PGPASSWORD", "mysecretpassword"), ("MYSQL_PWD", "hunterhunter"),
                        ("DB_PASS", "correcthorse"), ("GPG_PASSPHRASE", "correct horse battery staple"),
                        ("API_TOKEN", "kjhasdKJHsdkjhASDkjh"), ("API_KEY", "aBcDeFgHiJkL"),
                        ("X_TOKEN", "/aB3xK9mP2qL7vR4"),
                        ("SENTRY_DSN", "https://0a1b2c3d4e5f60718293a4b5c6d7e8f9@o1.ingest.sentry.io/1"),
                        ("WEBHOOK_SECRET", "https://hooks.example.com/T0A1B2/Xk9mP2qL7vR4tW8y"),
                        ("BW_SESSION", "b9Y2x0ZW5kc2VjcmV0c2Vzc2lvbnRva2VuMTIzNDU2Nzg5MA==")) + tuple(
            (k, v) for k, v in ENV_CREDENTIALS.items() if k != "UPSTREAM_URL"):  # a URL password: registered apart
        assert env_credential(name, value), (name, value)


def test_ordinary_values_reach_the_model_and_redacted_ones_are_never_written_back(cli, fake):
    """Round 19d: settings.py reached the model with its cookie name, path and header name as [REDACTED], and
    a model that wrote back what it was shown put "[REDACTED]" in place of a real key in app.env. Ordinary
    values are shown as they are; a write_file or edit_file that would put the marker where the file held a
    credential is refused, and the file keeps it."""
    settings = ('CSRF_COOKIE_NAME = "csrftoken"\nCREDS_PATH = "/etc/gcp/service-account.json"\n'
                'AUTH_HEADER = "Authorization"\n')
    (cli.workdir / "settings.py").write_text(settings)
    app_env = "SERVICE_TOKEN=%s\nPORT=80\n" % KEY19
    (cli.workdir / "app.env").write_text(app_env)
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("read_file", path="settings.py"), tool_call("read_file", path="app.env")]},
             {"tool_calls": [tool_call("write_file", path="app.env",
                                       content="SERVICE_TOKEN=[REDACTED]\nPORT=80\nDEBUG=0\n")]},
             {"tool_calls": [tool_call("edit_file", path="app.env", old_text="PORT=80", new_text="PORT=80\nDEBUG=0")]},
             {"tool_calls": [tool_call("edit_file", path="app.env", old_text="SERVICE_TOKEN=",
                                       new_text="TOKEN=[REDACTED]\n#")]},
             {"content": "done"})
    r = cli.run("run", "--allow-dangerous", "--prompt", "add DEBUG=0 to app.env",
                env={"MY_SERVICE_TOKEN": KEY19, "CSRF_COOKIE_NAME": "csrftoken", "API_KEY_HEADER": "Authorization",
                     "GOOGLE_APPLICATION_CREDENTIALS": "/etc/gcp/service-account.json"})
    assert r.returncode == 0, r.stderr
    read = [m["content"] for m in fake.model_requests()[1]["body"]["messages"] if m["role"] == "tool"]
    assert read[0] == settings and read[1] == "SERVICE_TOKEN=[REDACTED]\nPORT=80\n", read
    refused = [m["content"] for m in fake.model_requests()[2]["body"]["messages"] if m["role"] == "tool"][-1]
    assert refused.startswith("Error: app.env holds a credential") and "edit_file" in refused, refused
    edited = [m["content"] for m in fake.model_requests()[4]["body"]["messages"] if m["role"] == "tool"][-1]
    assert edited.startswith("Error: app.env holds a credential"), edited  # the key's line, moved behind the marker
    assert (cli.workdir / "app.env").read_text() == "SERVICE_TOKEN=%s\nPORT=80\nDEBUG=0\n" % KEY19


def test_a_known_value_is_found_in_word_swapped_hex_and_through_what_draws_nothing():
    """Round 19f: `od -x` and `hexdump` print 16-bit words with their bytes swapped, `xxd -i`'s last line of two
    bytes looked like a dump's printable column, and zero-width characters, a soft hyphen (&shy;), NUL, bidi
    marks, `\\E[…m` escapes (printf %q) and URL-encoded tags between a key's characters hid it."""
    register_secret(KEY19)
    data = ("SERVICE_TOKEN=%s\n" % KEY19).encode()
    for skip in (0, 1):  # both alignments of the key in the words
        body = b"x" * skip + data + b"\n" * (len(data) % 2)
        words = [body[i + 1:i + 2].hex() + body[i:i + 1].hex() for i in range(0, len(body), 2)]
        od_x = "".join("%07o %s\n" % (16 * n, " ".join(words[n * 8:n * 8 + 8])) for n in range((len(words) + 7) // 8))
        assert REDACTED in redact(od_x), od_x
    xxd_i = "unsigned char k_txt[] = {\n  " + ",\n  ".join(
        ", ".join("0x%02x" % b for b in data[i:i + 12]) for i in range(0, len(data), 12)) + "\n};\n"
    assert KEY19.encode()[-2:].hex() not in redact(xxd_i).replace("0x", "").replace(", ", ""), redact(xxd_i)
    for between in ("\u200b", "&shy;", "\x00", "\u200e", "\\E[01;31m", "%3C/b%3E%3Ci%3E", "&zwj;"):
        text = "token: %s%s%s end" % (KEY19[:12], between, KEY19[12:])
        assert redact(text) == "token: %s end" % REDACTED, (between, redact(text))
    assert redact("a\u200bb and x&shy;y, 2024-01-01") == "a\u200bb and x&shy;y, 2024-01-01"


def test_secrets_of_words_are_registered_and_a_short_number_stays_a_number():
    """Round 19f: JWT_SECRET=mysupersecretkey and the like were taken for a header's or cookie's name (the
    fix for CSRF_COOKIE_NAME=csrftoken), and PGPASSWORD=20240101 redacted every 2024-01-01 (a value of hex
    digits was looked for in hex dumps, separators and all)."""
    from xzatoma_store import env_credential
    for name, value in (("JWT_SECRET", "mysupersecretkey"), ("SESSION_SECRET", "keyboard-cat-secret"),
                        ("FLASK_SECRET_KEY", "dev-secret-key"), ("APP_SECRET", "ThisIsMySecret"),
                        ("MY_API_KEY", "CorrectHorseBattery")):
        assert env_credential(name, value), (name, value)
    register_secret("20240101")
    assert redact("## 2024-01-01, v2024.01.01, 20240101") == "## 2024-01-01, v2024.01.01, %s" % REDACTED


def test_the_write_refusal_holds_only_for_what_the_model_was_shown_redacted(cli, fake):
    """Round 19f: a hard-coded key the model saw as it is could not be moved to the environment (refused as
    "shown as [REDACTED]"); a comment holding the word [REDACTED] let a real key go; and a refused write could
    be made through a copy or a move over the file."""
    register_secret(KEY19)
    (cli.workdir / "a.py").write_text('import os\nAWS_KEY = "AKIAIOSFODNN7EXAMPLE"\n')
    app_env = "# values shown as [REDACTED] are secrets\nSERVICE_TOKEN=%s\nPORT=80\n" % KEY19
    (cli.workdir / "app.env").write_text(app_env)
    cli.use(fake)
    fake.add({"tool_calls": [tool_call("read_file", path="a.py"), tool_call("read_file", path="app.env")]},
             {"tool_calls": [tool_call("write_file", path="a.py", content='import os\nAWS_KEY = os.environ["AWS_KEY"]\n'
                                                                          'print(AWS_KEY[:4] + "[REDACTED]")\n'),
                             tool_call("write_file", path="app.env", content="SERVICE_TOKEN=[REDACTED]\nPORT=80\n"),
                             tool_call("write_file", path="new.env", content="SERVICE_TOKEN=[REDACTED]\nPORT=81\n"),
                             tool_call("copy_path", source_path="new.env", destination_path="app.env",
                                       overwrite=True),
                             tool_call("move_path", source_path="new.env", destination_path="app.env",
                                       overwrite=True)]},
             {"content": "done"})
    r = cli.run("run", "--allow-dangerous", "--prompt", "x", env={"MY_SERVICE_TOKEN": KEY19})
    assert r.returncode == 0, r.stderr
    results = tool_results(fake)[2:]  # after the two reads
    assert not results[0].startswith("Error") and "AWS_KEY = os.environ" in (cli.workdir / "a.py").read_text()
    assert not results[2].startswith("Error"), results  # new.env: no credential was there
    for refused in results[1:2] + results[3:5]:
        assert refused.startswith("Error: app.env holds a credential"), results
    assert (cli.workdir / "app.env").read_text() == app_env


def test_a_key_split_by_a_long_tag_is_never_streamed_in_part():
    """Round 19f: the half of a key before a 366-character `<span title="…">` went out while the tag was still
    arriving (the stream held an open tag of 256 characters, and judged the text before it without it)."""
    from xzatoma_tools import UntrustedStream
    register_secret(KEY19)
    title = " ".join("word%d" % i for i in range(60))  # a sentence, spaces and all
    answer = 'Key: %s<span title="%s">%s</span> and that is all for today, thanks.' % (KEY19[:12], title, KEY19[12:])
    for size in (1, 5, 64):
        stream, shown = UntrustedStream(), ""
        for i in range(0, len(answer), size):
            shown += stream.feed(answer[i:i + size])
            assert KEY19[:6] not in shown, (size, shown)
        shown += stream.finish()
        assert shown == redact(answer) and REDACTED in shown, (size, shown)
