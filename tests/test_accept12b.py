"""Acceptance-style attacks on issue 12's surfaces the earlier passes did not reach (helper accept12b).

Hostile bytes through argv, paths on stdout, readline's completion list and files that are not UTF-8;
credentials named the way real services name them, URL userinfo without a password, token shapes of
command lines and cookies. Harmless payloads only; every test here failed on the code before its fix.
"""

import json
import os
import re
import subprocess

import pytest

from conftest import tool_call
from ptyrun import PtyProcess
from test_secrets import db_bytes
from xzatoma_store import REDACTED, redact

ESC_TITLE = "\x1b]0;pwned\x07\x1b[2J\u202e"
HOSTILE = ["\x1b", "\u202e", "\x9b", "\x07", "\x08", "\x7f", "\u2066", "\u200b", "\ufeff", "\U000e0041", "\x00"]


def assert_clean(text, where):
    for ch in HOSTILE:
        assert ch not in text, "%r reached %s raw: %r" % (ch, where, text[-500:])
    assert "\r" not in text.replace("\r\n", "\n"), "a lone CR reached %s: %r" % (where, text[-500:])


def pty_run(cli, *args, env=None):
    p = PtyProcess(cli.command(*args), dict(cli.env, TERM="xterm", **(env or {})), str(cli.workdir))
    try:
        code = p.wait()
    finally:
        p.close()
    return code, p.seen


# ---- hostile bytes ----


def test_an_unrecognized_argument_is_shown_not_obeyed(cli):
    # argparse quoted it raw: a file name a script passes on (`xzatoma run $f`) could clear the screen
    r = cli.run("run", "--bogus" + ESC_TITLE, "--prompt", "x")
    assert r.returncode == 2
    assert "unrecognized argument: --bogus\\x1b]0;pwned\\x07" in r.stderr
    assert_clean(r.stderr, "stderr")


def test_config_path_is_data_when_piped_and_inert_on_a_terminal(cli):
    path = str(cli.tmp / ("conf" + ESC_TITLE + ".yaml"))
    r = cli.run("config", "path", env={"XZATOMA_CONFIG": path})
    assert r.returncode == 0 and r.stdout == path + "\n"  # a script reading it gets the name as it is
    code, seen = pty_run(cli, "config", "path", env={"XZATOMA_CONFIG": path})
    assert code == 0
    assert "conf\\x1b]0;pwned\\x07\\x1b[2J\\u202e.yaml" in seen
    assert_clean(seen, "the terminal")


def test_config_init_on_a_terminal_shows_the_path_inert(cli):
    path = str(cli.tmp / ("new" + ESC_TITLE + ".yaml"))
    code, seen = pty_run(cli, "config", "init", env={"XZATOMA_CONFIG": path})
    assert code == 0 and os.path.exists(path)
    assert_clean(seen, "the terminal")


def test_a_config_file_that_is_not_utf8_is_a_config_error(cli):
    cli.config_path.parent.mkdir(parents=True, exist_ok=True)
    cli.config_path.write_bytes(b"provider:\n  type: ollama # \x9b2J \xff\n")
    r = cli.run("config", "show")
    assert r.returncode == 2, r.stderr  # a configuration mistake (was: internal error, exit 1)
    assert "not UTF-8" in r.stderr and "internal error" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert_clean(r.stderr, "stderr")


def test_chat_completion_never_offers_a_name_with_hidden_characters(chat, fake, cli):
    # readline listed the matches raw: a bidi override in a file name reordered the list on screen, and a
    # zero-width character was typed into the line unseen
    (cli.workdir / "abc-plain.txt").write_text("x")
    (cli.workdir / "ab\u202etxt.exe").write_text("x")
    (cli.workdir / "ab\u200bc-plain.txt").write_text("x")
    p = chat()
    p.expect(r"\[PLANNING\]\[SAFE\] >> ")
    p.send("@ab\t\t")
    p.expect("abc-plain.txt")
    p.send("\x15")  # clear the line
    p.line("/status")
    p.expect(r"\[PLANNING\]\[SAFE\] >> ")
    assert "\u202e" not in p.seen and "\u200b" not in p.seen


# ---- secrets ----

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


def test_ordinary_command_lines_and_code_are_left_alone():
    for text in ("docker run -u 1000:1000 img", "git push -u origin main", "sort -u a:bcdef",
                 "session_factory = make_session(config)", "mysql -p app", "the --password flag asks for it",
                 "author: Jane Doe", "signature = sign(body)", "sid = 42"):
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


# ---- the watcher: what a topic says ----


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


# ---- file modes ----


def test_files_an_older_version_left_loose_are_tightened_at_the_next_run(cli, fake):
    # the database and audit.log were tightened, but undo.key (it seals undo's saved contents), a rotated
    # audit.log.1 and chat_history stayed 0644 in a home tightened back to 0700
    cli.use(fake, terminal={"default_mode": "restricted_autonomous"})
    fake.add({"tool_calls": [tool_call("terminal", command="ls")]}, {"content": "ok"})
    (cli.workdir / "f.txt").write_text("old\n")
    fake.add({"tool_calls": [tool_call("write_file", path="f.txt", content="new\n")]}, {"content": "ok"})
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


# ---- fetch: checked after resolution, in every spelling, before any cached page ----

# what the stub resolver answers (the tests never touch real DNS): name -> addresses
RESOLVES = {
    "mixed.test": ["93.184.216.34", "192.0.0.170"],  # one public, one IETF-protocol address
    "nat64-metadata.test": ["64:ff9b::a9fe:a9fe"],
    "compat.test": ["::10.0.0.1"],
    "sixtofour.test": ["2002:c0a8:0101::1"],
    "mapped.test": ["::ffff:192.0.0.8"],
    "teredo.test": ["2001:0:4136:e378:8000:63bf:3fff:fdd2"],
    "siit.test": ["::ffff:0:7f00:1"],
    "public.test": ["93.184.216.34"],
}


@pytest.fixture
def resolver(monkeypatch):
    import ipaddress
    import socket

    def getaddrinfo(host, port, *args, **kwargs):
        name = host.encode("idna").decode("ascii").lower().rstrip(".") if isinstance(host, str) else host
        try:
            addresses = [str(ipaddress.ip_address(name))]
        except ValueError:
            addresses = RESOLVES.get(name)
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, port, 0, 0) if ":" in a else (a, port)) for a in addresses]
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return RESOLVES


BLOCKED_URLS = [
    "http://mixed.test/", "http://nat64-metadata.test/", "http://compat.test/", "http://sixtofour.test/",
    "http://mapped.test/", "http://teredo.test/", "http://siit.test/", "http://MIXED.test./",
    "http://\u2460\u2461\u2466.0.0.1/",  # circled digits: IDNA maps them to 127.0.0.1
    "http://127\u30020\u30020\u30021/", "http://127\uff0e0\uff0e0\uff0e1/",  # ideographic and full-width dots
    "http://0177.1/", "http://0x7f.1/", "http://2130706433./", "http://0x7f000001/", "http://127.0.0.1../",
    "http://[::ffff:7f00:1]/", "http://[0:0:0:0:0:ffff:127.0.0.1]/", "http://[::127.0.0.1]/",
    "http://192.0.0.8/", "http://3221225480/", "http://0300.0.0.010/", "http://[64:ff9b::c000:8]/",
    "http://[2002:c000:0008::]/", "http://user:pw@192.0.0.9:80/", "https://[fd00::1]:443/",
    "http://169.254.169.254.nip.io.@192.0.0.10/",
]


@pytest.mark.parametrize("url", BLOCKED_URLS)
def test_fetch_refuses_special_purpose_addresses_in_every_spelling(resolver, url):
    import xzatoma_tools
    verdict, reason = xzatoma_tools.url_verdict(url)
    assert verdict == "block", (url, reason)


def test_a_public_name_is_allowed_by_the_stub(resolver):
    import xzatoma_tools
    assert xzatoma_tools.url_verdict("http://public.test/")[0] == "allow"


def test_a_cached_page_whose_name_now_resolves_inside_is_not_served(resolver, tmp_path):
    # cached while the name was public; the name now resolves to a blocked address (rebinding)
    from xzatoma_store import Store
    from xzatoma_tools import ToolContext, build_registry
    store = Store(str(tmp_path / "c.db")).open()
    store.cache_put("http://rebound.test/page", 200, "text/plain", "http://rebound.test/page", "cached secret page")
    resolver["rebound.test"] = ["10.1.2.3"]
    ctx = ToolContext(str(tmp_path), {"fetch": {"cache_ttl_seconds": 86400, "rate_limit_per_minute": 100}},
                      store=store)
    result = build_registry("planning", ctx).execute("fetch", {"url": "http://rebound.test/page"})
    assert not result.success and "10.1.2.3" in result.error and "private" in result.error
    assert "cached secret page" not in result.to_message()
    store.close()
