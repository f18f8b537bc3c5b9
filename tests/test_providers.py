"""Providers in-process against the fake server: wire formats, deltas, retries, errors."""

import json
import os
import time

import pytest

import xzatoma
from xzatoma import (Console, CopilotProvider, OllamaProvider, OpenAIProvider, ProviderError, load_config,
                     strip_think)

TOOLS = [{"name": "read_file", "description": "read", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}}, "required": ["path"]}}]
MSGS = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]


def provider(kind, fake, api="chat", model=None, env=None, retries=2):
    cfg = load_config({}, env=dict({"HOME": "/nonexistent", "XDG_CONFIG_HOME": "/nonexistent"}, **(env or {})))
    cfg._values["provider"]["max_retries"] = retries
    cfg._values["provider"]["retry_backoff_seconds"] = 0.01
    cfg._values["provider"]["ollama"]["host"] = fake.url
    cfg._values["provider"]["openai"].update(base_url=fake.url + "/v1", api=api)
    cfg._values["provider"]["copilot"]["api_url"] = fake.url
    cls = {"ollama": OllamaProvider, "openai": OpenAIProvider, "copilot": CopilotProvider}[kind]
    return cls(cfg, Console(quiet=True), model or {"ollama": "llama3.2:3b", "openai": "gpt-test",
                                                   "copilot": "gpt-5.3-codex"}[kind])


@pytest.mark.parametrize("kind,api", [("ollama", "chat"), ("openai", "chat"), ("openai", "responses")])
def test_streamed_text_and_parallel_tool_calls(fake, kind, api):
    fake.add({"content": "Let me look at both files.",
              "tool_calls": [{"name": "read_file", "arguments": {"path": "a é.txt"}},
                             {"name": "read_file", "arguments": {"path": "b.txt", "nested": {"k": [1, 2]}}}],
              "usage": {"prompt_tokens": 11, "completion_tokens": 4}})
    deltas = []
    reply = provider(kind, fake, api).complete(MSGS, TOOLS, on_delta=deltas.append)
    assert "".join(deltas) == reply.content == "Let me look at both files."
    assert len(deltas) > 1
    assert [c["name"] for c in reply.tool_calls] == ["read_file", "read_file"]
    assert json.loads(reply.tool_calls[0]["arguments"]) == {"path": "a é.txt"}
    assert json.loads(reply.tool_calls[1]["arguments"]) == {"path": "b.txt", "nested": {"k": [1, 2]}}
    assert len({c["id"] for c in reply.tool_calls}) == 2
    assert reply.usage == {"prompt_tokens": 11, "completion_tokens": 4}
    assert reply.finish_reason == "tool_calls"


def test_an_openai_stream_cut_before_its_end_is_never_an_answer(fake):
    """Found by an attack round: a chat-completions stream that ended after "par", with neither a finish_reason
    nor [DONE] (a connection reset, a proxy's timeout, the run's deadline), was a completed answer "par"."""
    fake.add({"content": "partial answer", "cut": True}, {"content": "the whole answer"})
    reply = provider("openai", fake).complete(MSGS, [])
    assert reply.content == "the whole answer" and len(fake.model_requests()) == 2  # retried, as a dropped stream
    fake.add(*[{"content": "partial answer", "cut": True}] * 3)
    with pytest.raises(ProviderError, match="closed the chat stream before the reply was complete"):
        provider("openai", fake).complete(MSGS, [])
    fake.add({"content": "slow answer", "chunk_delay": 0.3})  # the deadline's watchdog closes the stream
    with pytest.raises(xzatoma.DeadlineExceeded):
        provider("openai", fake).complete(MSGS, [], deadline=time.monotonic() + 1.0)


def test_ollama_ids_are_stable_for_the_same_history(fake):
    p = provider("ollama", fake)
    fake.add(*[{"tool_calls": [{"name": "read_file", "arguments": {"path": "x"}}]}] * 2)
    a = p.complete(MSGS, TOOLS).tool_calls[0]["id"]
    b = p.complete(MSGS, TOOLS).tool_calls[0]["id"]
    assert a == b and a.startswith("call_")


def test_ollama_thinking_and_length(fake):
    fake.add({"content": "partial", "thinking": "pondering", "finish": "length"})
    reply = provider("ollama", fake).complete(MSGS, [])
    assert reply.thinking == "pondering" and reply.finish_reason == "length"
    req = fake.model_requests()[0]["body"]
    assert "tools" not in req and req["options"]["num_ctx"] == 8192


def test_ollama_num_ctx_grows_with_the_conversation(fake):
    p = provider("ollama", fake)
    assert p.num_ctx(1000) == 8192
    assert p.num_ctx(20000) == 32768
    assert p.num_ctx(500000) == 131072  # the model's window from /api/show


def test_openai_reasoning_content_is_thinking(fake):
    fake.add({"content": "ok", "thinking": "because"})
    reply = provider("openai", fake).complete(MSGS, TOOLS)
    assert reply.thinking == "because" and reply.content == "ok"


def test_openai_wire_format_of_history(fake):
    fake.add({"content": "ok"})
    history = MSGS + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "name": "read_file", "arguments": '{"path": "a"}'}]},
        {"role": "tool", "tool_call_id": "c1", "name": "read_file", "content": "A"}]
    provider("openai", fake, env={"OPENAI_API_KEY": "sk-x"}).complete(history, TOOLS)
    req = fake.model_requests()[0]
    assert req["headers"]["authorization"] == "Bearer sk-x"
    body = req["body"]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    # "" and never null: llama-cpp-python's server answers a null content with HTTP 500
    assert body["messages"][2] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a"}'}}]}
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "c1", "content": "A"}
    assert body["tools"][0] == {"type": "function", "function": TOOLS[0]}


def test_no_key_sends_no_authorization(fake):
    fake.add({"content": "ok"})
    provider("openai", fake).complete(MSGS, [])
    assert "authorization" not in fake.model_requests()[0]["headers"]


def test_responses_wire_format(fake):
    fake.add({"content": "ok"})
    history = MSGS + [{"role": "assistant", "content": "checking", "tool_calls": [
        {"id": "c1", "name": "read_file", "arguments": '{"path": "a"}'}]},
        {"role": "tool", "tool_call_id": "c1", "name": "read_file", "content": "A"},
        {"role": "system", "content": "[CONTEXT PRUNED: …]"}]
    provider("openai", fake, api="responses").complete(history, TOOLS)
    body = fake.model_requests()[0]["body"]
    assert body["instructions"] == "sys" and body["store"] is False
    assert body["input"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "checking"},
        {"type": "function_call", "call_id": "c1", "name": "read_file", "arguments": '{"path": "a"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "A"},
        {"role": "developer", "content": "[CONTEXT PRUNED: …]"}]
    assert body["tools"] == [dict(TOOLS[0], type="function")]


def test_responses_incomplete_is_length(fake):
    fake.add({"content": "cut", "finish": "length"})
    assert provider("openai", fake, api="responses").complete(MSGS, []).finish_reason == "length"


def test_retry_after_is_honoured(fake):
    fake.add({"status": 429, "headers": {"Retry-After": "1"}}, {"content": "ok"})
    started = time.monotonic()
    assert provider("openai", fake).complete(MSGS, []).content == "ok"
    assert time.monotonic() - started >= 1.0


def test_a_retry_that_would_pass_the_deadline_says_the_servers_words_not_timed_out(fake):
    """Found by an attack round: a 429 asking for 600 s, with a minute left, was "timed out after 60s; raise it
    with --timeout" after 3 ms, the server's own words nowhere."""
    fake.add({"status": 429, "headers": {"Retry-After": "600"}, "body": '{"error": {"message": "slow down"}}'})
    with pytest.raises(ProviderError) as err:
        provider("openai", fake).complete(MSGS, [], deadline=time.monotonic() + 60)
    assert "HTTP 429" in str(err.value) and "slow down" in str(err.value), err.value
    assert "waiting 120s (the server asks 600s) would pass the run's deadline" in str(err.value), err.value
    assert len(fake.model_requests()) == 1


def test_client_errors_are_not_retried(fake):
    fake.add({"status": 400, "body": '{"error": {"message": "tools[0] is invalid"}}'}, {"content": "never"})
    with pytest.raises(ProviderError) as err:
        provider("openai", fake).complete(MSGS, [])
    assert "HTTP 400: tools[0] is invalid" in str(err.value) and err.value.exit_code == 1
    assert len(fake.model_requests()) == 1


def test_copilot_models_decide_the_endpoint(fake):
    env = {"COPILOT_API_TOKEN": "tok"}
    assert provider("copilot", fake, model="gpt-5.3-codex", env=env).uses_responses()
    assert not provider("copilot", fake, model="gpt-4.1", env=env).uses_responses()
    assert provider("copilot", fake, model="gpt-9-codex-unlisted", env=env).uses_responses()
    assert not provider("copilot", fake, model="claude-unlisted", env=env).uses_responses()
    p = provider("copilot", fake, env=env)
    assert p.context_window() == 264000


def test_copilot_401_says_to_log_in(fake):
    fake.add({"status": 401, "body": '{"error": {"message": "unauthorized: token expired"}}'})
    with pytest.raises(ProviderError) as err:
        provider("copilot", fake, model="gpt-4.1", env={"COPILOT_API_TOKEN": "tok"}).complete(MSGS, [])
    assert "xzatoma auth login" in str(err.value) and err.value.exit_code == 2


@pytest.mark.parametrize("text,answer,thinking", [
    ("plain", "plain", ""),
    ("<think>a</think>b", "b", "a"),
    ("<think>\nx\n</think>\n\nanswer\n", "answer", "x"),
    ("hidden start</think>visible", "visible", "hidden start"),
    ("visible<think>cut off", "visible", "cut off"),
    ("<think>1</think>mid<think>2</think>end", "midend", "1\n2"),
])
def test_strip_think(text, answer, thinking):
    assert strip_think(text) == (answer, thinking)


def test_server_that_ignores_stream_is_understood(fake):
    fake.add({"content": "whole", "tool_calls": [{"name": "read_file", "arguments": {"path": "a"}}],
              "plain_json": True, "usage": {"prompt_tokens": 5, "completion_tokens": 2}})
    reply = provider("openai", fake).complete(MSGS, TOOLS)
    assert reply.content == "whole" and reply.tool_calls[0]["name"] == "read_file"
    assert json.loads(reply.tool_calls[0]["arguments"]) == {"path": "a"}
    assert reply.usage == {"prompt_tokens": 5, "completion_tokens": 2}


# ---- what small local servers need: exact wire, sampling settings, the real window ----

def test_a_request_the_server_rejects_is_not_retried_and_says_what_was_rejected(fake):
    from fake_model import LLAMA_CPP_NULL_CONTENT
    fake.add({"status": 500, "body": LLAMA_CPP_NULL_CONTENT})
    with pytest.raises(ProviderError) as err:
        provider("openai", fake, retries=3).complete(MSGS, TOOLS)
    assert len(fake.model_requests()) == 1  # a validation error is no transient failure
    assert str(err.value) == ("the OpenAI-compatible server at %s/v1 rejected the request (HTTP 500): "
                              "messages[2].content: Input should be a valid string" % fake.url)


def test_a_server_that_rejects_null_content_gets_past_the_first_tool_call(cli, fake):
    """llama-cpp-python answers an assistant message with "content": null with HTTP 500: no run could get past
    its first tool call there."""
    (cli.workdir / "a.txt").write_text("A\n")
    fake.rejects_null_content = True
    cli.use(fake, provider="openai")
    fake.add({"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]}, {"content": "it says A"})
    r = cli.run("run", "--prompt", "what does a.txt say?")
    assert r.returncode == 0 and r.stdout == "it says A\n", r.stderr
    assert fake.model_requests()[-1]["body"]["messages"][3]["content"] == ""


@pytest.mark.parametrize("kind,api", [("ollama", "chat"), ("openai", "chat"), ("openai", "responses")])
def test_sampling_settings_go_in_each_wire_format(fake, kind, api):
    p = provider(kind, fake, api=api)
    p.settings.update(temperature=0.2, top_p=0.9, max_tokens=256, seed=7)
    fake.add({"content": "ok"})
    p.complete(MSGS, TOOLS)
    body = fake.model_requests()[0]["body"]
    if kind == "ollama":
        assert body["options"] == dict(body["options"], temperature=0.2, top_p=0.9, num_predict=256, seed=7)
    elif api == "chat":
        assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"]) == (0.2, 0.9, 256, 7)
    else:
        assert (body["temperature"], body["top_p"], body["max_output_tokens"]) == (0.2, 0.9, 256)
        assert "seed" not in body  # the Responses API has none


def test_no_sampling_settings_are_sent_unless_configured(fake):
    fake.add({"content": "ok"})
    provider("openai", fake).complete(MSGS, TOOLS)
    body = fake.model_requests()[0]["body"]
    assert not {"temperature", "top_p", "max_tokens", "seed"} & set(body)


def test_sampling_flags_set_the_active_providers_keys(cli, fake):
    cli.use(fake, provider="openai")
    fake.add({"content": "ok"})
    r = cli.run("run", "--temperature", "0.3", "--max-tokens", "512", "--seed", "1", "--", "hi")
    assert r.returncode == 0, r.stderr
    body = fake.model_requests()[0]["body"]
    assert (body["temperature"], body["max_tokens"], body["seed"]) == (0.3, 512, 1)


@pytest.mark.parametrize("route,body,window", [
    ("/props", {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1}, 4096),  # llama.cpp's server
    ("/api/v0/models", {"data": [{"id": "gpt-test", "loaded_context_length": 6144,
                                  "max_context_length": 32768}]}, 6144),  # LM Studio
])
def test_a_local_servers_real_window_is_read(fake, route, body, window):
    fake.raw_routes[route] = (200, "application/json", json.dumps(body))
    assert provider("openai", fake).context_window() == window


def test_the_configured_window_wins(fake):
    p = provider("openai", fake)
    p.settings["context_window"] = 2048
    assert p.context_window() == 2048 and fake.requests == []


def test_a_refusal_over_the_window_teaches_the_window_and_the_run_goes_on(cli, fake):
    """llama-cpp-python (and vLLM, OpenAI) name their window when a request exceeds it: the conversation is pruned
    to it and the request sent once more."""
    (cli.workdir / "big.txt").write_text("word " * 3000)
    cli.use(fake, provider="openai")
    refusal = json.dumps({"error": {"message": "This model's maximum context length is 2048 tokens. However, you "
                                               "requested 9035 tokens (9030 in the messages, 5 in the completion).",
                                    "type": "invalid_request_error", "param": "messages",
                                    "code": "context_length_exceeded"}})
    fake.add(*[{"tool_calls": [{"name": "read_file", "arguments": {"path": "big.txt", "end_line": i}}]}
               for i in range(1, 7)],
             {"status": 400, "body": refusal}, {"content": "done"})
    r = cli.run("run", "--prompt", "read big.txt many times")
    assert r.returncode == 0 and r.stdout == "done\n", r.stderr
    assert "the server's context window is 2048 tokens: context pruned to fit" in r.stderr
    sent = fake.model_requests()
    assert len(json.dumps(sent[-1]["body"]["messages"])) < len(json.dumps(sent[-2]["body"]["messages"])) / 2


@pytest.mark.parametrize("name,billions", [("qwen2.5-coder-1.5b", 1.5), ("Llama-3.2-3B-Instruct", 3.0),
                                           ("phi3:3.8b", 3.8), ("gpt-4o-mini", None), ("qwen3:0.6b", 0.6)])
def test_model_size_from_its_name(name, billions):
    assert xzatoma.model_size(name) == billions


@pytest.mark.parametrize("kind", ["ollama", "openai"])
def test_a_reply_stuck_repeating_itself_is_cut(fake, kind):
    """A small model at low temperature fell into a loop that ran until its window was full (minutes)."""
    fake.add({"content": "Let me check.\n" + "- verify the file exists\n" * 2000})
    reply = provider(kind, fake).complete(MSGS, TOOLS)
    assert reply.finish_reason == "repetition" and len(reply.content) < 8000


@pytest.mark.parametrize("kind", ["ollama", "openai"])
def test_a_reply_that_begins_a_second_call_after_a_whole_one_is_cut_there(fake, kind):
    """A 1.5B model wrote call after imagined call (echo 'call Bob', then Alice, then Charlie …) for eight minutes,
    no stretch repeating; only the first call of a reply runs, so the stream is closed when the second begins."""
    first = '{"name": "list_directory", "arguments": {"path": "."}}\n'
    more = "".join('{"name": "terminal", "arguments": {"command": "echo call %s >> todo.md"}}\n' % n
                   for n in range(3000))
    fake.add({"content": first + more})
    reply = provider(kind, fake).complete(MSGS, TOOLS)
    assert reply.finish_reason == "stop" and reply.content == first
    assert xzatoma.find_text_tool_calls(reply.content).calls[0]["name"] == "list_directory"
    fake.add({"content": first + more})  # no tools offered: an answer about calls, read whole
    assert provider(kind, fake).complete(MSGS, []).content == first + more
    data = '{"name": "demo", "version": "1.0"}\n'  # data, not calls: read to the end
    fake.add({"content": "The file says " + data + "and the other one " + data * 3})
    assert provider(kind, fake).complete(MSGS, TOOLS).content.endswith(data * 3)


def test_long_text_that_does_not_repeat_is_not_cut():
    guard = xzatoma.RepetitionGuard()
    text = "".join("line %d says %s\n" % (i, i * i) for i in range(5000))
    assert not any(guard.feed(text[i:i + 7]) for i in range(0, len(text), 7))
    guard = xzatoma.RepetitionGuard()
    assert any(guard.feed(piece) for piece in ["x = [0, 0, 0, 0]\n"] * 400)


def test_a_small_local_model_gets_a_low_temperature_and_a_bounded_reply_unless_they_are_set(cli, fake):
    """Servers sample hot by default (llama-cpp-python, Ollama: 0.8) and generate to the end of the window (a 1.5B
    model's reply ran for eight minutes); the compact profile sends 0.2 and 2048 tokens, and the person's own
    settings win."""
    cli.use(fake, provider="openai", tools={"profile": "compact"})
    fake.add({"content": "ok"}, {"content": "ok"}, {"content": "ok"})
    assert cli.run("run", "hi").returncode == 0
    body = fake.model_requests()[-1]["body"]
    assert (body["temperature"], body["max_tokens"]) == (0.2, 2048)
    assert cli.run("run", "--temperature", "0.7", "--max-tokens", "300", "hi").returncode == 0
    body = fake.model_requests()[-1]["body"]
    assert (body["temperature"], body["max_tokens"]) == (0.7, 300)
    cli.use(fake, provider="openai")  # the full profile: the server decides
    assert cli.run("run", "hi").returncode == 0
    assert "temperature" not in fake.model_requests()[-1]["body"]
    assert "max_tokens" not in fake.model_requests()[-1]["body"]


def test_a_stuck_small_model_is_sampled_hotter_until_a_good_turn(cli, fake):
    """At 0.2 a 1.5B model repeated one grep until the run failed; each stuck turn in a row (a refused repeat,
    an empty reply, a malformed call) adds 0.3 to the run's own temperature, and a good turn cools it."""
    (cli.workdir / "a.txt").write_text("A\n")
    (cli.workdir / "b.txt").write_text("B\n")
    cli.use(fake, provider="openai", tools={"profile": "compact"})
    read = lambda path: {"tool_calls": [{"name": "read_file", "arguments": {"path": path}}]}  # noqa: E731
    # (the last request: a small model's answer to a question, read again afresh: Agent.last_word)
    fake.add(read("a.txt"), read("a.txt"), read("a.txt"), read("b.txt"), {"content": "A and B"}, {"content": "A, B"})
    r = cli.run("run", "what do a.txt and b.txt say?")
    assert r.returncode == 0, r.stderr
    assert [q["body"]["temperature"] for q in fake.model_requests()] == [0.2, 0.2, 0.5, 0.8, 0.2, 0.2]
    fake.add(read("a.txt"), read("a.txt"), {"content": "A"}, {"content": "A"})
    assert cli.run("run", "--temperature", "0.1", "what does a.txt say?").returncode == 0
    assert [q["body"]["temperature"] for q in fake.model_requests()[-4:]] == [0.1, 0.1, 0.1, 0.1]  # theirs stays


@pytest.mark.parametrize("kind,streaming", [("ollama", None), ("openai", None), ("ollama", "close"),
                                            ("openai", "close")])
def test_a_cancelled_run_does_not_wait_for_the_models_answer(fake, kind, streaming, tmp_path):
    """A watcher stopping after its grace cancels its runs; one waiting for its model's answer waited for the
    server (12 s and more after SIGTERM), then the watcher gave up on leaving its group cleanly. The request in
    flight is now cut off within a quarter second of the cancel, not retried, and the run ends interrupted. So it
    is mid-answer when the reply ends by closing the connection: http.client hands the socket to the response,
    and the cut found none to shut down (attack round 13)."""
    import threading
    from conftest import wait_for
    if streaming == "close":  # the answer begins at once, then trickles: the reply is read when the cancel comes
        fake.close_delimited = True
        fake.add({"content": "too late " * 20, "chunk_delay": 0.5}, {"content": "a retry must not be sent"})
    else:
        fake.add({"content": "too late", "delay": 8}, {"content": "a retry must not be sent"})
    cfg = load_config({}, env={"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)})
    session = xzatoma.Session.open(cfg, Console(quiet=True), "planning", str(tmp_path), "restricted_autonomous",
                                   provider=provider(kind, fake))
    ended = {}

    def run():
        session.start("run")
        session.conversation.add_user("say hello")
        ended["result"] = session.agent().run()
    thread = threading.Thread(target=run, daemon=True)
    try:
        thread.start()
        assert wait_for(lambda: fake.model_requests(), timeout=10)
        cancelled = time.monotonic()
        session.cancel.set()
        thread.join(3)
        assert not thread.is_alive(), "the run waits for the model's answer"
        assert time.monotonic() - cancelled < 2
        assert ended["result"].status == "interrupted"
        assert len(fake.model_requests()) == 1  # not sent again
    finally:
        session.close()


@pytest.mark.parametrize("close_delimited", [False, True])
def test_the_runs_deadline_holds_while_a_reply_only_keeps_alive(fake, close_delimited):
    """SSE keep-alives and no answer: the deadline's watchdog shuts the request's socket down. A reply that ends by
    closing its connection hands that socket from the connection to the response, and the watchdog found none:
    the run waited out the whole stream, past watcher.timeout_seconds (found in review)."""
    fake.close_delimited = close_delimited
    fake.add({"content": "late", "keepalive": (40, 0.25)})  # 10 s of keep-alives, then the answer
    started = time.monotonic()
    with pytest.raises(xzatoma.DeadlineExceeded):
        provider("openai", fake, retries=0).complete([{"role": "user", "content": "hi"}], [],
                                                     deadline=time.monotonic() + 1.0)
    assert time.monotonic() - started < 3


class EndlessServer:
    """Answers each request with `head`, then `piece` over and over, up to `limit` bytes (a broken proxy's endless
    error page, JSON that never closes, a line without end); `sent` counts what went out on each connection."""

    def __init__(self, head, piece, limit):
        import socket
        import threading
        self.head, self.piece, self.limit, self.sent = head, piece, limit, []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        import threading
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn):
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(next((l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")),
                          b"0"))
        while len(body) < length:
            body += conn.recv(65536)
        sent = 0
        try:
            conn.sendall(self.head)
            while sent < self.limit:
                conn.sendall(self.piece)
                sent += len(self.piece)
        except OSError:
            pass  # the client went away: what it read is all it ever reads
        self.sent.append(sent)
        conn.close()

    def close(self):
        self.sock.close()


def _chunked(piece):
    return b"%x\r\n%s\r\n" % (len(piece), piece)


@pytest.mark.parametrize("kind,head,piece,said", [
    # an error page without end: only its beginning is ever shown, so only that is read
    ("ollama", b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n\r\n",
     _chunked(b"<p>gateway</p>" * 4000), "HTTP 502"),
    # a 200 of JSON that never closes: 32 MB at most, then a failure that is not retried
    ("openai", b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
     _chunked(b'{"a": [' + b"1, " * 20000), "sent more than a model's reply can be: the reply is larger than 32 MB"),
    # an SSE event of `data:` lines that never ends (no blank line): 16 MB at most
    ("openai", b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
     _chunked(b"data: " + b"x" * 60000 + b"\n"), "an event of the reply's stream is longer than 16 MB"),
    # a stream line that never ends: 16 MB at most
    ("ollama", b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n",
     _chunked(b'{"message": {"content": "' + b"x" * 60000), "a line of the reply is longer than 16 MB"),
    # a stream of lines under the bound, without end: 32 MB of it in all, as a body (a 300 MB answer took a watcher
    # past 1.7 GB and held its store's lock until its claims lapsed, round 17b); text without a period to repeat
    ("ollama", b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n",
     _chunked(b'{"message": {"content": "%s"}}\n' % os.urandom(30000).hex().encode()),
     "sent more than a model's reply can be: the reply is larger than 32 MB"),
    ("openai", b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
     _chunked(b'data: {"choices": [{"delta": {"content": "%s"}}]}\n\n' % os.urandom(30000).hex().encode()),
     "sent more than a model's reply can be: the reply is larger than 32 MB"),
])
def test_a_reply_without_end_is_read_within_bounds(kind, head, piece, said):
    """Found by an attack round: a reply's body was read whole, whatever its size: an endless 502 page or JSON
    that never closed took a watcher past 1.5 GB in 6 s, and a stream line without end grew with the run's time
    limit (quadratic in CPU, 300 MB in 120 s). Each server here stops at 200 MB; what it could send is counted."""
    server = EndlessServer(head, piece, 200 << 20)

    class Fake:  # what provider() needs of the fake model: its address
        url = server.url
    try:
        with pytest.raises(ProviderError) as exc:
            provider(kind, Fake, retries=1).complete(MSGS, [])
        assert said in str(exc.value), exc.value
        from conftest import wait_for
        assert wait_for(lambda: server.sent)  # the server sees the client go
        assert max(server.sent) < 64 << 20, server.sent  # it stopped reading long before the 200 MB
    finally:
        server.close()


@pytest.mark.parametrize("kind", ["ollama", "openai"])
def test_a_local_server_that_goes_away_in_a_request_is_not_taken_for_one_never_there(kind):
    """A watcher waits for a model server nothing listens on, and runs the event again once it is back (round
    17c). A server that took the request and went away in it (a poison event crashing it) is refused after too,
    and was taken for one never there: that event ran again at every try, never answered (round 17e)."""
    import socket
    import threading
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]

    class Fake:
        url = "http://127.0.0.1:%d" % port

    def crash():  # reads the chat request, then is gone: the connection and the port close
        while True:
            conn, _ = listener.accept()
            if b"/api/show" in conn.recv(65536):  # Ollama's look-up of the model's window comes first
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                             b"Connection: close\r\n\r\n{}")
                conn.close()
                continue
            listener.close()
            conn.close()
            return
    threading.Thread(target=crash, daemon=True).start()
    with pytest.raises(ProviderError) as went_away:
        provider(kind, Fake, retries=2).complete(MSGS, [])
    assert went_away.value.unreachable is False
    with pytest.raises(ProviderError) as never_there:  # nothing listens there now, nor did before the request
        provider(kind, Fake, retries=2).complete(MSGS, [])
    assert never_there.value.unreachable is True and "connection refused" in str(never_there.value)


def test_a_reply_cut_off_and_asked_again_is_marked_not_glued_to_the_next(fake):
    """Found by an attack round: a cut-off stream is retried now, and what it had streamed stayed on the screen
    glued to the answer ('PARTIAL-FIRST-ATTEMPT The final answer is 42.'). It stays, marked, on a line of its own."""
    import io
    out, err = io.StringIO(), io.StringIO()
    shown = xzatoma.StreamedText(Console(color=False, err=err), out)
    p = provider("openai", fake)
    fake.add({"content": "PARTIAL FIRST line\nand more", "cut": True}, {"content": "The final answer is 42."})
    shown.waiting()
    p.on_retry = shown.retrying
    reply = p.complete(MSGS, [], on_delta=shown.delta)
    shown.replied()
    assert reply.content == "The final answer is 42."
    assert out.getvalue() == "PARTIAL FIRST line\nand more [cut off: asked again]\nThe final answer is 42.\n", \
        out.getvalue()
    assert "".join(shown.raw) == "The final answer is 42."  # the conversation keeps the answer, not the cut
