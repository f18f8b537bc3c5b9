"""Secrets and file modes: credentials never reach the store, a terminal or a log; XZATOMA_HOME is private.

Tokens here are fake but have the real shapes; the store is checked as FILE BYTES (the database and its
write-ahead log), so an index or a journal cannot keep what the tables do not.
"""

import json
import os
import stat

import pytest

from conftest import tool_call, wait_for
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


def secret_part(value):
    """What must disappear: the whole token, or what follows its label."""
    for label in ("aws_secret_access_key=", "Authorization: Bearer ", "Authorization: Basic ", "AccountKey="):
        if value.startswith(label):
            return value[len(label):]
    if value.startswith("postgres://"):
        return "Tr0ub4dor3xyz"
    return value


@pytest.mark.parametrize("family,value", TOKENS + [("pem", PEM)])
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
    everything = "\n".join(v for _, v in TOKENS) + "\n" + PEM
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
    for family, value in TOKENS + [("pem", PEM)]:
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
