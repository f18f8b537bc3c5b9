"""The MCP client in-process: configuration, names and approvals, results, Streamable HTTP against the fake
server (both generations, JSON and SSE answers), OAuth 2.1 against its stub, and cancellation on stdio."""

import json
import os
import sys
import threading
import time
import urllib.request

import pytest

import xzatoma_mcp as mcp
from fake_mcp import FakeHttpMcp

HERE = os.path.dirname(os.path.abspath(__file__))


class Ctx:
    """What McpTool.run reads of a ToolContext."""

    def __init__(self, interactive=False, deadline=None, cancel=None):
        from xzatoma_tools import Approvals
        self.approvals, self.deadline, self.cancel = Approvals(interactive), deadline, cancel


class Store:
    """A credential store in memory (get -> (value, where), set)."""

    def __init__(self):
        self.values = {}

    def get(self, name):
        value = self.values.get(name)
        return (value, "file") if value else (None, None)

    def set(self, name, value):
        self.values[name] = value
        return "file"


def servers(entries, tmp_path, **kw):
    warnings = []
    configs = mcp.parse_servers(entries, "test", os.environ, warnings)
    kw.setdefault("warn", warnings.append)
    s = mcp.Servers(configs, str(tmp_path), lambda mode, network, paths: None, home=str(tmp_path / "xz"), **kw)
    s.warnings = warnings
    return s


@pytest.fixture
def http():
    made = []

    def start(**kw):
        fake = FakeHttpMcp(**kw).start()
        made.append(fake)
        return fake
    yield start
    for fake in made:
        fake.stop()


# ---- configuration ----

def test_configuration_expands_variables_and_refuses_what_cannot_work():
    env = {"TOKEN": "t0ken-value-123456", "EMPTY": ""}
    warnings = []
    s, = mcp.parse_servers({"a": {"url": "https://h/mcp", "headers": {"X-Key": "${TOKEN}"}, "bearer_token": "${NOPE}",
                                  "color": "blue"}}, "cfg.yaml", env, warnings)
    assert s.transport == "http" and s.headers == {"X-Key": "t0ken-value-123456"} and s.bearer_token is None
    assert any("${NOPE}" in w for w in warnings) and any("unknown key 'color'" in w for w in warnings)
    s, = mcp.parse_servers({"b": {"command": "srv", "args": ["${EMPTY:-dflt}", "x"], "env": {"N": 3}}}, "f", env, [])
    assert s.transport == "stdio" and s.args == ["dflt", "x"] and s.env == {"N": "3"} and not s.network
    for entry, error in (({"type": "sse", "url": "http://h/sse"}, "HTTP+SSE transport of 2024-11-05"),
                         ({"args": ["x"]}, "needs a command"), ({"url": "ftp://h"}, "needs url"),
                         ({"command": "x", "timeout_seconds": 0}, "positive number"),
                         ({"command": "x", "allow": "*", "network": "yes"}, "network must be true or false")):
        with pytest.raises(mcp.ConfigError, match=error.replace("(", r"\(").replace("+", r"\+")):
            mcp.parse_servers({"s": entry}, "f", env, [])
    with pytest.raises(mcp.ConfigError, match="a server's name"):
        mcp.parse_servers({"bad name": {"command": "x"}}, "f", env, [])


def test_tool_names_fit_every_provider_and_stay_unique():
    assert mcp.tool_name("fs", "read_file", set()) == "mcp__fs__read_file"
    assert mcp.tool_name("fs", "get.thing/x y", set()) == "mcp__fs__get_thing_x_y"
    long = mcp.tool_name("server", "t" * 100, set())
    assert len(long) == 64 and long.startswith("mcp__server__ttt")
    a = mcp.tool_name("s", "a.b", set())
    b = mcp.tool_name("s", "a_b", {a})
    assert a != b and len(b) <= 64
    # round 18d: server a's tool b__x and server a__b's tool x, whichever starts first
    other = mcp.tool_name("a__b", "x", set())
    assert other.startswith("mcp__a__b__x_") and mcp.tool_name("a__b", "x", {"mcp__a__b__x"}) == other
    assert mcp.tool_name("a", "b__x", set()) == mcp.tool_name("a", "b__x", {other}) == "mcp__a__b__x"
    assert mcp.tool_name("a", "_x", set()) == "mcp__a___x"
    # round 18f: a server name's dots become underscores, so `a..b` is `a__b` and `a.` is `a_`
    assert mcp.tool_name("a..b", "x", set()).startswith("mcp__a__b__x_")
    assert mcp.tool_name("a.", "x", set()).startswith("mcp__a___x_")
    assert mcp.tool_name("a_", "x", set()).startswith("mcp__a___x_")


def test_approval_rules():
    def cfg(**kw):
        return mcp.parse_servers({"s": dict({"command": "x"}, **kw)}, "f", {}, [])[0]
    hinted = {"name": "look", "annotations": {"readOnlyHint": True}}
    plain = {"name": "write"}
    assert mcp.approval(cfg(), hinted) == "ask"  # a hint alone is the server's word
    assert mcp.approval(cfg(trust_read_only_hint=True), hinted) == "read-only"
    assert mcp.approval(cfg(read_only=["write"]), plain) == "read-only"
    assert mcp.approval(cfg(allow=["write"]), plain) == "allowed"
    assert mcp.approval(cfg(allow=["*"]), plain) == "allowed"


def test_results_are_rendered_and_nothing_is_dropped_silently():
    r = mcp.render_result({"content": [{"type": "image", "data": "AAAA", "mimeType": "image/png"},
                                       {"type": "resource_link", "uri": "file:///x", "name": "x"},
                                       {"type": "resource", "resource": {"uri": "b://1", "blob": "AAAAAAAA"}},
                                       {"type": "video"}]}, "T")
    assert r.success and r.output.splitlines() == [
        "[image from the tool: image/png, about 3 bytes; not shown to the model]", "[resource link] x <file:///x>",
        "[resource b://1: unknown type, about 6 bytes of binary data; not shown to the model]",
        "[content of type 'video'; not shown to the model]"]
    assert mcp.render_result({"structuredContent": {"a": 1}}, "T").output == 'structured content:\n{\n  "a": 1\n}'
    failed = mcp.render_result({"isError": True, "content": [{"type": "text", "text": "boom"}]}, "T")
    assert not failed.success and failed.to_message() == "Error: T reported an error: boom"
    assert mcp.render_result({}, "T").output == "(the tool returned no content)"


def test_header_values_and_x_mcp_header():
    assert mcp.header_value("us-west1") == "us-west1"
    assert mcp.header_value("Hello, 世界") == "=?base64?SGVsbG8sIOS4lueVjA==?="
    assert mcp.header_value(" padded ") == "=?base64?IHBhZGRlZCA=?="
    assert mcp.header_value("=?base64?literal?=") == "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="
    assert mcp.header_value(True) == "true"
    schema = {"properties": {"region": {"type": "string", "x-mcp-header": "Region"},
                             "o": {"type": "object", "properties": {"n": {"type": "integer", "x-mcp-header": "N"}}}}}
    assert mcp.mcp_headers(schema) == [("Region", ["region"]), ("N", ["o", "n"])]
    for bad in ({"type": "number", "x-mcp-header": "F"}, {"type": "string", "x-mcp-header": "a b"}):
        with pytest.raises(ValueError):
            mcp.mcp_headers({"properties": {"p": bad}})


def test_project_file_is_read_without_following_a_link(tmp_path):
    (tmp_path / "real.json").write_text('{"mcpServers": {}}')
    os.symlink(tmp_path / "real.json", tmp_path / ".mcp.json")
    assert mcp.read_project_file(str(tmp_path))[0] is None
    trust = mcp.ProjectTrust(str(tmp_path / "home"))
    assert not trust.trusted(str(tmp_path / "p"), "a")
    trust.trust(str(tmp_path / "p"), "a")
    assert trust.trusted(str(tmp_path / "p"), "a") and not trust.trusted(str(tmp_path / "p"), "b")
    assert os.stat(trust.path).st_mode & 0o077 == 0


# ---- Streamable HTTP ----

@pytest.mark.parametrize("era,version", [("dual", "2026-07-28"), ("modern", "2026-07-28"), ("legacy", "2025-11-25")])
def test_http_servers_of_each_generation(http, tmp_path, era, version):
    fake = http(era=era)
    s = servers({"h": {"url": fake.url, "allow": ["*"]}}, tmp_path).start()
    try:
        server = s.get("h")
        assert server.state == "running", server.error
        assert server.client.version == version
        add = next(t for t in s.tools() if t.remote == "add")
        assert add.run({"a": 20, "b": 22}, Ctx()).output == '{"sum": 42}'
        headers, body = fake.requests[-1]
        if era == "legacy":
            assert headers.get("Mcp-Session-Id") == "s1" and headers.get("MCP-Protocol-Version") == "2025-11-25"
            assert body["params"]["_meta"] == {"progressToken": body["id"]}  # no 2026 keys in a 2025 session
        else:
            assert headers["MCP-Protocol-Version"] == "2026-07-28" and headers["Mcp-Method"] == "tools/call"
            assert headers["Mcp-Name"] == "add" and "Mcp-Session-Id" not in headers
            assert body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] == "2026-07-28"
    finally:
        s.close()
    if era == "legacy":
        assert fake.sessions == {}  # DELETE ended the session


def test_http_sse_answers_carry_progress_and_a_cancel_closes_the_stream(http, tmp_path):
    fake = http(era="legacy", sse=True)
    notes = []
    s = servers({"h": {"url": fake.url, "allow": ["*"]}}, tmp_path, note=notes.append).start()
    try:
        slow = next(t for t in s.tools() if t.remote == "slow")
        assert slow.run({"seconds": 0.3}, Ctx()).output == "slept 0.3s"
        assert notes[0] == "  mcp h/slow: 0% step 0"  # then a few a second (PROGRESS_INTERVAL), not all ten
        assert 1 <= len(notes) < 10 and all(n.startswith("  mcp h/slow: ") for n in notes)
        cancel = threading.Event()
        threading.Timer(0.3, cancel.set).start()
        started = time.monotonic()
        with pytest.raises(mcp.ToolError, match="cancelled by user; the server was told to cancel it"):
            slow.run({"seconds": 20}, Ctx(cancel=cancel))
        assert time.monotonic() - started < 5
        # posted from the client's outgoing thread (no call waits on a server slow to take it)
        assert mcp_wait(lambda: any(b.get("method") == "notifications/cancelled" for _, b in fake.requests))
    finally:
        s.close()


def test_a_legacy_http_server_refusing_discovery_is_spoken_to_with_the_handshake(http, tmp_path):
    fake = http(era="legacy")
    s = servers({"h": {"url": fake.url}}, tmp_path).start()
    try:
        first = fake.requests[0][1]
        assert first["method"] == "server/discover"  # answered 400 "Server not initialized": not a modern error
        assert [b["method"] for _, b in fake.requests[1:3]] == ["initialize", "notifications/initialized"]
    finally:
        s.close()


def test_a_bearer_token_from_the_environment_is_sent_and_redacted(http, tmp_path):
    from xzatoma_store import redact
    fake = http()
    env = {"API_TOKEN": "sekrit-token-7f3a9c2e"}
    configs = mcp.parse_servers({"h": {"url": fake.url, "bearer_token_env": "API_TOKEN"}}, "f", env, [])
    s = mcp.Servers(configs, str(tmp_path), None, home=str(tmp_path / "xz")).start()
    try:
        assert fake.requests[0][0]["Authorization"] == "Bearer sekrit-token-7f3a9c2e"
        assert "sekrit-token-7f3a9c2e" not in redact("the token is sekrit-token-7f3a9c2e")
    finally:
        s.close()


# ---- OAuth 2.1 ----

def browser(url):
    """The person's browser: follows the authorization server's redirect back to the loopback listener."""
    threading.Thread(target=lambda: urllib.request.urlopen(url, timeout=10).read(), daemon=True).start()


def test_oauth_headless_fails_with_one_line_saying_how_to_log_in(http, tmp_path):
    fake = http(oauth=True)
    s = servers({"h": {"url": fake.url}}, tmp_path, credentials=Store(), interactive=False).start()
    server = s.get("h")
    assert server.state == "failed"
    assert server.error == "the server needs a login (HTTP 401): run 'xzatoma mcp login h' in a terminal"
    assert fake.registered == [] and fake.codes == {}  # nothing started, no browser
    s.close()


def test_oauth_login_with_pkce_registration_and_refresh(http, tmp_path):
    fake = http(oauth=True, token_ttl=1)
    store = Store()
    said = []
    s = servers({"h": {"url": fake.url, "allow": ["*"]}}, tmp_path, credentials=store, interactive=True,
                open_browser=browser, say=said.append).start()
    try:
        assert s.get("h").state == "running", s.get("h").error
        assert fake.registered[0]["redirect_uris"][0].startswith("http://127.0.0.1:")
        assert fake.registered[0]["token_endpoint_auth_method"] == "none"
        assert "log in with your browser" in said[0] and "code_challenge_method=S256" in said[0]
        assert "resource=http%3A%2F%2F127.0.0.1" in said[0]
        stored = json.loads(store.values["mcp.h"])
        assert stored["access_token"] in fake.tokens and stored["issuer"] == fake.base + "/as"
        time.sleep(1.1)  # the token expires: refreshed before the next call
        echo = next(t for t in s.tools() if t.remote == "echo")
        assert echo.run({"text": "hi"}, Ctx()).output == "hi"
        assert json.loads(store.values["mcp.h"])["access_token"] != stored["access_token"]
    finally:
        s.close()


def test_oauth_refuses_metadata_naming_another_issuer(http, tmp_path):
    fake = http(oauth=True, bad_issuer=True)
    s = servers({"h": {"url": fake.url}}, tmp_path, credentials=Store(), interactive=True, open_browser=browser,
                say=lambda text: None).start()
    assert s.get("h").state == "failed"
    assert "names issuer %s/evil, not %s/as: refused (RFC 8414 §3.3)" % (fake.base, fake.base) in s.get("h").error
    assert fake.registered == []
    s.close()


@pytest.mark.parametrize("resource, url, ok", [
    ("http://127.0.0.1:3738", "http://127.0.0.1:37383/mcp", False),  # a prefix of the text, another origin
    ("https://api.example.com", "https://api.example.com.evil.net/mcp", False),
    ("https://api.example.com/mc", "https://api.example.com/mcp", False),  # not at a path boundary
    ("http://api.example.com/mcp", "https://api.example.com/mcp", False),
    ("https://api.example.com/mcp?x=1", "https://api.example.com/mcp", False),
    ("https://api.example.com", "https://api.example.com/mcp", True), ("https://API.example.com:443/mcp/",
                                                                        "https://api.example.com/mcp", True),
    ("https://api.example.com/mcp", "https://api.example.com/mcp/v1", True)])
def test_a_protected_resource_covers_only_its_own_origin_and_paths_below(resource, url, ok):
    """RFC 9728 §3.3 (attack round 18d: a text prefix test took another origin for the server's own)."""
    assert mcp.covers(resource, url) is ok


@pytest.mark.parametrize("endpoint, ok", [
    ("https://as.example.com/authorize", True), ("http://127.0.0.1:9/authorize", True),
    ("http://localhost:9/a", True), ("http://[::1]:9/a", True), ("file:///etc/passwd?x", False),
    ("javascript:alert(1)", False), ("http://as.example.com/authorize", False), ("", False), (None, False),
    ("http://evil.example\\@127.0.0.1/authorize", False), ("https://as.example.com/a b", False)])
def test_an_authorization_endpoint_is_https_or_loopback(endpoint, ok):
    if ok:
        assert mcp.web_endpoint(endpoint, "authorization_endpoint") == endpoint
    else:
        with pytest.raises(mcp.McpError, match="not an https URL"):
            mcp.web_endpoint(endpoint, "authorization_endpoint")


# ---- stdio ----

def test_stdio_cancel_sends_notifications_cancelled(tmp_path):
    s = servers({"f": {"command": sys.executable, "args": [os.path.join(HERE, "fake_mcp.py"), "--era", "legacy"],
                       "allow": ["*"]}}, tmp_path).start()
    try:
        slow = next(t for t in s.tools() if t.remote == "slow")
        cancel = threading.Event()
        threading.Timer(0.3, cancel.set).start()
        with pytest.raises(mcp.ToolError, match="cancelled by user"):
            slow.run({"seconds": 20}, Ctx(cancel=cancel))
        log = tmp_path / "xz" / "mcp" / "f.log"
        assert mcp_wait(lambda: "cancelled: " in log.read_text()), log.read_text()
    finally:
        s.close()


def mcp_wait(predicate, timeout=5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_a_projects_file_takes_only_plain_variables_from_the_environment():
    from xzatoma_store import register_secret
    register_secret("registered-secret-9f8e7d6c5b4a")
    env = {"OPENAI_API_KEY": "sk-x", "MY_LLM": "v", "GH_TOKEN": "t", "REGION": "eu", "XZATOMA_HOME": "/h",
           "DB": "postgres://u:registered-secret-9f8e7d6c5b4a@db/x"}
    entries = {"own": {"command": "s", "env": {"A": "${MY_LLM}"}},
               "tok": {"command": "s", "args": ["${GH_TOKEN:-x}"]},
               "xz": {"command": "s", "args": ["--home=${XZATOMA_HOME}"]},
               "val": {"command": "s", "env": {"URL": "${DB}"}},
               "unset": {"command": "s", "env": {"K": "${NOT_SET_API_KEY}"}},
               "place": {"url": "https://h/mcp", "headers": {"Authorization": "Bearer ${REGION}"}},
               "oauth": {"url": "https://h/mcp", "oauth": {"client_secret": "${REGION}"}},
               "plain": {"command": "s", "args": ["${REGION}", "${NOPE:-d}"], "env": {"R": "${REGION}"},
                         "allow": ["*"]},
               "bad name": {"command": "s"}}
    configs, problems, warnings = mcp.parse_project(json.dumps({"mcpServers": entries}), "p/.mcp.json", env,
                                                    own={"MY_LLM"})
    assert [c.name for c in configs] == ["plain"]
    plain = configs[0]
    assert plain.args == ["eu", "d"] and plain.env == {"R": "eu"} and not plain.allow
    assert plain.written_lines() == ["stdio: s ${REGION} ${NOPE:-d}", "env: R=${REGION}"]
    why = dict(problems)
    for name, text in (("own", "env.A refers to ${MY_LLM}, the agent's own credential"),
                       ("tok", "args refers to ${GH_TOKEN}, a credential by its name"),
                       ("xz", "args refers to ${XZATOMA_HOME}, XZatoma's own variable"),
                       ("val", "env.URL refers to ${DB}, a credential by its value"),
                       ("unset", "env.K refers to ${NOT_SET_API_KEY}, a credential by its name"),
                       ("place", "headers.Authorization refers to ${REGION}, a credential by where it goes"),
                       ("oauth", "oauth.client_secret refers to ${REGION}, a credential by where it goes")):
        assert why[name] == ("p/.mcp.json: mcp server '%s' not started: %s; a project's file cannot hand the "
                             "environment's credentials to a server (give it one in your own configuration, "
                             "mcp.servers.%s)" % (name, text, name))
    assert why["bad name"].endswith("(not started)")
    assert any("allow ignored" in w for w in warnings)
    configs, problems, _ = mcp.parse_project("{", "p", env)  # the file as a whole: never raised
    assert configs == [] and problems[0][0] is None and problems[0][1].startswith("p: not valid JSON")
    # the person's own configuration expands every variable, as before
    own, = mcp.parse_servers({"own": {"command": "s", "env": {"K": "${OPENAI_API_KEY}"}}}, "cfg", env, [])
    assert own.env == {"K": "sk-x"}


# ---- hostile servers: every exchange ends by its deadline; one bad message costs that message only ----

def tool(s, remote):
    return next(t for t in s.tools() if t.remote == remote)


def in_thread(function, *args):
    """Run function(*args) on a thread; (thread, box): box["result"] or box["error"] once it ends."""
    box = {}

    def run():
        try:
            box["result"] = function(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


@pytest.fixture
def thread_errors(monkeypatch):
    """What escaped a thread (a traceback on the person's terminal otherwise)."""
    caught = []
    monkeypatch.setattr(threading, "excepthook", lambda args: caught.append(args.exc_type.__name__))
    return caught


def test_a_server_trickling_its_answers_holds_neither_a_call_nor_the_close_past_their_deadlines(
        http, tmp_path, thread_errors):
    # the call is never answered; the answers to notifications/cancelled and to the closing DELETE come a byte
    # at a time for ever: every read is short, so only a deadline on the whole exchange ends them
    fake = http(era="legacy", hostile={"hang": {"tools/call"}, "drip": {"notifications/cancelled", "DELETE"}})
    s = servers({"h": {"url": fake.url, "allow": ["*"], "timeout_seconds": 1.5}}, tmp_path).start()
    assert s.get("h").state == "running", s.get("h").error
    echo = tool(s, "echo")
    for run_limit, why in ((None, "no answer within 1.5s"), (0.8, "the run's time limit")):
        started = time.monotonic()
        ctx = Ctx(deadline=run_limit and started + run_limit)
        thread, box = in_thread(echo.run, {"text": "x"}, ctx)
        thread.join(8)
        assert not thread.is_alive(), "the call is still waiting after 8s"
        assert isinstance(box.get("error"), mcp.ToolError) and why in str(box["error"]), box
        assert time.monotonic() - started < 1.5 + 1.5
    assert mcp_wait(lambda: sum(b.get("method") == "notifications/cancelled" for _, b in fake.requests) == 2), \
        [(b.get("method"), (b.get("params") or {}).get("requestId")) for _, b in fake.requests][4:]
    started = time.monotonic()
    thread, _ = in_thread(s.close)
    thread.join(8)
    assert not thread.is_alive() and time.monotonic() - started < mcp.CLOSE_SECONDS + 1.5
    assert thread_errors == []


@pytest.mark.parametrize("answer,said", [
    ("deep", "the server's answer is not JSON-RPC (nested too deeply)"),
    ("sse_deep", "the server's stream ended without an answer (dropped: an event that is not JSON (nested too "
                 "deeply))")])
def test_an_unreadable_http_answer_fails_its_call_at_once_and_kills_no_thread(http, tmp_path, thread_errors,
                                                                              answer, said):
    fake = http(era="legacy", hostile={"call": answer})
    s = servers({"h": {"url": fake.url, "allow": ["*"], "timeout_seconds": 20}}, tmp_path).start()
    try:
        started = time.monotonic()
        with pytest.raises(mcp.ToolError) as caught:
            tool(s, "echo").run({"text": "x"}, Ctx())
        assert str(caught.value) == "MCP tool 'echo' of server 'h': " + said
        assert time.monotonic() - started < 5  # not the 20s of its timeout
        assert s.get("h").state == "running"  # the server is still used
    finally:
        s.close()
    assert thread_errors == []


def test_a_url_http_cannot_send_fails_the_server_at_once(tmp_path, thread_errors):
    s = servers({"h": {"url": "http://127.0.0.1:9/m\x01cp", "timeout_seconds": 20}}, tmp_path)
    started = time.monotonic()
    s.start()
    assert s.get("h").state == "failed" and s.get("h").error.startswith("cannot reach http://127.0.0.1:9/m")
    assert "\x01" not in s.get("h").error
    assert time.monotonic() - started < 5
    s.close()
    assert thread_errors == []


def test_an_sse_event_over_the_message_limit_is_dropped_as_it_is_read(http, tmp_path, monkeypatch):
    import tracemalloc
    monkeypatch.setattr(mcp, "MAX_MESSAGE", 1 << 20)
    fake = http(era="legacy", hostile={"call": ("sse_big", 24)})  # one data line of 24 MB, then the answer
    s = servers({"h": {"url": fake.url, "allow": ["*"], "timeout_seconds": 20}}, tmp_path).start()
    try:
        tracemalloc.start()
        try:
            assert tool(s, "echo").run({"text": "x"}, Ctx()).output == "done"
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 8 << 20, peak  # the server's own 1 MB chunks and ours: never the 24 MB line
        assert "an SSE event over 1048576 bytes dropped" in (tmp_path / "xz" / "mcp" / "h.log").read_text()
    finally:
        s.close()


def test_parse_sse_never_reads_more_than_its_limit_at_once():
    import io
    stream = io.BytesIO(b"data: " + b"x" * 5000 + b"\n\n" + b"data: y\n" * 600 + b"\n" + b"event: e\ndata: ok\n\n")
    sizes = []

    def readline(size=-1):
        line = stream.readline(size)
        sizes.append(len(line))
        return line
    assert list(mcp.parse_sse(readline, limit=1000)) == [(None, None), (None, None), ("e", "ok")]
    assert max(sizes) <= 1002


def test_a_flood_of_server_requests_over_http_is_answered_from_one_thread(http, tmp_path, thread_errors):
    # 2000 roots/list requests in the call's stream; the server holds each refusal POSTed to it for 3 s
    fake = http(era="legacy", hostile={"call": ("flood", 2000), "hold": 3})
    s = servers({"h": {"url": fake.url, "allow": ["*"], "timeout_seconds": 20}}, tmp_path).start()
    try:
        assert tool(s, "echo").run({"text": "x"}, Ctx()).output == "done"
        ours = [t.name for t in threading.enumerate() if t.name.startswith("mcp-")]
        assert len(ours) < 10, ours
        log = tmp_path / "xz" / "mcp" / "h.log"
        assert mcp_wait(lambda: "answers dropped" in log.read_text())
    finally:
        started = time.monotonic()
        s.close()
        assert time.monotonic() - started < mcp.CLOSE_SECONDS + 3
    assert thread_errors == []


def test_progress_of_a_call_is_shown_a_few_times_a_second(tmp_path):
    notes = []
    s = servers({"f": {"command": sys.executable, "args": [os.path.join(HERE, "fake_mcp.py"), "--era", "legacy"],
                       "allow": ["*"]}}, tmp_path, note=notes.append).start()
    try:
        started = time.monotonic()
        assert tool(s, "slow").run({"seconds": 0.6}, Ctx()).output == "slept 0.6s"  # 10 steps, 60 ms apart
        took = time.monotonic() - started
        assert notes[0] == "  mcp f/slow: 0% step 0" and len(notes) <= took / mcp.PROGRESS_INTERVAL + 1, notes
        assert len(notes) < 10
    finally:
        s.close()


def test_a_project_file_nested_too_deeply_is_an_invalid_file():
    with pytest.raises(mcp.ConfigError, match=r"^p/\.mcp\.json: not valid JSON: nested too deeply$"):
        mcp.project_servers("[" * 100000, "p/.mcp.json")
    with pytest.raises(ValueError, match="nested too deeply"):
        mcp.load_json('{"a":' * 100000)


def test_a_cursor_given_again_ends_the_listing_and_a_name_given_again_is_the_first():
    """Round 18f: a server repeating its page and cursor was paged 100 times, and its one tool offered twice."""
    class Pager:
        asked = 0
        tools = None

        def request(self, method, params, deadline=None):
            self.asked += 1
            return {"tools": [{"name": "t", "description": "d"}], "nextCursor": "again"}
    pager = Pager()
    tools = mcp.Client.list_tools(pager, None)
    assert [t["name"] for t in tools] == ["t"] and pager.asked == 2
