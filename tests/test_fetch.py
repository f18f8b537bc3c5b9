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
                }
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
