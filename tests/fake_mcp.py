"""A standard-library MCP server for the tests: stdio or Streamable HTTP, the 2025 handshake, the 2026-07-28
stateless revision (server/discover, per-request _meta, required headers), or both; an OAuth 2.1 stub.

stdio:  python tests/fake_mcp.py [--era legacy|modern|dual] [--legacy-version V] [--probe error|silent|crash]
        [--hostile] [--mute] [--flood N]
Every message received is written to stderr as `recv: {json}` (XZatoma keeps a server's stderr in its log).
Hostile modes: --hostile sends malformed messages before each call's answer, --mute never answers anything,
--flood N answers a call after N sampling/createMessage requests, and stops reading its input first.
HTTP:   FakeHttpMcp(era=..., oauth=False, sse=False, hostile=None).start() in the test process; .url is the MCP
endpoint; `hostile` (see FakeHttpMcp) makes it hang, trickle, or answer with what a client must survive.

Tools: echo (readOnlyHint), add (structured content), write_file, connect (a TCP connection to 127.0.0.1),
slow (progress notifications; stops when cancelled), rich (image, resource link, embedded resource), fail
(isError), crash (the server exits), env (reads a variable), spawn (starts a long-lived child; its pid).
"""

import base64
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODERN = "2026-07-28"
LEGACY = "2025-11-25"

TOOLS = [
    {"name": "echo", "description": "Echo the text back.", "annotations": {"readOnlyHint": True},
     "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
    {"name": "add", "description": "Add two integers.", "annotations": {"readOnlyHint": True},
     "inputSchema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                     "required": ["a", "b"]},
     "outputSchema": {"type": "object", "properties": {"sum": {"type": "integer"}}}},
    {"name": "write_file", "description": "Write text to a file (any path).", "annotations": {"destructiveHint": True},
     "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
                     "required": ["path", "text"]}},
    {"name": "connect", "description": "Open a TCP connection to 127.0.0.1:port and send 'hello'.",
     "inputSchema": {"type": "object", "properties": {"port": {"type": "integer"}}, "required": ["port"]}},
    {"name": "slow", "description": "Take a while, reporting progress.",
     "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}}},
    {"name": "rich", "description": "Answer with an image, a resource link and an embedded resource.",
     "inputSchema": {"type": "object", "properties": {}}},
    {"name": "fail", "description": "Report an error.", "inputSchema": {"type": "object", "properties": {}}},
    {"name": "crash", "description": "Exit at once.", "inputSchema": {"type": "object", "properties": {}}},
    {"name": "env", "description": "Read an environment variable.",
     "inputSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
    {"name": "spawn", "description": "Start a long-lived child process; return its pid.",
     "inputSchema": {"type": "object", "properties": {}}},
]
#: FAKE_MCP_EXTRA_TOOLS=N: N more tools, each with a 2 KB description (a server offering too many)
TOOLS += [{"name": "extra%d" % i, "description": "x" * 2048, "inputSchema": {"type": "object", "properties": {}}}
          for i in range(int(os.environ.get("FAKE_MCP_EXTRA_TOOLS") or 0))]


class Core:
    """The protocol, whatever carries it. `send(message)` writes one message to the client."""

    def __init__(self, era="dual", legacy_version=LEGACY, probe="error", send=None, log=None, hostile=False,
                 flood=0):
        self.hostile = hostile  #: malformed messages before each call's answer
        self.flood = flood  #: server->client requests sent before each call's answer
        self.era = era
        self.legacy_version = legacy_version
        self.probe = probe
        self.send = send
        self.log = log or (lambda text: None)
        self.initialized = False
        self.cancelled = set()
        self.children = []

    def handle(self, message):
        """The answer to a request (a dict), or None (a notification, or an answer sent already)."""
        self.log("recv: " + json.dumps(message))
        method, params, mid = message.get("method"), message.get("params") or {}, message.get("id")
        if mid is None:
            if method == "notifications/cancelled":
                self.cancelled.add(params.get("requestId"))
            elif method == "notifications/initialized":
                self.initialized = True
            return None
        meta = params.get("_meta") or {}
        version = meta.get("io.modelcontextprotocol/protocolVersion")
        if method == "initialize":
            if self.era == "modern":
                return error(mid, -32601, "initialize is not part of MCP %s; this server speaks only %s" % (MODERN, MODERN))
            self.initialized = True
            return result(mid, {"protocolVersion": self.legacy_version, "capabilities": {"tools": {}},
                                "serverInfo": {"name": "fake-mcp", "version": "1.0"}, "instructions": "fake"})
        if version is None and self.era != "legacy" and not self.initialized:
            return error(mid, -32600, "the request lacks io.modelcontextprotocol/protocolVersion in _meta")
        if version is not None and self.era == "legacy":
            if method == "server/discover":
                if self.probe == "silent":
                    return None
                if self.probe == "crash":
                    os._exit(7)
            return error(mid, -32601, "Method not found: %s" % method)
        if version is not None and version != MODERN:
            return error(mid, -32022, "Unsupported protocol version", {"supported": [MODERN], "requested": version})
        if method == "server/discover":
            return result(mid, {"supportedVersions": [MODERN] + ([LEGACY] if self.era == "dual" else []),
                                "capabilities": {"tools": {}}, "instructions": "fake",
                                "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "fake-mcp", "version": "1.0"}},
                                "resultType": "complete", "ttlMs": 0, "cacheScope": "private"})
        if method == "ping":
            return result(mid, {})
        if method == "tools/list":
            return result(mid, {"tools": TOOLS})
        if method == "tools/call":
            return self.call(mid, params.get("name"), params.get("arguments") or {}, meta.get("progressToken"))
        return error(mid, -32601, "Method not found: %s" % method)

    def call(self, mid, name, args, token):
        if self.hostile and self.send is not None:
            deep = "[" * 100000
            for raw in (deep, '{"jsonrpc": "2.0", "id": [1], "result": {}}', '{"jsonrpc": "2.0", "id": {"a": 1}}',
                        '{"jsonrpc": "2.0", "method": "notifications/progress", "params": "x"}',
                        '{"jsonrpc": "2.0", "method": 5}', '{"jsonrpc": "2.0", "id": 7, "method": "ping", "params": 3}',
                        '[1, "two", {"id": true, "result": {}}]', '"text"', "not json",
                        json.dumps({"jsonrpc": "2.0", "method": "notifications/progress",
                                    "params": {"progressToken": token, "progress": 1e308, "total": 1e-308}}),
                        json.dumps({"jsonrpc": "2.0", "method": "notifications/progress",
                                    "params": {"progressToken": [token], "progress": 1}}),
                        json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                                    "params": {"level": {"x": 1}, "data": 10 ** 400}})):
                self.send(raw)  # text: written as it is
        for k in range(self.flood):
            if self.send is not None:
                self.send({"jsonrpc": "2.0", "id": "s%d" % k, "method": "sampling/createMessage", "params": {}})
        if name == "echo":
            return result(mid, {"content": [{"type": "text", "text": args.get("text", "")}]})
        if name == "add":
            total = int(args["a"]) + int(args["b"])
            return result(mid, {"content": [{"type": "text", "text": json.dumps({"sum": total})}],
                                "structuredContent": {"sum": total}})
        if name == "write_file":
            try:
                with open(args["path"], "w") as fh:
                    fh.write(args["text"])
            except OSError as exc:
                return result(mid, {"isError": True, "content": [{"type": "text", "text": "cannot write: %s" % exc}]})
            return result(mid, {"content": [{"type": "text", "text": "wrote %s" % args["path"]}]})
        if name == "connect":
            try:
                with socket.create_connection(("127.0.0.1", int(args["port"])), timeout=3) as sock:
                    sock.sendall(b"hello")
            except OSError as exc:
                return result(mid, {"isError": True, "content": [{"type": "text", "text": "cannot connect: %s" % exc}]})
            return result(mid, {"content": [{"type": "text", "text": "connected"}]})
        if name == "slow":
            seconds = float(args.get("seconds", 2))
            steps = 10
            for i in range(steps):
                if mid in self.cancelled:
                    self.log("cancelled: %s" % mid)
                    return None  # a cancelled request gets no answer
                if token is not None and self.send is not None:
                    self.send({"jsonrpc": "2.0", "method": "notifications/progress",
                               "params": {"progressToken": token, "progress": i, "total": steps,
                                          "message": "step %d" % i}})
                time.sleep(seconds / steps)
            return result(mid, {"content": [{"type": "text", "text": "slept %gs" % seconds}]})
        if name == "rich":
            return result(mid, {"content": [
                {"type": "text", "text": "three things"},
                {"type": "image", "data": base64.b64encode(b"\x89PNG" + b"\0" * 96).decode(), "mimeType": "image/png"},
                {"type": "resource_link", "uri": "file:///project/README.md", "name": "README.md",
                 "mimeType": "text/markdown", "description": "the readme"},
                {"type": "resource", "resource": {"uri": "memo://note", "mimeType": "text/plain", "text": "a note"}}]})
        if name == "fail":
            return result(mid, {"isError": True, "content": [{"type": "text", "text": "it went wrong"}]})
        if name == "crash":
            os._exit(3)
        if name == "env":
            return result(mid, {"content": [{"type": "text", "text": repr(os.environ.get(args["name"]))}]})
        if name == "spawn":
            child = subprocess.Popen(["sleep", os.environ.get("FAKE_MCP_SLEEP", "300")], start_new_session=True)
            self.children.append(child)
            return result(mid, {"content": [{"type": "text", "text": str(child.pid)}]})
        return error(mid, -32602, "Unknown tool: %s" % name)


def result(mid, value):
    return {"jsonrpc": "2.0", "id": mid, "result": value}


def error(mid, code, message, data=None):
    err = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": mid, "error": err}


# ---- stdio ----

def serve_stdio(core, mute=False):
    lock = threading.Lock()

    def send(message):
        with lock:
            sys.stdout.write((message if isinstance(message, str) else json.dumps(message)) + "\n")
            sys.stdout.flush()
    core.send = send
    core.log = lambda text: (sys.stderr.write(text + "\n"), sys.stderr.flush())
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        message = json.loads(line)
        if mute:
            core.log("recv (not answered): " + line)
            continue

        def work(message=message):
            answer = core.handle(message)
            if answer is not None:
                send(answer)
        if message.get("method") == "tools/call":
            threading.Thread(target=work, daemon=True).start()  # so a cancel can arrive while it runs
            if core.flood:
                threading.Event().wait()  # it floods, and reads nothing more: the client's answers fill the pipe
        else:
            work()


# ---- Streamable HTTP ----

class FakeHttpMcp:
    """A Streamable HTTP MCP server on 127.0.0.1 (in the test process). `requests` records (headers, body)."""

    def __init__(self, era="dual", oauth=False, sse=False, bad_issuer=False, token_ttl=3600, hostile=None):
        #: {"hang": {methods never answered}, "drip": {methods, or "DELETE", answered a byte at a time},
        #:  "call": "deep" | "sse_deep" | ("sse_big", MB) | ("flood", N): how tools/call is answered,
        #:  "hold": seconds the answers to its own requests (roots/list) are held before 202}
        self.hostile = dict(hostile or {})
        self.release = threading.Event()  #: set by stop(): whatever hangs or trickles ends
        self.era = era
        self.oauth = oauth
        self.sse = sse
        self.bad_issuer = bad_issuer
        self.token_ttl = token_ttl
        self.requests = []
        self.sessions = {}
        self.tokens = set()
        self.refresh_tokens = set()
        self.codes = {}
        self.registered = []
        self.server = None

    def start(self):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    @property
    def base(self):
        return "http://127.0.0.1:%d" % self.server.server_address[1]

    @property
    def url(self):
        return self.base + "/mcp"


def _handler(fake):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _json(self, status, obj, headers=None):
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def _empty(self, status, headers=None):
            self.send_response(status)
            self.send_header("Content-Length", "0")
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()

        def do_GET(self):
            base = fake.base
            path = self.path.split("?", 1)[0]
            if path == "/.well-known/oauth-protected-resource/mcp" and fake.oauth:
                return self._json(200, {"resource": base + "/mcp", "authorization_servers": [base + "/as"],
                                        "scopes_supported": ["tools"]})
            if path == "/.well-known/oauth-authorization-server/as" and fake.oauth:
                return self._json(200, {"issuer": (base + "/evil") if fake.bad_issuer else base + "/as",
                                        "authorization_endpoint": base + "/as/authorize",
                                        "token_endpoint": base + "/as/token",
                                        "registration_endpoint": base + "/as/register",
                                        "code_challenge_methods_supported": ["S256"],
                                        "authorization_response_iss_parameter_supported": True})
            if path == "/as/authorize" and fake.oauth:
                from urllib.parse import parse_qs, urlencode, urlsplit
                q = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
                code = "code-%d" % len(fake.codes)
                fake.codes[code] = q
                target = q["redirect_uri"] + "?" + urlencode({"code": code, "state": q.get("state", ""),
                                                               "iss": base + "/as"})
                return self._empty(302, {"Location": target})
            if path == "/mcp":
                return self._empty(405)
            return self._empty(404)

        def _drip(self):
            """200, then a body one byte at a time, for as long as the test runs: every read is short."""
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                while not fake.release.wait(0.1):
                    self.wfile.write(b" ")
                    self.wfile.flush()
            except OSError:
                pass
            self.close_connection = True

        def _hostile_call(self, message):
            """tools/call answered as fake.hostile["call"] says."""
            how = fake.hostile["call"]
            mid = message.get("id")
            if how == "deep":
                body = b"[" * 100000
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                if how == "sse_deep":
                    self.wfile.write(b"data: " + b"[" * 100000 + b"\n\n")
                    self.wfile.flush()
                    self.close_connection = True
                    return
                kind, n = how
                if kind == "sse_big":
                    self.wfile.write(b"data: ")
                    chunk = b"x" * (1 << 20)
                    for _ in range(n):
                        self.wfile.write(chunk)
                    self.wfile.write(b"\n\n")
                elif kind == "flood":
                    for k in range(n):
                        self.wfile.write(("data: %s\n\n" % json.dumps({"jsonrpc": "2.0", "id": "s%d" % k,
                                                                        "method": "roots/list"})).encode())
                self.wfile.write(("data: %s\n\n" % json.dumps(result(mid, {"content": [
                    {"type": "text", "text": "done"}]}))).encode())
                self.wfile.flush()
            except OSError:
                pass
            self.close_connection = True

        def do_DELETE(self):
            if "DELETE" in fake.hostile.get("drip", ()):
                return self._drip()
            fake.sessions.pop(self.headers.get("Mcp-Session-Id"), None)
            return self._empty(200)

        def _form(self):
            from urllib.parse import parse_qs
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            return {k: v[0] for k, v in parse_qs(raw).items()}

        def do_POST(self):
            base = fake.base
            path = self.path.split("?", 1)[0]
            if path == "/as/register":
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                fake.registered.append(body)
                return self._json(201, {"client_id": "client-%d" % len(fake.registered),
                                        "redirect_uris": body.get("redirect_uris")})
            if path == "/as/token":
                form = self._form()
                if form.get("grant_type") == "authorization_code":
                    q = fake.codes.pop(form.get("code"), None)
                    verifier = form.get("code_verifier", "")
                    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
                    if q is None or q.get("code_challenge") != challenge or form.get("resource") != base + "/mcp":
                        return self._json(400, {"error": "invalid_grant"})
                elif form.get("grant_type") == "refresh_token":
                    if form.get("refresh_token") not in fake.refresh_tokens:
                        return self._json(400, {"error": "invalid_grant"})
                else:
                    return self._json(400, {"error": "unsupported_grant_type"})
                token, refresh = "tok-%d-secretvalue" % len(fake.tokens), "ref-%d" % len(fake.refresh_tokens)
                fake.tokens.add(token)
                fake.refresh_tokens.add(refresh)
                return self._json(200, {"access_token": token, "token_type": "Bearer", "refresh_token": refresh,
                                        "expires_in": fake.token_ttl})
            if path != "/mcp":
                return self._empty(404)
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            message = json.loads(raw)
            fake.requests.append((dict(self.headers), message))
            hostile, method = fake.hostile, message.get("method")
            if method is None and "id" in message and hostile.get("hold"):  # an answer to its own request
                fake.release.wait(hostile["hold"])
                return self._empty(202)
            if method in hostile.get("hang", ()):
                fake.release.wait(120)
                self.close_connection = True
                return
            if method in hostile.get("drip", ()):
                return self._drip()
            if method == "tools/call" and hostile.get("call"):
                return self._hostile_call(message)
            if fake.oauth:
                auth = self.headers.get("Authorization") or ""
                if not auth.startswith("Bearer ") or auth[7:] not in fake.tokens:
                    return self._empty(401, {"WWW-Authenticate": 'Bearer resource_metadata="%s/.well-known/'
                                                                 'oauth-protected-resource/mcp", scope="tools"' % base})
            version = self.headers.get("MCP-Protocol-Version")
            meta = (message.get("params") or {}).get("_meta") or {}
            modern = "io.modelcontextprotocol/protocolVersion" in meta
            if modern and fake.era != "legacy":
                if version != meta["io.modelcontextprotocol/protocolVersion"] or \
                        self.headers.get("Mcp-Method") != message.get("method") or (
                        message.get("method") == "tools/call" and
                        self.headers.get("Mcp-Name") != message["params"].get("name")):
                    return self._json(400, error(message.get("id"), -32020, "Header mismatch"))
                core = Core(era=fake.era)
            else:
                session = self.headers.get("Mcp-Session-Id")
                if message.get("method") == "initialize":
                    if fake.era == "modern":
                        return self._json(400, error(message.get("id"), -32601, "this server speaks only " + MODERN))
                    session = "s%d" % (len(fake.sessions) + 1)
                    fake.sessions[session] = Core(era=fake.era)
                    answer = fake.sessions[session].handle(message)
                    return self._json(200, answer, {"Mcp-Session-Id": session})
                core = fake.sessions.get(session)
                if core is None:
                    if fake.era == "legacy" or not session:
                        return self._json(400, {"jsonrpc": "2.0", "id": None, "error": {
                            "code": -32000, "message": "Bad Request: Server not initialized"}})
                    return self._empty(404)
            if "id" not in message:
                core.handle(message)
                return self._empty(202)
            if fake.sse and message.get("method") == "tools/call":
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()

                def send(item):
                    self.wfile.write(b": keep-alive\n\n")
                    self.wfile.write(("data: %s\n\n" % json.dumps(item)).encode())
                    self.wfile.flush()
                core.send = send
                answer = core.handle(message)
                if answer is not None:
                    send(answer)
                self.close_connection = True
                return
            return self._json(200, core.handle(message))
    return Handler


def main():
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--era", default="dual", choices=("legacy", "modern", "dual"))
    parser.add_argument("--legacy-version", default=LEGACY)
    parser.add_argument("--probe", default="error", choices=("error", "silent", "crash"))
    parser.add_argument("--marker", help="ignored: a word tests look for among the processes")
    parser.add_argument("--hostile", action="store_true", help="malformed messages before each call's answer")
    parser.add_argument("--mute", action="store_true", help="never answer anything")
    parser.add_argument("--flood", type=int, default=0, help="server->client requests before each call's answer")
    args = parser.parse_args()
    serve_stdio(Core(era=args.era, legacy_version=args.legacy_version, probe=args.probe, hostile=args.hostile,
                     flood=args.flood), mute=args.mute)


if __name__ == "__main__":
    main()
