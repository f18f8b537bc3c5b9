"""A scripted model server on 127.0.0.1 that speaks the real wire formats.

Ollama (`/api/chat` NDJSON streaming, `/api/tags`, `/api/show`), OpenAI chat
completions (SSE with tool-call deltas split across chunks), the Responses API
(SSE events) and Copilot's `/models` listing. Each model request takes the
next reply from a script; every request is recorded.

A reply is a dict:
  content        answer text (streamed in small pieces)
  tool_calls     [{"name": ..., "arguments": dict or raw JSON text}, ...]
  thinking       reasoning text (Ollama `thinking`, OpenAI `reasoning_content`)
  status         send this HTTP error status instead (with `body`, `headers`)
  delay          seconds to wait before answering
  chunk_delay    seconds between streamed pieces
  finish         finish reason to report ("length" for a truncated answer)
  malformed      send a broken stream line
  hang           keep the connection open without answering for this long
  keepalive      (count, seconds): SSE comment lines sent that far apart before the answer (chat API)
  repeat         serve this reply N times
  usage          {"prompt_tokens": n, "completion_tokens": n}; None sends no usage at all (llama.cpp streaming
                 without include_usage, Ollama with a cached prompt)
  expect         callable(request_body) -> error text or None (checks the history)
  plain_json     answer with one JSON body even when streaming was asked for
  echo_auth      with `status`: the error body quotes the request's Authorization header (as some servers do)

`connections` counts the TCP connections accepted; `close_after_each` closes each after one answer;
`close_delimited` streams with `Connection: close`, the body ending with the connection (as HTTP/1.0 servers and
some proxies answer).

Run standalone (used by the benchmarks, so the server is another process):
  python tests/fake_model.py --loop-tool read_file --loop-args '{"path": "x"}' --turns 500
prints the port on stdout and serves until killed.
"""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeModel:
    def __init__(self, models=None):
        self.script = []
        self.requests = []
        self.chunks = 0  #: pieces of streamed replies sent (a test waits for some to have gone out)
        self.models = models if models is not None else {
            "llama3.2:3b": {"context_length": 131072},
            "qwen3": {"context_length": 32768},
            "gpt-test": {"context_length": 128000},
            "gpt-5.3-codex": {"context_length": 264000, "endpoints": ["/responses"]},
            "gpt-4.1": {"context_length": 128000, "endpoints": ["/chat/completions"]},
        }
        self.strict_models = False
        self.rejects_null_content = False  # answer an assistant message with "content": null as llama-cpp-python does
        self.raw_routes = {}  # path -> (status, content type, body): what a wrong server (a web page) answers
        self.close_after_each = False  # close every connection after one answer, unannounced (a keep-alive timeout)
        self.close_delimited = False  # stream with Connection: close, the body ending with the connection (HTTP/1.0)
        self.lock = threading.Lock()
        self.server = None
        self.generator = None  # callable(request_body) -> reply, used when the script is empty
        # a fake GitHub: device flow, Copilot token exchange, and Copilot token checks
        self.github_token = "gho_FAKEgithubTOKEN0123456789abcdefXYZ"
        self.device_responses = []  # what successive access-token polls answer (then success)
        self.copilot_valid = None  # None: accept any Copilot token; a set: only these
        self.copilot_ttl = 1800
        self.issued = []

    # -- control --
    def start(self, port=0):
        handler = _make_handler(self)
        self.server = _QuietServer(("127.0.0.1", port), handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self):
        if self.server:
            self.server.shutdown()
            self.server.server_close()

    @property
    def connections(self):
        """TCP connections accepted so far."""
        return self.server.connections

    @property
    def port(self):
        return self.server.server_address[1]

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def add(self, *replies):
        with self.lock:
            for reply in replies:
                for _ in range(reply.get("repeat", 1)):
                    self.script.append(reply)
        return self

    def model_requests(self):
        return [r for r in self.requests if r["path"] in MODEL_PATHS]

    def next_reply(self, body):
        with self.lock:
            if self.script:
                return self.script.pop(0)
        if self.generator:
            return self.generator(body)
        stands = _stands_by(body)
        if stands is not None:
            return stands
        return {"status": 500, "body": json.dumps({"error": "fake model: script exhausted"})}


def _stands_by(body):
    """Asked to check an answer it gave without tools (xzatoma's nudge), a model with no script left stands by it:
    the same answer again. Scripts that test the nudge say what the model does instead."""
    msgs = body.get("messages") or body.get("input") or []
    if len(msgs) >= 2 and str(msgs[-1].get("content", "")).startswith(("You answered without",
                                                                       "Error: your reply was empty")):
        answer = msgs[-2].get("content")
        if msgs[-2].get("role") == "assistant" and isinstance(answer, str):
            return {"content": answer}
    return None


#: what llama-cpp-python's server (0.3.x) answers a chat request whose assistant message has "content": null
LLAMA_CPP_NULL_CONTENT = json.dumps({"error": {"message": (
    "7 validation errors:\n"
    "  {'type': 'literal_error', 'loc': ('body', 'messages', 2, 'ChatCompletionRequestSystemMessage', 'role'), "
    "'msg': \"Input should be 'system'\", 'input': 'assistant', 'ctx': {'expected': \"'system'\"}}\n"
    "  {'type': 'literal_error', 'loc': ('body', 'messages', 2, 'ChatCompletionRequestUserMessage', 'role'), "
    "'msg': \"Input should be 'user'\", 'input': 'assistant', 'ctx': {'expected': \"'user'\"}}\n"
    "  {'type': 'string_type', 'loc': ('body', 'messages', 2, 'ChatCompletionRequestAssistantMessage', 'content'), "
    "'msg': 'Input should be a valid string', 'input': None}\n"
    "  {'type': 'literal_error', 'loc': ('body', 'messages', 2, 'ChatCompletionRequestToolMessage', 'role'), "
    "'msg': \"Input should be 'tool'\", 'input': 'assistant', 'ctx': {'expected': \"'tool'\"}}\n"
    "  {'type': 'missing', 'loc': ('body', 'messages', 2, 'ChatCompletionRequestToolMessage', 'tool_call_id'), "
    "'msg': 'Field required', 'input': {'role': 'assistant', 'content': None}}\n"
    "  {'type': 'literal_error', 'loc': ('body', 'messages', 2, 'ChatCompletionRequestFunctionMessage', 'role'), "
    "'msg': \"Input should be 'function'\", 'input': 'assistant', 'ctx': {'expected': \"'function'\"}}\n"
    "  {'type': 'missing', 'loc': ('body', 'messages', 2, 'ChatCompletionRequestFunctionMessage', 'name'), "
    "'msg': 'Field required', 'input': {'role': 'assistant', 'content': None}}\n\n"
    "  File \"/llama_cpp/server/app.py\", line 376, in create_chat_completion\n    POST /v1/chat/completions"),
    "type": "internal_server_error", "param": None, "code": None}})


def _null_content(body):
    return any(m.get("role") == "assistant" and "content" in m and m["content"] is None
               for m in body.get("messages") or ())


class _QuietServer(ThreadingHTTPServer):
    connections = 0  #: TCP connections accepted (a client that keeps its connection alive makes one)

    def process_request(self, request, client_address):
        self.connections += 1  # only the serving thread accepts: no lock needed
        super().process_request(request, client_address)

    def handle_error(self, request, client_address):
        import sys
        if not isinstance(sys.exc_info()[1], (ConnectionError, BrokenPipeError)):
            super().handle_error(request, client_address)


MODEL_PATHS = {"/api/chat", "/v1/chat/completions", "/chat/completions", "/v1/responses", "/responses"}


def _pieces(text, size=7):
    return [text[i:i + size] for i in range(0, len(text), size)] or []


def _args_text(arguments):
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _ollama_args(arguments):
    """Ollama sends an object; text that is not JSON is passed through as a (broken) string."""
    if isinstance(arguments, dict):
        return arguments
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _make_handler(fake):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # as real model servers do: small streamed writes go out at once

        def log_message(self, *args):
            pass

        # -- plumbing --
        def _body(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if "form-urlencoded" in (self.headers.get("Content-Type") or ""):
                from urllib.parse import parse_qs
                return {k: v[0] for k, v in parse_qs(raw.decode()).items()}
            try:
                return json.loads(raw) if raw else {}
            except ValueError:
                return {"_raw": raw.decode("utf-8", "replace")}

        def _send_json(self, status, obj, headers=None):
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _start_stream(self, content_type):
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            if fake.close_delimited:
                self.send_header("Connection", "close")
                self.close_connection = True
            else:
                self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

        def _chunk(self, data, delay=0):
            if delay:
                time.sleep(delay)
            if isinstance(data, str):
                data = data.encode()
            self.wfile.write(data if fake.close_delimited else b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
            fake.chunks += 1

        def _end_stream(self):
            if not fake.close_delimited:
                self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _record(self, body):
            entry = {"method": self.command, "path": self.path.split("?")[0],
                     "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
            with fake.lock:
                fake.requests.append(entry)

        # -- routing --
        def _copilot_rejected(self):
            """Copilot endpoints check the bearer token when the fake tracks issued tokens."""
            if fake.copilot_valid is None:
                return False
            token = (self.headers.get("Authorization") or "")[len("Bearer "):]
            if token in fake.copilot_valid:
                return False
            self._send_json(401, {"error": {"message": "unauthorized: token expired", "code": "unauthorized"}})
            return True

        def _raw_route(self, path):
            if path not in fake.raw_routes:
                return False
            status, content_type, text = fake.raw_routes[path]
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return True

        def handle_one_request(self):
            super().handle_one_request()
            if fake.close_after_each:
                self.close_connection = True

        def do_GET(self):
            self._record(None)
            path = self.path.split("?")[0]
            if self._raw_route(path):
                return
            if path == "/copilot_internal/v2/token":
                if self.headers.get("Authorization") != "token " + fake.github_token:
                    return self._send_json(401, {"message": "Bad credentials"})
                token = "tid=fake%d;exp=%d;sku=copilot_for_business:%s" % (
                    len(fake.issued), time.time() + fake.copilot_ttl, "a1b2c3d4e5f6" * 3)
                fake.issued.append(token)
                if fake.copilot_valid is not None:
                    fake.copilot_valid.add(token)
                return self._send_json(200, {"token": token, "expires_at": int(time.time() + fake.copilot_ttl),
                                             "refresh_in": fake.copilot_ttl - 60, "endpoints": {"api": fake.url}})
            if path == "/models" and self._copilot_rejected():
                return
            if path == "/api/tags":
                return self._send_json(200, {"models": [{"name": n, "model": n, "size": 1000} for n in fake.models]})
            if path in ("/v1/models", "/models"):
                data = []
                for name, info in fake.models.items():
                    entry = {"id": name, "object": "model",
                             "capabilities": {"type": "chat", "limits": {
                                 "max_context_window_tokens": info.get("context_length")},
                                 "supports": {"tool_calls": True, "streaming": True}}}
                    if info.get("endpoints"):
                        entry["supported_endpoints"] = info["endpoints"]
                    data.append(entry)
                return self._send_json(200, {"object": "list", "data": data})
            self._send_json(404, {"error": "not found: %s" % path})

        def do_POST(self):
            body = self._body()
            self._record(body)
            path = self.path.split("?")[0]
            if self._raw_route(path):
                return
            if path == "/login/device/code":
                return self._send_json(200, {"device_code": "dev-code-1", "user_code": "WDJB-MJHT",
                                             "verification_uri": fake.url + "/login/device", "expires_in": 900,
                                             "interval": 0})
            if path == "/login/oauth/access_token":
                with fake.lock:
                    answer = fake.device_responses.pop(0) if fake.device_responses else \
                        {"access_token": fake.github_token, "token_type": "bearer", "scope": "read:user"}
                return self._send_json(200, answer)
            if path in ("/chat/completions", "/responses") and self._copilot_rejected():
                return
            if path == "/api/show":
                info = fake.models.get(body.get("model") or body.get("name"))
                if info is None:
                    return self._send_json(404, {"error": "model '%s' not found" % body.get("model")})
                return self._send_json(200, {"model_info": {"llama.context_length": info.get("context_length")},
                                             "capabilities": ["completion", "tools"]})
            if path not in MODEL_PATHS:
                return self._send_json(404, {"error": "not found: %s" % path})
            if fake.strict_models and body.get("model") not in fake.models:
                if path == "/api/chat":
                    return self._send_json(404, {"error": "model \"%s\" not found, try pulling it first"
                                                          % body.get("model")})
                return self._send_json(404, {"error": {"message": "The model `%s` does not exist"
                                                                  % body.get("model"), "code": "model_not_found"}})
            reply = fake.next_reply(body)
            if "usage" not in reply:  # realistic counts: about four characters per token
                reply = dict(reply, usage={"prompt_tokens": max(1, len(json.dumps(body)) // 4),
                                           "completion_tokens": 20})
            if reply.get("delay"):
                time.sleep(reply["delay"])
            if reply.get("expect"):
                problem = reply["expect"](body)
                if problem:
                    return self._send_json(400, {"error": {"message": "fake model: " + problem}})
            if fake.rejects_null_content and _null_content(body):
                return self._send_error({"status": 500, "body": LLAMA_CPP_NULL_CONTENT})
            if reply.get("status"):
                return self._send_error(reply)
            if reply.get("raw"):
                return self._send_raw(reply["raw"])
            if reply.get("hang"):
                time.sleep(reply["hang"])
                return
            try:
                if path == "/api/chat":
                    self._ollama(body, reply)
                elif path.endswith("/chat/completions"):
                    self._openai_chat(body, reply)
                else:
                    self._responses(body, reply)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _send_raw(self, raw):
            """A recorded real server's reply, byte for byte (tests/replies)."""
            data = raw["body"].encode("utf-8")
            self.send_response(raw.get("status", 200))
            self.send_header("Content-Type", raw.get("content_type") or "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _send_error(self, reply):
            body = reply.get("body")
            if reply.get("echo_auth"):
                body = json.dumps({"error": {"message": "invalid credentials: %s" % self.headers.get("Authorization")}})
            if body is None:
                body = json.dumps({"error": {"message": "injected HTTP %d" % reply["status"]}})
            data = body.encode()
            self.send_response(reply["status"])
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (reply.get("headers") or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        # -- Ollama NDJSON --
        def _ollama(self, body, reply):
            stream = body.get("stream", True)
            content = reply.get("content", "")
            calls = [{"function": {"name": c["name"], "arguments": _ollama_args(c["arguments"])}}
                     for c in reply.get("tool_calls") or ()]
            usage = reply["usage"]
            final = {"model": body.get("model"), "created_at": "2025-01-01T00:00:00Z",
                     "message": {"role": "assistant", "content": ""}, "done": True,
                     "done_reason": reply.get("finish", "stop"), "total_duration": 1000}
            if usage is not None:
                final.update(prompt_eval_count=usage["prompt_tokens"], eval_count=usage["completion_tokens"])
            if not stream:
                final["message"] = {"role": "assistant", "content": content}
                if calls:
                    final["message"]["tool_calls"] = calls
                return self._send_json(200, final)
            self._start_stream("application/x-ndjson")
            delay = reply.get("chunk_delay", 0)
            if reply.get("thinking"):
                self._chunk(json.dumps({"model": body.get("model"), "message": {
                    "role": "assistant", "content": "", "thinking": reply["thinking"]}, "done": False}) + "\n")
            for piece in _pieces(content):
                self._chunk(json.dumps({"model": body.get("model"), "message": {"role": "assistant",
                                                                                "content": piece},
                                        "done": False}) + "\n", delay)
            if reply.get("malformed"):
                self._chunk("{this is not json\n")
            if calls:
                self._chunk(json.dumps({"model": body.get("model"), "message": {
                    "role": "assistant", "content": "", "tool_calls": calls}, "done": False}) + "\n", delay)
            self._chunk(json.dumps(final) + "\n")
            self._end_stream()

        # -- OpenAI chat completions SSE --
        def _openai_chat(self, body, reply):
            content = reply.get("content", "")
            calls = reply.get("tool_calls") or ()
            usage = reply["usage"]
            finish = reply.get("finish") or ("tool_calls" if calls else "stop")
            if not body.get("stream") or reply.get("plain_json"):
                msg = {"role": "assistant", "content": content or None}
                if calls:
                    msg["tool_calls"] = [{"id": "call_%d" % i, "type": "function",
                                          "function": {"name": c["name"], "arguments": _args_text(c["arguments"])}}
                                         for i, c in enumerate(calls)]
                data = {"id": "chatcmpl-1", "object": "chat.completion", "choices": [
                    {"index": 0, "message": msg, "finish_reason": finish}]}
                if usage is not None:
                    data["usage"] = dict(usage, total_tokens=usage["prompt_tokens"] + usage["completion_tokens"])
                return self._send_json(200, data)
            self._start_stream("text/event-stream")
            delay = reply.get("chunk_delay", 0)
            count, interval = reply.get("keepalive") or (0, 0)
            for _ in range(count):  # SSE comments, as proxies and slow servers send while a model thinks
                self._chunk(": keep-alive\n\n", interval)

            def event(delta, finish_reason=None):
                chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0,
                         "model": body.get("model"),
                         "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
                self._chunk("data: %s\n\n" % json.dumps(chunk), delay)

            event({"role": "assistant", "content": ""})
            if reply.get("thinking"):
                event({"reasoning_content": reply["thinking"]})
            for piece in _pieces(content):
                event({"content": piece})
            if reply.get("cut"):  # the connection ends mid-reply: no finish_reason, no [DONE]
                return self._end_stream()
            if reply.get("malformed"):
                self._chunk("data: {broken json\n\n")
            for i, c in enumerate(calls):
                args = _args_text(c["arguments"])
                event({"tool_calls": [{"index": i, "id": "call_%d_%d" % (len(fake.requests), i), "type": "function",
                                       "function": {"name": c["name"], "arguments": ""}}]})
                for piece in _pieces(args, 5):  # arguments split mid-token, as real servers do
                    event({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
            event({}, finish)
            if body.get("stream_options", {}).get("include_usage") and usage is not None:
                self._chunk("data: %s\n\n" % json.dumps({"id": "chatcmpl-1", "choices": [], "usage": dict(
                    usage, total_tokens=usage["prompt_tokens"] + usage["completion_tokens"])}))
            self._chunk("data: [DONE]\n\n")
            self._end_stream()

        # -- Responses API SSE --
        def _responses(self, body, reply):
            content = reply.get("content", "")
            calls = reply.get("tool_calls") or ()
            usage = reply["usage"]
            self._start_stream("text/event-stream")
            delay = reply.get("chunk_delay", 0)
            seq = [0]

            def event(kind, **data):
                data["type"] = kind
                data["sequence_number"] = seq[0]
                seq[0] += 1
                self._chunk("event: %s\ndata: %s\n\n" % (kind, json.dumps(data)), delay)

            output = []
            base = {"id": "resp_1", "object": "response", "model": body.get("model"), "status": "in_progress",
                    "output": []}
            event("response.created", response=base)
            index = 0
            if content:
                item = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
                event("response.output_item.added", output_index=index, item=item)
                for piece in _pieces(content):
                    event("response.output_text.delta", item_id="msg_1", output_index=index, content_index=0,
                          delta=piece)
                done = dict(item, status="completed", content=[{"type": "output_text", "text": content,
                                                                "annotations": []}])
                event("response.output_item.done", output_index=index, item=done)
                output.append(done)
                index += 1
            if reply.get("malformed"):
                self._chunk("event: response.output_text.delta\ndata: {nope\n\n")
            for i, c in enumerate(calls):
                args = _args_text(c["arguments"])
                item = {"id": "fc_%d" % i, "type": "function_call", "status": "in_progress",
                        "call_id": "call_r%d_%d" % (len(fake.requests), i), "name": c["name"], "arguments": ""}
                event("response.output_item.added", output_index=index, item=item)
                for piece in _pieces(args, 5):
                    event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                          delta=piece)
                event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                      arguments=args)
                done = dict(item, status="completed", arguments=args)
                event("response.output_item.done", output_index=index, item=done)
                output.append(done)
                index += 1
            status = "incomplete" if reply.get("finish") == "length" else "completed"
            final = dict(base, status=status, output=output)
            if usage is not None:
                final["usage"] = {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                                  "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}
            if status == "incomplete":
                final["incomplete_details"] = {"reason": "max_output_tokens"}
            event("response.%s" % status, response=final)
            self._end_stream()

    return Handler


def main():
    """Serve a looping script in its own process (for benchmarks)."""
    import argparse
    import sys
    p = argparse.ArgumentParser()
    p.add_argument("--loop-tool", required=True)
    p.add_argument("--loop-args", default="{}")
    p.add_argument("--turns", type=int, default=100)
    args = p.parse_args()
    fake = FakeModel()
    count = [0]
    tool_args = json.loads(args.loop_args)

    def generator(body):
        count[0] += 1
        if count[0] >= args.turns:
            count[0] = 0
            return {"content": "done"}
        # every other call reads from line 2: the loop refuses the same call twice in a row as a loop
        varied = dict(tool_args, start_line=2) if count[0] % 2 and args.loop_tool == "read_file" else tool_args
        return {"tool_calls": [{"name": args.loop_tool, "arguments": varied}]}
    fake.generator = generator
    fake.requests = _Discard()
    fake.start()
    sys.stdout.write("%d\n" % fake.port)
    sys.stdout.flush()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


class _Discard(list):
    """A request log that keeps nothing (long benchmark runs)."""

    def append(self, item):
        pass


if __name__ == "__main__":
    main()
