"""XZatoma's Prometheus metrics (optional: `pip install 'xzatoma[metrics]'`).

Imported only when --metrics-port or --metrics-textfile is given; the core
never imports prometheus_client. Every name is prefixed `xzatoma_`.
"""

import threading

import prometheus_client as prom


class PrometheusMetrics:
    """Counters and histograms for runs, turns, tools, model requests, tokens and subagents."""

    def __init__(self, port=None, textfile=None, warn=None, host="127.0.0.1"):
        self.registry = prom.CollectorRegistry()
        self.textfile = textfile
        self.warn = warn  #: callable(text) for problems that must not fail the task (an unwritable textfile)
        self.lock = threading.Lock()
        r = self.registry
        self.runs = prom.Counter("xzatoma_runs_total", "Finished runs by status", ["status"], registry=r)
        self.turns = prom.Counter("xzatoma_turns_total", "Model calls made by agents", registry=r)
        self.tool_calls = prom.Counter("xzatoma_tool_calls_total", "Tool calls by tool and outcome",
                                       ["tool", "outcome"], registry=r)
        self.model_requests = prom.Counter("xzatoma_model_requests_total", "Model requests by provider and status",
                                           ["provider", "status"], registry=r)
        self.token_count = prom.Counter("xzatoma_tokens_total", "Tokens by kind", ["kind"], registry=r)
        self.sub_exec = prom.Counter("xzatoma_subagent_executions_total", "Subagents started by depth", ["depth"],
                                     registry=r)
        self.sub_done = prom.Counter("xzatoma_subagent_completions_total", "Subagents finished by status", ["status"],
                                     registry=r)
        self.sub_errors = prom.Counter("xzatoma_subagent_errors_total", "Subagent failures by error type",
                                       ["error_type"], registry=r)
        self.sub_active = prom.Gauge("xzatoma_subagent_active_count", "Subagents running now", registry=r)
        self.sub_duration = prom.Histogram("xzatoma_subagent_duration_seconds", "Subagent wall time", ["depth"],
                                           registry=r, buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800))
        self.sub_turns = prom.Histogram("xzatoma_subagent_turns_used", "Turns a subagent used", ["depth"], registry=r,
                                        buckets=(1, 2, 3, 5, 8, 13, 21, 34, 55, 100))
        self.sub_tokens = prom.Histogram("xzatoma_subagent_tokens_consumed", "Tokens a subagent used", ["depth"],
                                         registry=r, buckets=(100, 1000, 5000, 10000, 50000, 100000, 500000, 1000000))
        self.server = None
        if port:
            self.server = prom.start_http_server(port, addr=host, registry=r)

    # hooks called by the agent loop
    def run_finished(self, result):
        self.runs.labels(result.status).inc()

    def model_request(self, provider, status):
        self.model_requests.labels(provider, status).inc()
        if status == "ok":
            self.turns.inc()

    def tool_call(self, tool, outcome):
        self.tool_calls.labels(tool, outcome).inc()

    def tokens(self, prompt, completion):
        self.token_count.labels("prompt").inc(prompt)
        self.token_count.labels("completion").inc(completion)

    def subagent_started(self, depth):
        self.sub_exec.labels(str(depth)).inc()
        self.sub_active.inc()

    def subagent_finished(self, depth, status, duration, turns, tokens):
        self.sub_active.dec()
        self.sub_done.labels(status).inc()
        self.sub_duration.labels(str(depth)).observe(duration)
        self.sub_turns.labels(str(depth)).observe(turns)
        self.sub_tokens.labels(str(depth)).observe(tokens)

    def subagent_error(self, error_type):
        self.sub_errors.labels(error_type).inc()

    # hooks called by the watcher (xzatoma watch --metrics-port); created on first use
    def _watch_metrics(self):
        if not hasattr(self, "watch_events"):
            r = self.registry
            self.watch_events = prom.Counter("xzatoma_watch_events_total", "Watched events by outcome", ["outcome"],
                                             registry=r)
            self.watch_duration = prom.Histogram("xzatoma_watch_run_duration_seconds", "Wall time of one event's run",
                                                 registry=r, buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800))
            self.watch_running = prom.Gauge("xzatoma_watch_runs_in_flight", "Event runs in flight", registry=r)
            self.watch_lag_gauge = prom.Gauge("xzatoma_watch_consumer_lag",
                                              "Messages of the partition not yet committed: its end offset minus "
                                              "the group's committed offset", ["topic", "partition"], registry=r)
            self.watch_stalled = prom.Gauge("xzatoma_watch_commit_stalled_seconds",
                                            "Seconds the partition's committed offset has not moved while its oldest "
                                            "message is in hand (0 when none waits; one waiting for a run slot "
                                            "counts since a slot was last freed)",
                                            ["topic", "partition"], registry=r)
            self.watch_oldest = prom.Gauge("xzatoma_watch_oldest_waiting_seconds",
                                           "How long the oldest message received and not yet committed has waited",
                                           registry=r)

    def watch_event(self, outcome):
        with self.lock:
            self._watch_metrics()
        self.watch_events.labels(outcome).inc()

    def watch_run(self, seconds):
        with self.lock:
            self._watch_metrics()
        self.watch_duration.observe(seconds)

    def watch_in_flight(self, n):
        with self.lock:
            self._watch_metrics()
        self.watch_running.set(n)

    def watch_lag(self, topic, partition, lag):
        with self.lock:
            self._watch_metrics()
        self.watch_lag_gauge.labels(topic, str(partition)).set(lag)

    def watch_lag_clear(self, topic, partition):
        """A partition given up: another member reports it now."""
        with self.lock:
            self._watch_metrics()
        for gauge in (self.watch_lag_gauge, self.watch_stalled):
            try:
                gauge.remove(topic, str(partition))
            except KeyError:
                pass

    def watch_commit_stalled(self, topic, partition, seconds):
        with self.lock:
            self._watch_metrics()
        self.watch_stalled.labels(topic, str(partition)).set(seconds)

    def watch_oldest_waiting(self, seconds):
        with self.lock:
            self._watch_metrics()
        self.watch_oldest.set(seconds)

    def close(self):
        """Write the textfile (atomically: node_exporter never sees half a file) and stop serving."""
        if self.textfile:
            try:
                prom.write_to_textfile(self.textfile, self.registry)
            except OSError as exc:  # a missing folder, a read-only disk: the task's answer and exit code stand
                if self.warn is None:
                    raise
                self.warn("cannot write the metrics textfile %s: %s" % (self.textfile, exc.strerror or exc))
        if self.server is not None:
            server = self.server[0] if isinstance(self.server, tuple) else self.server
            try:
                server.shutdown()
            except Exception:
                pass
            self.server = None
