"""fetch against a local HTTP server: SSRF guard on every hop, caps, HTML to text, cache, rate limit."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import xzatoma_tools
from xzatoma_store import Store
from xzatoma_tools import ToolContext, build_registry, html_to_text

PAGE = """<!doctype html><html><head><title>Demo &amp; Test</title><style>body{color:red}</style>
<script>var secret = "do not show";</script></head>
<body><nav><a href="/home">Home</a> | <a href="/about">About</a></nav>
<h1>Main   heading</h1>
<p>First   paragraph with a <a href="/docs/intro.html">relative link</a> and an
<a href="https://example.org/x">absolute one</a>. Entities: &lt;tag&gt; &eacute;&#233;</p>
<ul><li>one</li><li>two <b>bold</b></li></ul>
<ol><li>first</li><li>second</li></ol>
<pre>  indented
    code   block</pre>
<h2>Sub</h2><p>End.</p></body></html>"""


# round 19a: an HTML5 page may leave out </head>; a template's unfilled link and a marked section html.parser
# asserts on must cost themselves only
HEADLESS = ("<html><head><meta charset=utf-8><title>Release notes</title><body><h1>Version 2.0</h1>"
            "<p>BREAKING: foo is now bar.</p>")
HOSTILE = ('<h1>Docs</h1><p><a href="http://[[url]]">mirror</a></p><![foo[ x ]]><p>Install with pip.</p>'
           '<p>See <a href="/guide">the guide</a>.</p>')


def _gzip(data):
    import gzip
    return gzip.compress(data)


GZIPPED = _gzip(b"hello from gzip\n")
BOMB = _gzip(b"\0" * 50_000_000)  # 50 MB of zeros in about 50 KB
MEMBERS = _gzip(b"PART ONE. ") + _gzip(b"PART TWO: BREAKING CHANGES.") + _gzip(b"") + _gzip(b" END.") + b"\0" * 8
#: round 19f2: unknown and non-text charset names made fetch fail; a UTF-16 <meta> made an ASCII page CJK
CHARSET_ROUTES = {
    "/x-user-defined.html": (200, "text/html; charset=x-user-defined", "<p>café “q”</p>".encode("cp1252")),
    "/utf8mb4.html": (200, "text/html; charset=utf8mb4", "<p>café</p>".encode()),
    "/unknown.txt": (200, "text/plain; charset=no-such-charset", "café".encode()),
    "/hex.txt": (200, "text/plain; charset=hex", "café".encode()),
    "/idna.txt": (200, "text/plain; charset=idna", b"caf\xc3\xa9 \xff"),
    "/hebrew.html": (200, "text/html", "<meta charset=iso-8859-8-i><p>שלום</p>".encode("iso-8859-8")),
    "/meta16.html": (200, "text/html", b'<html><head><meta charset="utf-16"></head><p>Install with pip.</p>'),
    "/bom16.html": (200, "text/html; charset=iso-8859-1", "\ufeff<p>Install with pip.</p>".encode("utf-16-le")),
}


class Server:
    def __init__(self):
        self.hits = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.hits[self.path] = outer.hits.get(self.path, 0) + 1
                routes = {
                    "/page.html": (200, "text/html; charset=utf-8", PAGE.encode()),
                    "/plain.txt": (200, "text/plain", b"just text\n"),
                    "/data.json": (200, "application/json", b'{"a": 1}'),
                    "/image.png": (200, "image/png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 100),
                    "/big.txt": (200, "text/plain", b"b" * 3_000_000),
                    "/latin1.txt": (200, "text/plain; charset=iso-8859-1", "café".encode("latin-1")),
                    "/wiki/Caf%C3%A9": (200, "text/plain", b"the cafe page"),
                    "/search?q=two%20words": (200, "text/plain", b"two words found"),
                    "/quoted.txt": (200, 'text/plain; charset="iso-8859-1"', "café naïve".encode("latin-1")),
                    "/meta.html": (200, "text/html", "<meta charset=windows-1252><p>café €</p>".encode("cp1252")),
                    "/head.html": (200, "text/html", HEADLESS.encode()),
                    "/hostile.html": (200, "text/html", HOSTILE.encode()),
                }
                routes.update(CHARSET_ROUTES)
                if self.path in ("/gzip.txt", "/bomb.txt", "/members.txt"):  # encoded though identity was asked
                    body = {"/gzip.txt": GZIPPED, "/bomb.txt": BOMB, "/members.txt": MEMBERS}[self.path]
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Encoding", "gzip")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if self.path in routes:
                    status, ctype, body = routes[self.path]
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                redirects = {
                    "/to-page": "/page.html",
                    "/to-metadata": "http://169.254.169.254/latest/meta-data/",
                    "/to-localhost": "http://localhost:%d/page.html" % outer.port,
                    "/to-private": "http://10.1.2.3/",
                    "/to-file": "file:///etc/passwd",
                    "/loop": "/loop",
                    "/to-cafe": "/wiki/Caf\xc3\xa9",  # UTF-8 bytes, as servers send them (written as Latin-1)
                }
                if self.path in redirects:
                    self.send_response(302)
                    self.send_header("Location", redirects[self.path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(404)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", "9")
                self.end_headers()
                self.wfile.write(b"not found")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.port, path)


@pytest.fixture
def server():
    s = Server()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


@pytest.fixture(autouse=True)
def fresh_rate_limits():
    xzatoma_tools._rate_log.clear()


def fetcher(tmp_path, allowed=("127.0.0.1",), store=None, **fetch_cfg):
    cfg = dict({"allowed_hosts": list(allowed), "cache_ttl_seconds": 86400, "rate_limit_per_minute": 100}, **fetch_cfg)
    return build_registry("planning", ToolContext(str(tmp_path), {"fetch": cfg}, store=store))


def test_html_page_becomes_readable_text(tmp_path, server):
    r = fetcher(tmp_path).execute("fetch", {"url": server.url("/page.html")})
    assert r.success, r.error
    head, _, body = r.output.partition("\n\n")
    assert head == "URL: %s\nStatus: 200\nContent-Type: text/html" % server.url("/page.html")
    assert body.startswith("# Main heading\n\nFirst paragraph with a relative link (%s) and an absolute one "
                           "(https://example.org/x). Entities: <tag> éé" % server.url("/docs/intro.html"))
    assert "- one\n- two bold\n" in body and "1. first\n2. second" in body
    assert "  indented\n    code   block" in body and "## Sub\n\nEnd." in body
    for noise in ("do not show", "color:red", "About", "Home"):
        assert noise not in body


def test_text_types_pass_through_and_binary_is_refused(tmp_path, server):
    reg = fetcher(tmp_path)
    assert reg.execute("fetch", {"url": server.url("/plain.txt")}).output.endswith("\n\njust text\n")
    assert reg.execute("fetch", {"url": server.url("/data.json")}).output.endswith('{"a": 1}')
    assert reg.execute("fetch", {"url": server.url("/latin1.txt")}).output.endswith("café")
    err = reg.execute("fetch", {"url": server.url("/image.png")}).error
    assert err == "%s is binary content (image/png, 108 bytes); fetch returns only text" % server.url("/image.png")
    assert "Status: 404" in reg.execute("fetch", {"url": server.url("/missing")}).output


def test_size_cap_is_enforced_while_streaming(tmp_path, server):
    r = fetcher(tmp_path, max_response_size=1000).execute("fetch", {"url": server.url("/big.txt")})
    assert "[Truncated at 1000 bytes]" in r.output and r.output.endswith("\n\n" + "b" * 1000)
    r = fetcher(tmp_path).execute("fetch", {"url": server.url("/big.txt"), "max_bytes": 10})
    assert r.output.endswith("bbbbbbbbbb") and "[Truncated at 10 bytes]" in r.output


def test_loopback_is_refused_without_allowed_hosts(tmp_path, server):
    err = fetcher(tmp_path, allowed=()).execute("fetch", {"url": server.url("/page.html")}).error
    assert err == "127.0.0.1 is a loopback address"
    assert server.hits == {}


@pytest.mark.parametrize("path,message", [
    ("/to-metadata", "169.254.169.254 is a link-local address"),
    ("/to-localhost", "localhost resolves to"),
    ("/to-private", "10.1.2.3 is a private address"),
    ("/to-file", "only http and https URLs can be fetched"),
    ("/loop", "too many redirects (more than 5)"),
])
def test_every_redirect_is_checked(tmp_path, server, path, message):
    r = fetcher(tmp_path).execute("fetch", {"url": server.url(path)})
    assert not r.success and message in r.error


def test_good_redirect_is_followed_and_reported(tmp_path, server):
    r = fetcher(tmp_path).execute("fetch", {"url": server.url("/to-page")})
    assert r.output.startswith("URL: %s\nStatus: 200" % server.url("/page.html"))


def test_cache_serves_repeat_fetches(tmp_path, server):
    store = Store(str(tmp_path / "c.db")).open()
    reg = fetcher(tmp_path, store=store)
    first = reg.execute("fetch", {"url": server.url("/plain.txt")})
    second = reg.execute("fetch", {"url": server.url("/plain.txt")})
    assert first.output == second.output and second.metadata.get("cached") is True
    assert server.hits["/plain.txt"] == 1
    fetcher(tmp_path, store=store, cache_ttl_seconds=0).execute("fetch", {"url": server.url("/plain.txt")})
    assert server.hits["/plain.txt"] == 2


def test_per_domain_rate_limit(tmp_path, server):
    reg = fetcher(tmp_path, rate_limit_per_minute=3, cache_ttl_seconds=0)
    results = [reg.execute("fetch", {"url": server.url("/plain.txt")}) for _ in range(4)]
    assert [r.success for r in results] == [True, True, True, False]
    assert results[-1].error.startswith("rate limit: 3 fetches from 127.0.0.1 in the last minute")


def test_html_to_text_details():
    assert html_to_text("<p>a<br>b</p><p>c</p>") == "a\nb\n\nc\n"
    assert html_to_text("<a href='#top'>top</a> <a href='mailto:x@y'>mail</a>") == "top mail\n"
    assert html_to_text("<p>x &amp; y &#x263A;</p>") == "x & y ☺\n"
    assert html_to_text("<table><tr><td>a</td><td>b</td></tr></table>").strip() == "| a | b"
    assert html_to_text('<img alt="logo"><p>t</p>').startswith("[image: logo]")


def test_fetch_from_a_run_uses_the_config(cli, fake, tmp_path, server):
    cli.use(fake, tools={"fetch": {"allowed_hosts": ["127.0.0.1"]}})
    fake.add({"tool_calls": [{"name": "fetch", "arguments": {"url": server.url("/plain.txt")}},
                             {"name": "fetch", "arguments": {"url": "http://169.254.169.254/"}}]},
             {"content": "ok"})
    assert cli.run("run", "--mode", "planning", "--prompt", "x").returncode == 0
    results = [m["content"] for m in fake.model_requests()[1]["body"]["messages"] if m["role"] == "tool"]
    assert results[0].endswith("just text\n") and results[1].startswith("Error: 169.254.169.254 is a link-local")


@pytest.fixture
def dripper():
    """A server that answers a byte every 0.05 s for 100 s: no single read ever waits long enough to time out."""
    import socket
    import time
    stop = threading.Event()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def serve():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.recv(65536)
                    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2000\r\n"
                    for byte in [head[i:i + 1] for i in range(len(head))] + [b"\r\n"] + [b"x"] * 2000:
                        if stop.wait(0.05):
                            return
                        conn.sendall(byte)
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    yield "http://127.0.0.1:%d/drip" % listener.getsockname()[1]
    stop.set()
    listener.close()


@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_dripping_server_cannot_hold_a_fetch_past_its_time_limit(tmp_path, dripper, where):
    import time
    started = time.monotonic()
    r = fetcher(tmp_path, timeout_seconds=1 if where == "headers" else 6).execute("fetch", {"url": dripper})
    if where == "body":  # reaching the body takes ~4 s of headers: the limit falls in the body
        assert time.monotonic() - started >= 4
    assert r.error and "took longer than its time limit" in r.error, r.error
    assert time.monotonic() - started < 30  # before: every byte arrived, 100 s later, and the fetch succeeded


def test_the_runs_deadline_bounds_a_fetch(tmp_path, dripper):
    import time
    ctx = ToolContext(str(tmp_path), {"fetch": {"allowed_hosts": ["127.0.0.1"], "timeout_seconds": 600}})
    reg = build_registry("planning", ctx.with_deadline(time.monotonic() + 1))
    r = reg.execute("fetch", {"url": dripper})
    assert r.error.startswith("fetch stopped: the run's time limit was reached"), r.error


def test_one_thread_keeps_every_deadline():
    """shutdown_at's deadlines share one thread (a thread started per model request cost a watcher more than
    the model's answer): due ones fire in order, cancelled ones never, and cancelled far-off ones do not pile up."""
    import time
    fired, done = [], threading.Event()
    start = time.monotonic()
    alarms = [xzatoma_tools.DEADLINES.at(start + d, lambda d=d: fired.append(d)) for d in (0.3, 0.1, 0.2)]
    alarms[2].cancel()
    xzatoma_tools.DEADLINES.at(start + 0.4, done.set)
    assert done.wait(10)
    assert fired == [0.1, 0.3]
    for _ in range(1000):  # a long run's requests: each with a deadline an hour away, each cancelled
        xzatoma_tools.DEADLINES.at(time.monotonic() + 3600, lambda: None).cancel()
    assert len(xzatoma_tools.DEADLINES.heap) < 200
    assert [t.name for t in threading.enumerate()].count("xzatoma-deadlines") == 1


def test_a_name_that_resolves_differently_the_second_time_is_never_looked_up_twice(tmp_path, monkeypatch):
    """DNS rebinding: the first answer is public (it passes the check), every later one is 127.0.0.1. The
    connection must go to the address that was checked (held: a confirming test with a fake resolver)."""
    import socket

    import xzatoma_tools
    lookups, connects = [], []

    def resolver(host, port, *a, **k):
        lookups.append(host)
        address = "93.184.216.34" if len(lookups) == 1 else "127.0.0.1"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    def connect(address, *a, **k):
        connects.append(address[0])
        raise OSError(111, "Connection refused")
    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    monkeypatch.setattr(socket, "create_connection", connect)
    ctx = xzatoma_tools.ToolContext(str(tmp_path), {"fetch": {"rate_limit_per_minute": 0}})
    result = xzatoma_tools.build_registry("planning", ctx).execute("fetch", {"url": "http://rebind.example/x"})
    assert not result.success and "cannot fetch" in result.error, result.to_message()
    assert lookups == ["rebind.example"] and connects == ["93.184.216.34"]


def test_a_hostile_page_converts_in_linear_time_and_bounded_size():
    """round 19a: <pre> and 300,000 blanks took 80 s (re.sub rescanning the run); unclosed <a>s then as many
    </a> joined a growing tail each; "  " * depth made 13.5 KB of nested lists 4.5 MB of text. A child process,
    so the code before the fix fails by its timeout rather than holding the suite for minutes."""
    import subprocess
    import sys
    import textwrap
    code = textwrap.dedent("""
        import time
        from xzatoma_store import html_to_text
        M = 1_000_000
        shapes = {"pre blanks": "<pre>" + " " * M + "x</pre>", "blanks and tabs": (" \\t" * 500 + "<br>") * (M // 1004),
                  "unclosed links": "<a href=x>" * 40000 + "t " * 40000 + "</a>" * 40000,
                  "nested lists": "<ul>" * 110000 + "<li>x" * 110000, "paragraphs after big text":
                  "<pre>" + "x" * 500000 + "</pre>" + "<p>" * 120000, "title pieces": "<title>" + "x<b>" * 250000,
                  "marked sections": "<![foo[ x ]]>" * 76000, "many attributes": "<a " + "b=c " * 250000 + ">"}
        worst = 0
        for name, html in shapes.items():
            started = time.monotonic()
            text = html_to_text(html, "http://h/", 1048576)
            worst = max(worst, time.monotonic() - started)
            assert len(text) <= 1048576 + 200, (name, len(text))
        small = html_to_text("<ul>" * 1500 + "<li>x" * 1500)
        assert len(small) < 40000, len(small)  # was 4,500,002 characters
        print("worst %.1f s" % worst)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=__import__("os").path.dirname(xzatoma_tools.__file__))
    assert r.returncode == 0, r.stderr[-2000:]


def test_conversion_stops_at_its_deadline_and_its_limit():
    import time
    page = "<p>first</p>" + "<p>more words here</p>" * 20000
    text = html_to_text(page, "", None, time.monotonic() - 1)
    assert text.endswith("[The rest of the page was not converted: the fetch's time limit was reached]\n")
    assert len(html_to_text(page, "", 5000)) < 5100


def test_one_bad_construct_costs_only_itself_and_head_ends_at_the_body(tmp_path, server):
    reg = fetcher(tmp_path)
    out = reg.execute("fetch", {"url": server.url("/hostile.html")}).output
    assert "mirror (http://[[url]])" in out and "Install with pip." in out
    assert "the guide (%s)" % server.url("/guide") in out
    out = reg.execute("fetch", {"url": server.url("/head.html")}).output
    assert out.endswith("\n\n# Version 2.0\n\nBREAKING: foo is now bar.\n"), out
    assert html_to_text("<head><title>T</title></head><p>x") == "# T\n\nx\n"


def test_urls_are_percent_encoded_as_browsers_do(tmp_path, server):
    reg = fetcher(tmp_path)
    assert reg.execute("fetch", {"url": server.url("/wiki/Café")}).output.endswith("the cafe page")
    assert reg.execute("fetch", {"url": server.url("/to-cafe")}).output.endswith("the cafe page")
    assert reg.execute("fetch", {"url": server.url("/search?q=two words")}).output.endswith("two words found")
    assert server.hits["/wiki/Caf%C3%A9"] == 2 and server.hits["/search?q=two%20words"] == 1


def test_declared_charsets_and_gzip_are_decoded_and_a_bomb_stays_bounded(tmp_path, server):
    reg = fetcher(tmp_path)
    assert reg.execute("fetch", {"url": server.url("/quoted.txt")}).output.endswith("café naïve")
    assert reg.execute("fetch", {"url": server.url("/meta.html")}).output.endswith("café €\n")
    assert reg.execute("fetch", {"url": server.url("/gzip.txt")}).output.endswith("\n\nhello from gzip\n")
    r = fetcher(tmp_path, max_response_size=100000).execute("fetch", {"url": server.url("/bomb.txt")})
    assert "[Truncated at 100000 bytes]" in r.output and r.output.endswith("\n\n" + "\0" * 100000)


def test_a_truncated_body_is_never_cached(tmp_path, server):
    store = Store(str(tmp_path / "c.db")).open()
    reg = fetcher(tmp_path, store=store)
    first = reg.execute("fetch", {"url": server.url("/big.txt"), "max_bytes": 10})
    assert first.output.endswith("\n\nbbbbbbbbbb")
    small = reg.execute("fetch", {"url": server.url("/plain.txt"), "max_bytes": 1000})  # whole: cached
    second = fetcher(tmp_path, store=store, max_response_size=1000).execute("fetch", {"url": server.url("/big.txt")})
    assert second.output.endswith("b" * 1000) and not second.metadata.get("cached")
    assert server.hits["/big.txt"] == 2 and small.success


def test_the_rate_limit_counts_an_address_however_it_is_spelled(tmp_path, server):
    spellings = ["127.0.0.1", "2130706433", "0x7f000001", "127.1"]
    reg = fetcher(tmp_path, allowed=spellings, rate_limit_per_minute=2, cache_ttl_seconds=0)
    results = [reg.execute("fetch", {"url": "http://%s:%d/plain.txt" % (h, server.port)}) for h in spellings]
    assert [r.success for r in results] == [True, True, False, False]
    assert results[2].error.startswith("rate limit: 2 fetches from 0x7f000001 (127.0.0.1) in the last minute")


def test_a_slow_dns_answer_is_waited_for_only_until_the_fetch_deadline(tmp_path, monkeypatch):
    import socket
    import time
    release = threading.Event()

    def slow(*a, **k):
        release.wait(30)
        raise socket.gaierror(-2, "Name or service not known")
    monkeypatch.setattr(socket, "getaddrinfo", slow)
    try:
        started = time.monotonic()
        r = fetcher(tmp_path, timeout_seconds=1).execute("fetch", {"url": "http://slow.example/"})
        assert r.error == "resolving slow.example took longer than the fetch's time limit", r.error
        assert time.monotonic() - started < 10
    finally:
        release.set()


def test_allowed_hosts_one_rule_and_a_port_narrows(tmp_path, server):
    verdict, reason = xzatoma_tools.url_verdict("http://127.0.0.1:8080/", ["LocalHost", "127.0.0.1."])
    assert (verdict, reason) == ("allow", "127.0.0.1 is in agent.tools.fetch.allowed_hosts (connects to 127.0.0.1)")
    assert xzatoma_tools.url_verdict("http://localhost./", ["LocalHost"])[1].startswith("localhost is in")
    assert fetcher(tmp_path, allowed=["127.0.0.1:%d" % server.port]).execute(
        "fetch", {"url": server.url("/plain.txt")}).success
    err = fetcher(tmp_path, allowed=["127.0.0.1:%d" % (server.port + 1)]).execute(
        "fetch", {"url": server.url("/plain.txt")}).error
    assert err == "127.0.0.1 is a loopback address"


def test_url_mentions_leave_the_sentence_punctuation_and_may_stand_in_brackets(cli, fake, tmp_path, server):
    cli.use(fake, tools={"fetch": {"allowed_hosts": ["127.0.0.1"]}})
    fake.add({"content": "ok"})
    task = "Read @url:%s. Then (@url:%s), and \\@url:%s." % (server.url("/plain.txt"), server.url("/data.json"),
                                                              server.url("/missing"))
    assert cli.run("run", "--prompt", task).returncode == 0
    assert server.hits == {"/plain.txt": 1, "/data.json": 1}
    message = "\n".join(m["content"] for m in fake.model_requests()[0]["body"]["messages"] if m["role"] == "user")
    assert "[Content of @url:%s]" % server.url("/plain.txt") in message and '{"a": 1}' in message


def test_a_parser_that_cannot_go_on_leaves_the_rest_as_plain_text(monkeypatch):
    """round 19a: an exception out of html.parser made the page an error; now the text so far and the rest as
    plain text. The failure is forced where no construct's guard can catch it (goahead's own bookkeeping)."""
    import _markupbase
    calls, updatepos = [], _markupbase.ParserBase.updatepos

    def failing(self, i, j):
        calls.append(i)
        if len(calls) == 4:
            raise RuntimeError("the parser's own failure")
        return updatepos(self, i, j)
    monkeypatch.setattr(_markupbase.ParserBase, "updatepos", failing)
    assert html_to_text("<p>one</p>\n<p>two &amp; <b>three</b></p>\n<p>four</p>") == "one\n\ntwo & three four\n"


def test_unclosed_comments_and_sections_stay_linear_and_close_keeps_the_deadline():
    """round 19f2: '<!--x>' repeated with no '-->' after made html.parser's close() search the rest of the page
    once per comment: 1 MB took 250 s, past the deadline (close() ran unchecked). A child process, so the code
    before the fix fails by its timeout."""
    import subprocess
    import sys
    import textwrap
    code = textwrap.dedent("""
        import time
        from xzatoma_store import html_to_text
        M = 1_000_000
        shapes = {"comments": "<p>hi</p>" + "<!--x>" * (M // 6), "dashed comments": "<!---x>" * (M // 7),
                  "comments, one end": "<!--x>" * (M // 6) + "-->", "after the last end": "<!-- a -->" + "<!--x>" * (M // 6),
                  "sections": "<![CDATA[x>" * (M // 11), "sections, a short end": "<![CDATA[x>" * (M // 11) + "]>",
                  "mixed": "<!--x><![CDATA[y><?z><!w></v <!DOCTYPE >" * (M // 40)}
        worst = 0
        for name, html in shapes.items():
            started = time.monotonic()
            html_to_text(html, "http://h/", 1048576, time.monotonic() + 10)
            worst = max(worst, time.monotonic() - started)
            assert time.monotonic() - started < 8, name
        assert html_to_text("<p>a<!-- c -->b<!--x>y</p>") == "ab<!--x>y\\n"
        print("worst %.1f s" % worst)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=__import__("os").path.dirname(xzatoma_tools.__file__))
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_numeric_reference_of_any_length_costs_only_itself():
    """round 19f2: html.unescape's int() refuses more than 4300 digits, and one such reference made the whole
    page an error (the plain-text fallback too)."""
    from xzatoma_store import _plain_text
    long_refs = "&#%s;&#%s65;&#x%s41;&#x110000;" % ("1" * 5000, "0" * 5000, "0" * 5000)
    page = "<p>Install with pip.</p><p>%s</p><a href='/x&#%s;'>link</a>" % (long_refs, "9" * 5000)
    assert html_to_text(page, "http://h/") == "Install with pip.\n\n\ufffdAA\ufffd\n\nlink (http://h/x\ufffd)\n"
    assert _plain_text(page) == "Install with pip. \ufffdAA\ufffd link"


def test_unknown_and_non_text_charsets_read_as_utf8_and_whatwg_labels_are_known(tmp_path, server):
    """round 19f2: b"".decode(name) never looked the codec up, so x-user-defined, utf8mb4, hex and idna made
    fetch fail; iso-8859-8-i (the WHATWG label of Hebrew pages) too."""
    reg = fetcher(tmp_path)
    out = {path: reg.execute("fetch", {"url": server.url(path)}) for path in CHARSET_ROUTES}
    assert all(r.success for r in out.values()), {p: r.error for p, r in out.items() if not r.success}
    assert out["/x-user-defined.html"].output.endswith("\n\ncafé “q”\n")
    assert out["/utf8mb4.html"].output.endswith("\n\ncafé\n")
    for path in ("/unknown.txt", "/hex.txt"):
        assert out[path].output.endswith("\n\ncafé"), out[path].output
    assert out["/idna.txt"].output.endswith("\n\ncafé \ufffd")
    assert out["/hebrew.html"].output.endswith("\n\nשלום\n")


def test_a_utf16_meta_means_utf8_and_a_bom_decides(tmp_path, server):
    """round 19f2: <meta charset="utf-16"> on an ASCII page turned it into CJK; HTML's prescan reads a UTF-16
    label in a <meta> as UTF-8 (a meta readable as ASCII is no UTF-16 page), and a byte order mark wins."""
    reg = fetcher(tmp_path)
    assert reg.execute("fetch", {"url": server.url("/meta16.html")}).output.endswith("\n\nInstall with pip.\n")
    assert reg.execute("fetch", {"url": server.url("/bom16.html")}).output.endswith("\n\nInstall with pip.\n")


def test_every_gzip_member_is_decoded_within_the_size_cap(tmp_path, server):
    """round 19f2: only the first member of a multi-member gzip body was read, with no note."""
    r = fetcher(tmp_path).execute("fetch", {"url": server.url("/members.txt")})
    assert r.output.endswith("\n\nPART ONE. PART TWO: BREAKING CHANGES. END.") and "[Truncated" not in r.output
    assert xzatoma_tools._decoded_body(MEMBERS, "gzip", 20, "u") == (b"PART ONE. PART TWO: ", True)
    many = xzatoma_tools._decoded_body(_gzip(b"") * 50000 + _gzip(b"last"), "gzip", 10, "u")
    assert many == (b"last", False)
