"""XZatoma watcher: `xzatoma watch` and `xzatoma publish` over Kafka (optional: pip install 'xzatoma[kafka]').

Read top to bottom: the optional dependency, semantic versions, messages (format
detection and plan extraction), filters, result events, the XZepr API client,
offsets, the decision log, the watcher loop, and publish. kafka-python is
imported inside the functions that talk to a broker. This module never imports
xzatoma: xzatoma hands it its settings, the store, and a function that runs one
plan (a Session of kind 'watch'); so the loop is testable with any callable.
"""

import collections
import json
import os
import re
import socket
import sys
import threading
import time
import uuid

# ---- The optional dependency ----


class WatchError(Exception):
    """A usage, configuration or plan problem: one line for a person, exit code 2."""

    exit_code = 2


def install_hint(prefix=None):
    """How to add kafka-python to this installation (pipx installs live in a 'pipx' directory)."""
    prefix = sys.prefix if prefix is None else prefix
    if "pipx" in prefix.replace("\\", "/").split("/"):
        return "pipx inject xzatoma kafka-python"
    return "pip install 'xzatoma[kafka]'"


def require_kafka(command="watch"):
    try:
        import kafka
    except ImportError:
        raise WatchError("xzatoma %s needs the Python package kafka-python: %s" % (command, install_hint()))
    return kafka


def quiet_client_logs(verbose=False, clean=None):
    """kafka-python logs every failed connection; the watcher logs its own decisions (retries included), so the
    client's lines reach stderr only with --verbose, through `clean` (what a broker said: its advertised host
    names, its error texts, is shown, never obeyed; a SASL password in a URL is redacted)."""
    import logging
    logger = logging.getLogger("kafka")
    if verbose:
        class Clean(logging.Formatter):
            def format(self, record):
                line = super().format(record)
                return clean(line) if clean is not None else _clean(line)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(Clean("kafka: %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.WARNING)
    else:
        logger.addHandler(logging.NullHandler())
    logger.propagate = False


# ---- Semantic versions: plan versions and --match-version constraints ----

_IDENT = r"(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)"
_SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-(%s(?:\.%s)*))?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$"
                     % (_IDENT, _IDENT))
_PARTIAL = re.compile(r"^v?(0|[1-9]\d*)(?:\.(0|[1-9]\d*))?(?:\.(0|[1-9]\d*))?(?:-(%s(?:\.%s)*))?$" % (_IDENT, _IDENT))
_LOWEST_PRE = (0,)  # sorts below every pre-release and release of the same x.y.z


def semver_key(text):
    """A sortable key for a semantic version (semver.org precedence), or None when it is not one."""
    if isinstance(text, bool) or not isinstance(text, str):
        return None
    m = _SEMVER.match(text.strip())
    if not m:
        return None
    pre = m.group(4)
    if pre is None:
        tail = (1,)  # a release sorts after its pre-releases
    else:
        tail = (0,) + tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)), tail)


class VersionConstraint:
    """`1.2.3` (exact), `1.2` (any 1.2.x), `^1.2`, `~1.2.3`, `>=1.0,<2` (every part must hold)."""

    def __init__(self, text):
        self.text = text
        self.checks = []
        normal = re.sub(r"(>=|<=|==|=|>|<|\^|~)\s+", r"\1", (text or "").strip())
        parts = [p for p in re.split(r"[,\s]+", normal) if p]
        if not parts:
            raise ValueError("empty version constraint")
        for part in parts:
            m = re.match(r"^(\^|~|>=|<=|==|=|>|<)?(.+)$", part)
            op, version = m.group(1) or "", m.group(2)
            v = _PARTIAL.match(version)
            if not v:
                raise ValueError("%r is not a version (expected 1.2.3, ^1.2, ~1.2.3, >=1.0,<2)" % part)
            major = int(v.group(1))
            minor = int(v.group(2)) if v.group(2) is not None else None
            patch = int(v.group(3)) if v.group(3) is not None else None
            low = semver_key("%d.%d.%d%s" % (major, minor or 0, patch or 0, "-" + v.group(4) if v.group(4) else ""))
            if op == "^":
                if major > 0 or minor is None:
                    upper = (major + 1, 0, 0)
                elif minor > 0 or patch is None:
                    upper = (0, minor + 1, 0)
                else:
                    upper = (0, 0, patch + 1)
                self.checks += [(">=", low), ("<", upper + (_LOWEST_PRE,))]
            elif op == "~" or (op in ("", "=", "==") and (minor is None or patch is None)):
                upper = (major + 1, 0, 0) if minor is None else (major, minor + 1, 0)
                self.checks += [(">=", low), ("<", upper + (_LOWEST_PRE,))]
            elif op == "<" and not v.group(4):
                self.checks.append(("<", low[:3] + (_LOWEST_PRE,)))  # <2 excludes 2.0.0-rc.1 too, as npm does
            else:
                self.checks.append((op if op not in ("", "=") else "==", low))

    def matches(self, version):
        key = semver_key(version)
        if key is None:
            return False  # a version that is not semver never matches a constraint
        ops = {">=": key.__ge__, "<=": key.__le__, ">": key.__gt__, "<": key.__lt__, "==": key.__eq__}
        return all(ops[op](bound) for op, bound in self.checks)

    def __repr__(self):
        return "VersionConstraint(%r)" % self.text


# ---- Messages: format detection and plan extraction ----

FORMATS = ("auto", "xzepr", "cloudevents", "plan")
CE_REQUIRED = ("specversion", "id", "source", "type")
STRUCTURED_CONTENT_TYPE = "application/cloudevents+json; charset=UTF-8"
CONTEXT_DIR_KEYS = ("directory", "dir", "working_dir", "working_directory", "workdir", "cwd", "repository", "repo",
                    "path", "root", "folder")


class BadMessage(Exception):
    """A message the watcher cannot use: why, and the event id when one is known."""

    def __init__(self, reason, event_id=None):
        super().__init__(reason)
        self.reason, self.event_id = reason, event_id


class Event:
    """One Kafka message, understood: its format, attributes and the plan it carries (or why not)."""

    FIELDS = ("format", "id", "type", "source", "subject", "time", "specversion", "success", "api_version", "name",
              "version", "release", "platform_id", "package", "data", "plan", "plan_error", "plan_location",
              "topic", "partition", "offset", "key")

    def __init__(self, **fields):
        for name in self.FIELDS:
            setattr(self, name, fields.pop(name, None))
        if fields:
            raise TypeError("unknown event fields: %s" % ", ".join(fields))

    @property
    def is_result(self):
        """A result XZatoma published (perhaps on this very topic): never run."""
        return self.type in RESULT_TYPES.values()

    def plan_name(self):
        return (self.plan.name if self.plan is not None and self.plan.name else None) or self.name

    def plan_version(self):
        return (self.plan.version if self.plan is not None and self.plan.version else None) or self.version

    def metadata(self):
        """What a stored conversation of kind 'watch' carries about its trigger."""
        return {"event_id": self.id, "type": self.type, "source": self.source, "topic": self.topic,
                "partition": self.partition, "offset": self.offset, "format": self.format}

    def log_fields(self):
        return {"event_id": self.id, "type": self.type, "topic": self.topic, "partition": self.partition,
                "offset": self.offset}


def _text(value):
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return value


def _load_document(text):
    """JSON, else YAML; BadMessage when it is neither."""
    stripped = text.lstrip()
    json_error = None
    if stripped.startswith(("{", "[", '"')):
        try:
            return json.loads(text)
        except ValueError as exc:
            json_error = exc
    try:
        import yaml
        return yaml.safe_load(text)
    except Exception as exc:  # yaml.YAMLError, or a recursion bomb
        reason = json_error or getattr(exc, "problem", None) or exc
        raise BadMessage("neither JSON nor YAML: %s" % str(reason).splitlines()[0][:200])


def _is_xzepr(doc):
    data = doc.get("data")
    return (isinstance(data, dict) and isinstance(data.get("events"), list)) or \
        ("platform_id" in doc and "api_version" in doc)


def decode_message(topic, partition, offset, key, value, headers=(), fmt="auto"):
    """An Event from one Kafka record, or BadMessage. The plan is parsed and validated here."""
    position = "%s:%s:%s" % (topic, partition, offset)
    try:
        key_text = _text(key) or None
    except UnicodeDecodeError:
        key_text = None
    hdrs = {}
    for name, raw in headers or ():
        try:
            hdrs[_text(name).lower()] = _text(raw) if raw is not None else ""
        except UnicodeDecodeError:
            raise BadMessage("header %r is not UTF-8" % (name,), key_text)
    if value is None or not value.strip():
        raise BadMessage("empty message", key_text)
    try:
        text = _text(value)
    except UnicodeDecodeError as exc:
        raise BadMessage("not UTF-8 text (byte %d)" % exc.start, key_text)
    ev = Event(topic=topic, partition=partition, offset=offset, key=key_text)

    if fmt == "plan":
        return _bare_plan(ev, text, position)
    if "ce_specversion" in hdrs and fmt in ("auto", "cloudevents"):  # binary content mode
        attrs = {k[3:]: v for k, v in hdrs.items() if k.startswith("ce_")}
        data = text
        content_type = hdrs.get("content-type", "")
        if "json" in content_type or text.lstrip().startswith(("{", "[")):
            try:
                data = json.loads(text)
            except ValueError:
                data = text
        _attributes(ev, attrs, "cloudevents")
        ev.data = data
        return _extract_plan(ev)
    try:
        doc = _load_document(text)
    except BadMessage as exc:
        raise BadMessage(exc.reason, key_text)
    if isinstance(doc, dict) and "specversion" in doc and fmt != "plan":
        kind = "xzepr" if fmt == "xzepr" or (fmt == "auto" and _is_xzepr(doc)) else "cloudevents"
        _attributes(ev, doc, kind)
        ev.data = doc.get("data")
        return _extract_plan(ev)
    if fmt in ("xzepr", "cloudevents"):
        raise BadMessage("not a CloudEvent: no 'specversion' attribute (--format %s)" % fmt,
                         doc.get("id") if isinstance(doc, dict) and isinstance(doc.get("id"), str) else key_text)
    return _bare_plan(ev, text, position)


def _attributes(ev, attrs, kind):
    ev.format = kind
    event_id = attrs.get("id")
    ev.id = event_id if isinstance(event_id, str) and event_id.strip() else None
    for name in CE_REQUIRED:
        value = attrs.get(name)
        if not isinstance(value, str) or not value.strip():
            raise BadMessage("missing required CloudEvents attribute '%s'" % name, ev.id)
    if not re.match(r"^1\.0(\.\d+)?$", attrs["specversion"]):
        raise BadMessage("unsupported CloudEvents specversion %r (expected 1.0)" % attrs["specversion"][:40], ev.id)
    for name in ("type", "source", "subject", "time", "specversion", "api_version", "name", "version", "release",
                 "platform_id", "package"):
        value = attrs.get(name)
        if value is not None and not isinstance(value, (dict, list)):
            setattr(ev, name, str(value))
    success = attrs.get("success")
    if isinstance(success, str):
        success = success.strip().lower() not in ("false", "0", "no")
    ev.success = None if success is None else bool(success)


def _bare_plan(ev, text, position):
    from xzatoma_tools import PlanError, parse_plan
    ev.format, ev.id, ev.plan_location = "plan", ev.key or position, "value"
    try:
        ev.plan = parse_plan(text, source="message %s" % position)
    except PlanError as exc:
        ev.plan_error = str(exc)
    return ev


def _find_plan(ev):
    from xzatoma_tools import looks_like_plan
    data = ev.data
    if ev.format == "xzepr":
        events = data.get("events") if isinstance(data, dict) else None
        first = events[0] if isinstance(events, list) and events and isinstance(events[0], dict) else {}
        payload = first.get("payload")
        if isinstance(payload, dict) and "plan" in payload:
            return "data.events[0].payload.plan", payload["plan"]
        if isinstance(data, dict) and "plan" in data:
            return "data.plan", data["plan"]
        if looks_like_plan(payload):
            return "data.events[0].payload", payload
        return None, None
    if isinstance(data, dict) and "plan" in data:
        return "data.plan", data["plan"]
    if looks_like_plan(data) or (isinstance(data, str) and data.strip()):
        return "data", data
    return None, None


def _extract_plan(ev):
    from xzatoma_tools import PlanError, parse_plan, plan_from_data
    where, value = _find_plan(ev)
    ev.plan_location = where
    if ev.is_result:
        return ev
    if where is None:
        ev.plan_error = ("no plan in the event (looked at data.events[0].payload.plan, data.plan and "
                         "data.events[0].payload)" if ev.format == "xzepr" else
                         "no plan in the event (looked at data.plan and data)")
        return ev
    source = "event %s %s" % (ev.id, where)
    try:
        if isinstance(value, str):
            ev.plan = parse_plan(value, source=source)
        elif isinstance(value, dict):
            ev.plan = plan_from_data(value, source=source)
        else:
            ev.plan_error = "%s: a plan must be an object or text" % source
    except PlanError as exc:
        ev.plan_error = str(exc)
    return ev


def context_outside(plan, working_dir):
    """Why the plan's context names a directory outside the jail, or None."""
    ctx = plan.context if plan is not None else None
    if not isinstance(ctx, dict):
        return None
    root = os.path.realpath(working_dir)
    for key, value in ctx.items():
        if str(key).lower() not in CONTEXT_DIR_KEYS or not isinstance(value, str) or not value.strip():
            continue
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", value) or re.match(r"^[\w.-]+@[\w.-]+:", value):
            continue  # a repository URL, not a directory here
        path = os.path.realpath(os.path.join(root, os.path.expanduser(value.strip())))
        if path != root and not path.startswith(root.rstrip(os.sep) + os.sep):
            return "context %s %r is outside the working directory %s" % (key, value[:200], root)
    return None


# ---- Filters: every one given must hold ----


class Filters:
    """Which events run. `check` returns None to run, or the reason it is skipped."""

    def __init__(self, event_types=(), sources=(), platforms=(), packages=(), api_versions=(), include_failed=False,
                 actions=(), names=(), match_version=None):
        self.event_types = set(_items(event_types))
        self.sources = [_regex(s, "--source") for s in _items(sources)]
        self.platforms = set(_items(platforms))
        self.packages = set(_items(packages))
        self.api_versions = set(_items(api_versions))
        self.include_failed = bool(include_failed)
        self.actions = [_regex(a, "--action", re.I) for a in _items(actions)]
        self.names = [_regex(n, "--name", re.I) for n in _items(names)]
        try:
            self.version = VersionConstraint(match_version) if match_version else None
        except ValueError as exc:
            raise WatchError("--match-version: %s" % exc)

    def check(self, ev):
        if self.event_types and ev.type not in self.event_types:
            return "type %r is not one of --event-types" % ev.type
        if self.sources and not any(r.search(ev.source or "") for r in self.sources):
            return "source %r does not match --source" % ev.source
        if self.platforms and ev.platform_id not in self.platforms:
            return "platform_id %r is not --platform" % ev.platform_id
        if self.packages and ev.package not in self.packages:
            return "package %r is not --package" % ev.package
        if self.api_versions and ev.api_version not in self.api_versions:
            return "api_version %r is not --api-version" % ev.api_version
        if ev.success is False and not self.include_failed:
            return "a failed event (success: false; --include-failed runs it)"
        action = ev.plan.action if ev.plan is not None else None
        if self.actions and not any(r.search(action or "") for r in self.actions):
            return "action %r does not match --action" % action
        name = ev.plan_name()
        if self.names and not any(r.search(name or "") for r in self.names):
            return "name %r does not match --name" % name
        if self.version is not None and not self.version.matches(ev.plan_version()):
            return "version %r does not satisfy --match-version %s" % (ev.plan_version(), self.version.text)
        return None


def _items(value):
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value if str(v).strip()]


def _regex(pattern, flag, flags=0):
    try:
        return re.compile(pattern, flags)
    except re.error as exc:
        raise WatchError("%s: invalid regular expression %r: %s" % (flag, pattern, exc))


# ---- Result events: CloudEvents 1.0, structured mode ----

RESULT_TYPES = {"completed": "xzatoma.plan.completed", "failed": "xzatoma.plan.failed",
                "rejected": "xzatoma.plan.rejected", "interrupted": "xzatoma.plan.interrupted"}
RESULT_HEADERS = [("content-type", STRUCTURED_CONTENT_TYPE.encode())]


def now_rfc3339():
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%03dZ" % int((t % 1) * 1000)


def bounded(text, limit):
    """(text cut to at most `limit` UTF-8 bytes, whether it was cut)."""
    data = (text or "").encode("utf-8")
    if len(data) <= limit:
        return text or "", False
    return data[:limit].decode("utf-8", "ignore"), True


def result_status(status):
    """The agent's run status as one of the result kinds."""
    if status in RESULT_TYPES:
        return status
    return "interrupted" if status in ("cancelled", "terminated") else "failed"


def result_event(ev, outcome, source, answer_limit=65536):
    """The CloudEvent published for one event that passed the filters."""
    status = result_status(outcome.get("status"))
    answer, cut = bounded(outcome.get("answer"), answer_limit)
    data = {"status": status, "trigger_event_id": ev.id, "trigger_type": ev.type,
            "conversation_id": outcome.get("conversation_id"), "goal": ev.plan.goal if ev.plan is not None else None,
            "answer": answer, "error": outcome.get("error"), "usage": outcome.get("usage") or {},
            "turns": outcome.get("turns", 0), "tool_calls": outcome.get("tool_calls", 0),
            "duration_seconds": outcome.get("duration_seconds", 0.0), "steps": result_steps(outcome.get("steps"))}
    if cut:
        data["answer_truncated"] = True
    from xzatoma_store import redact_data  # every consumer of the results topic reads it: the goal and an error
    data = redact_data(data)  # quote the event, and a credential in it went out again (issue 12)
    return {"specversion": "1.0", "id": str(uuid.uuid4()), "source": source, "type": RESULT_TYPES[status],
            "subject": ev.id, "time": now_rfc3339(), "datacontenttype": "application/json", "data": data}


def result_steps(steps, limit=100, width=500):
    """The plan's progress for a result: [{step, text, status}] as the run left it (bounded: `limit` steps of at
    most `width` characters; anything else in the outcome is left out)."""
    out = []
    for item in steps if isinstance(steps, list) else ():
        if isinstance(item, dict) and isinstance(item.get("text"), str) and isinstance(item.get("status"), str):
            out.append({"step": len(out) + 1, "text": item["text"][:width], "status": item["status"][:16]})
            if len(out) >= limit:
                break
    return out


def result_source(group, host=None):
    return "xzatoma://%s/%s" % (host or socket.gethostname(), group)


# ---- XZepr API client: receiver discovery, started/completed events ----


class XzeprError(Exception):
    pass


class XzeprClient:
    """Posts run lifecycle events to XZepr; retries 5xx and connection errors with backoff, then gives up."""

    RECEIVER = {"name": "xzatoma", "type": "xzatoma.plan.result", "version": "1.0.0",
                "description": "XZatoma plan runs triggered by events", "schema": {}}

    def __init__(self, api_url, api_key=None, timeout=10.0, attempts=4, backoff=0.5, max_backoff=8.0, sleep=None):
        self.api_url = api_url.rstrip("/")
        self.api_key = api_key
        self.timeout, self.attempts, self.backoff, self.max_backoff = timeout, attempts, backoff, max_backoff
        self.sleep = sleep or time.sleep
        self._receiver = None
        self._lock = threading.Lock()
        self.retries = 0  #: attempts that failed and were retried (for logs and tests)

    def request(self, method, path, body=None):
        import urllib.error
        import urllib.request
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "xzatoma-watch"}
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        delay = self.backoff
        for attempt in range(1, self.attempts + 1):
            req = urllib.request.Request(self.api_url + path, data=data, headers=headers, method=method)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    raw = resp.read(1 << 20)
                    return json.loads(raw.decode("utf-8")) if raw.strip() else None
            except urllib.error.HTTPError as exc:
                if exc.code < 500:
                    raise XzeprError("XZepr %s %s: HTTP %d" % (method, path.split("?")[0], exc.code))
                problem = "HTTP %d" % exc.code
            except (urllib.error.URLError, OSError, ValueError) as exc:
                problem = str(getattr(exc, "reason", None) or exc)
            if attempt == self.attempts:
                raise XzeprError("XZepr %s %s failed after %d attempts: %s" % (method, path.split("?")[0],
                                                                               attempt, problem))
            self.retries += 1
            self.sleep(delay)
            delay = min(self.max_backoff, delay * 2)

    def receiver_id(self):
        with self._lock:
            if self._receiver is None:
                found = self.request("GET", "/api/v1/receivers?name=" + self.RECEIVER["name"])
                items = found if isinstance(found, list) else []
                if isinstance(found, dict):
                    items = found.get("receivers") or found.get("data") or found.get("items") or []
                for item in items if isinstance(items, list) else []:
                    if isinstance(item, dict) and item.get("name") == self.RECEIVER["name"] and item.get("id"):
                        self._receiver = str(item["id"])
                        break
                else:
                    made = self.request("POST", "/api/v1/receivers", dict(self.RECEIVER))
                    if isinstance(made, dict) and isinstance(made.get("data"), dict):
                        made = made["data"]
                    if not isinstance(made, dict) or not made.get("id"):
                        raise XzeprError("XZepr POST /api/v1/receivers returned no id")
                    self._receiver = str(made["id"])
            return self._receiver

    def post_event(self, name, ev, success, payload):
        body = {"name": name, "version": ev.plan_version() or "1.0.0", "release": ev.release or "",
                "platform_id": ev.platform_id or "xzatoma", "package": ev.package or "xzatoma",
                "description": "xzatoma plan %s for event %s" % (name.rsplit(".", 1)[-1], ev.id),
                "payload": payload, "success": bool(success), "event_receiver_id": self.receiver_id()}
        return self.request("POST", "/api/v1/events", body)


# ---- Offsets: commit per partition up to the lowest unfinished message ----


class PartitionOffsets:
    """One assigned partition: offsets received but not settled, and what may be committed."""

    def __init__(self):
        self.pending = set()
        self.highest = None
        self.committed = None

    def received(self, offset):
        self.pending.add(offset)
        self.highest = offset if self.highest is None else max(self.highest, offset)

    def settled(self, offset):
        self.pending.discard(offset)

    def resume_point(self):
        """Where reading must resume for nothing to be skipped: the lowest unfinished offset, else the next one."""
        if self.highest is None:
            return None
        return min(self.pending) if self.pending else self.highest + 1

    def commit_point(self):
        """The offset to commit (the next message to read after a restart), or None when nothing is new."""
        if self.highest is None:
            return None
        point = min(self.pending) if self.pending else self.highest + 1
        return point if self.committed is None or point > self.committed else None


class OffsetTracker:
    def __init__(self):
        self.lock = threading.Lock()
        self.partitions = {}

    def get(self, tp):
        with self.lock:
            po = self.partitions.get(tp)
            if po is None:
                po = self.partitions[tp] = PartitionOffsets()
            return po

    def assign(self, tps):
        with self.lock:
            for tp in tps:
                self.partitions.setdefault(tp, PartitionOffsets())

    def forget(self, tps):
        with self.lock:
            for tp in tps:
                self.partitions.pop(tp, None)

    def resume_points(self, tps):
        with self.lock:
            return {tp: po.resume_point() for tp, po in self.partitions.items()
                    if tp in tps and po.resume_point() is not None}

    def commit_points(self, tps=None):
        with self.lock:
            items = [(tp, po) for tp, po in self.partitions.items() if tps is None or tp in tps]
            return {tp: point for tp, point in ((tp, po.commit_point()) for tp, po in items) if point is not None}

    def committed(self, points):
        with self.lock:
            for tp, point in points.items():
                po = self.partitions.get(tp)
                if po is not None:
                    po.committed = point

    def settled_all(self):
        with self.lock:
            return all(not po.pending and (po.highest is None or po.committed == po.highest + 1)
                       for po in self.partitions.values())


# ---- The decision log: one line per decision, text or JSON ----

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")
LEVELS = {"debug": 10, "info": 20, "warn": 30, "error": 40}


def _clean(text):
    """Text from a topic never reaches a terminal with its control characters: they are shown escaped."""
    return _UNSAFE.sub(lambda m: "\\u%04x" % ord(m.group()), text)


class WatchLog:
    def __init__(self, stream=None, fmt="text", level="info", redact=None):
        self.stream = stream if stream is not None else sys.stderr
        self.fmt, self.level = fmt, LEVELS.get(level, 20)
        self.redact = redact or (lambda text: text)
        self.lock = threading.Lock()

    def __call__(self, decision, level="info", **fields):
        if LEVELS.get(level, 20) < self.level:
            return
        fields = {k: v for k, v in fields.items() if v is not None}
        if self.fmt == "json":
            record = {"time": now_rfc3339(), "level": level, "event": decision}
            record.update(fields)
            line = json.dumps(record, ensure_ascii=True, default=str)
        else:
            parts = [now_rfc3339(), level.upper(), decision]
            for k, v in fields.items():
                v = _clean(str(v))
                parts.append("%s=%s" % (k, json.dumps(v, ensure_ascii=False) if (not v or re.search(r'[\s"=]', v))
                                        else v))
            line = " ".join(parts)
        line = self.redact(line)
        with self.lock:
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass


class _NoMetrics:
    def __getattr__(self, name):
        return lambda *args, **kw: None


# ---- The watcher: consume → filter → extract → run → record → publish → commit ----


class Settings:
    """What a watcher needs, already resolved (flags > environment > config > defaults) by xzatoma."""

    DEFAULTS = dict(
        brokers="localhost:9092", topic="xzepr.events", group_id="xzatoma-watcher", output_topic=None,
        dead_letter_topic=None, create_topics=False, security={}, working_dir=".", max_concurrent=1,
        max_events=None, idle_exit=None, dry_run=False, format="auto", shutdown_grace=30.0, answer_limit=65536,
        poll_ms=200, backoff_initial=0.5, backoff_max=30.0, publish_timeout=10.0, consumer_options=None,
        host=None, lag_interval=5.0)

    def __init__(self, **values):
        unknown = set(values) - set(self.DEFAULTS)
        if unknown:
            raise TypeError("unknown watcher settings: %s" % ", ".join(sorted(unknown)))
        for name, default in self.DEFAULTS.items():
            setattr(self, name, values.get(name, default))
        if not self.output_topic:
            self.output_topic = self.topic + ".results"
        self.max_concurrent = max(1, int(self.max_concurrent))

    @property
    def bootstrap(self):
        return [b.strip() for b in self.brokers.split(",") if b.strip()] if isinstance(self.brokers, str) \
            else list(self.brokers)


def client_options(settings_or_brokers, security=None):
    """kafka-python connection options: brokers and security (never logged)."""
    if isinstance(settings_or_brokers, Settings):
        brokers, security = settings_or_brokers.bootstrap, settings_or_brokers.security
    else:
        brokers = [b.strip() for b in settings_or_brokers.split(",") if b.strip()]
    security = security or {}
    opts = {"bootstrap_servers": brokers, "client_id": "xzatoma-" + socket.gethostname()}
    protocol = security.get("security_protocol") or "PLAINTEXT"
    opts["security_protocol"] = protocol
    if protocol.startswith("SASL"):
        opts["sasl_mechanism"] = security.get("sasl_mechanism") or "PLAIN"
        opts["sasl_plain_username"] = security.get("username")
        opts["sasl_plain_password"] = security.get("password")
    for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        if security.get(key):
            opts[key] = security[key]
    return opts


class Job:
    """One event being run: handed to the run-one-plan function."""

    def __init__(self, event, partition_offsets, stored=None):
        self.event = event
        self.plan = event.plan
        self.prompt = event.plan.to_prompt() if event.plan is not None and stored is None else None
        self.title = event.plan.goal if event.plan is not None else event.id
        self.metadata = event.metadata()
        self.cancel = threading.Event()  #: set on shutdown after the grace period, or on a lost partition
        self.po = partition_offsets
        self.stored = stored  #: a result recorded earlier but never published: publish it, run nothing
        self.tp = None


class Watcher:
    """The consumer loop. `run_plan(job) -> outcome dict` runs one plan (status, conversation_id, answer, error,
    usage, turns, tool_calls); everything else — offsets, dedupe, results, retries — is here."""

    def __init__(self, settings, filters, run_plan, store=None, log=None, xzepr=None, metrics=None, out=None):
        self.s = settings
        self.filters = filters
        self.run_plan = run_plan
        self.store = store
        self.log = log or WatchLog()
        self.xzepr = xzepr
        self.metrics = metrics or _NoMetrics()
        self.out = out if out is not None else sys.stdout
        self.source = result_source(settings.group_id, settings.host)
        self.tracker = OffsetTracker()
        self.cond = threading.Condition()
        self.backlog = collections.deque()
        self.in_flight = {}  # (tp, offset) -> Job
        self.running_ids = set()
        self.stopping = threading.Event()  #: take no more events
        self.hard_stop = threading.Event()  #: the grace period is over: give up retries
        self.received = self.settled = 0
        self.counts = collections.Counter()
        self.consumer = self.producer = self.executor = None
        self.producer_lock = threading.Lock()
        self.producer_opts = {}
        self.assigned_at = None
        self.rebalancing = False
        self.needs_position = set()  # partitions just assigned: read on from the committed offset first
        self.kafka = None

    # -- control --
    def request_stop(self, reason="signal"):
        if self.stopping.is_set():
            self.log("stop_now", level="warn", reason=reason + " again: not waiting for running plans")
            self.hard_stop.set()
            for job in list(self.in_flight.values()):
                job.cancel.set()
        else:
            self.log("stopping", reason=reason, running=len(self.in_flight),
                     grace_seconds=self.s.shutdown_grace)
        self.stopping.set()
        with self.cond:
            self.cond.notify_all()

    def run(self):
        """Watch until stopped (signal, --max-events, --idle-exit); returns the exit code."""
        self.kafka = require_kafka("watch")
        from concurrent.futures import ThreadPoolExecutor
        self.executor = ThreadPoolExecutor(max_workers=self.s.max_concurrent, thread_name_prefix="xzatoma-watch")
        self._connect()
        if self.consumer is None:
            self.executor.shutdown(wait=False)
            return 0
        try:
            self._loop()
        finally:
            self._shutdown()
        return 0

    # -- connecting, with capped exponential backoff --
    def _backoff(self, attempt):
        return min(self.s.backoff_max, self.s.backoff_initial * (2 ** max(0, attempt - 1)))

    def _connect(self):
        kafka = self.kafka
        attempt = 0
        opts = client_options(self.s)
        if "bootstrap_timeout_ms" in getattr(kafka.KafkaConsumer, "DEFAULT_CONFIG", {}):
            opts["bootstrap_timeout_ms"] = 5000  # fail fast and retry here, logging each attempt
        while not self.stopping.is_set():
            try:
                if self.s.create_topics and not self.s.dry_run:
                    create_topics(opts, [self.s.topic, self.s.output_topic] +
                                  ([self.s.dead_letter_topic] if self.s.dead_letter_topic else []))
                consumer_opts = dict(opts, group_id=self.s.group_id, enable_auto_commit=False,
                                     auto_offset_reset="earliest", key_deserializer=None, value_deserializer=None)
                consumer_opts.update(self.s.consumer_options or {})
                consumer = kafka.KafkaConsumer(**consumer_opts)
                producer = None
                self.producer_opts = dict(opts, acks="all", linger_ms=0, retries=3)
                if not self.s.dry_run:
                    producer = kafka.KafkaProducer(**self.producer_opts)
                consumer.subscribe([self.s.topic], listener=_listener(kafka, self))
                self.consumer, self.producer = consumer, producer
                self.log("connected", brokers=",".join(self.s.bootstrap), topic=self.s.topic,
                         group=self.s.group_id, output_topic=None if self.s.dry_run else self.s.output_topic,
                         max_concurrent=self.s.max_concurrent, dry_run=self.s.dry_run or None)
                return
            except kafka.errors.KafkaError as exc:
                attempt += 1
                delay = self._backoff(attempt)
                self.log("broker_unavailable", level="warn", attempt=attempt, retry_in=delay,
                         error=_one_line(exc))
                self.stopping.wait(delay)

    # -- the loop --
    def _loop(self):
        last_activity = time.monotonic()
        last_lag = 0.0
        poll_failures = 0
        while not self.stopping.is_set():
            if self.s.max_events and self.settled >= self.s.max_events and \
                    (self.s.dry_run or self.tracker.settled_all()):
                self.log("max_events", settled=self.settled)
                break
            self._position_assigned()
            self._start_runs()
            self._flow_control()
            try:
                records = self.consumer.poll(timeout_ms=self.s.poll_ms)
                poll_failures = 0
            except self.kafka.errors.KafkaError as exc:
                poll_failures += 1
                self.log("poll_failed", level="warn", attempt=poll_failures, error=_one_line(exc))
                self.stopping.wait(self._backoff(poll_failures))
                continue
            got = False
            for tp, messages in records.items():
                for msg in messages:
                    if self.s.max_events and self.received >= self.s.max_events:
                        break
                    got = True
                    self.received += 1
                    self._handle(tp, msg)
            self._start_runs()
            self._commit()
            now = time.monotonic()
            if got or self.in_flight or self.backlog or self.assigned_at is None or self.rebalancing:
                last_activity = max(now if (got or self.in_flight or self.backlog) else last_activity,
                                    self.assigned_at or 0)
            elif self.s.idle_exit and now - max(last_activity, self.assigned_at) >= self.s.idle_exit:
                self.log("idle_exit", idle_seconds=self.s.idle_exit)
                break
            if now - last_lag >= self.s.lag_interval:
                last_lag = now
                self._report_lag()

    def _position_assigned(self):
        with self.cond:
            todo = [tp for tp in self.needs_position if tp in self.consumer.assignment()]
            self.needs_position &= set(self.consumer.assignment())
        for tp in todo:
            try:
                offset = self.consumer.committed(tp)
                if offset is None:
                    self.consumer.seek_to_beginning(tp)  # a new group (or a broker that lost it): the oldest
                else:
                    self.consumer.seek(tp, offset)
            except Exception as exc:  # the broker away, or the partition gone again: next round
                self.log("position_failed", level="warn", partition=tp.partition, error=_one_line(exc))
                continue
            with self.cond:
                self.needs_position.discard(tp)
            self.log("positioned", topic=tp.topic, partition=tp.partition, offset=offset or 0)

    def _report_lag(self):
        try:
            for tp in self.consumer.assignment():
                high = self.consumer.highwater(tp)
                if high is not None:
                    self.metrics.watch_lag(tp.topic, tp.partition, max(0, high - self.consumer.position(tp)))
        except Exception:
            pass

    def _handle(self, tp, msg):
        po = self.tracker.get(tp)
        po.received(msg.offset)
        where = dict(topic=msg.topic, partition=msg.partition, offset=msg.offset)
        try:
            ev = decode_message(msg.topic, msg.partition, msg.offset, msg.key, msg.value, msg.headers,
                                self.s.format)
        except BadMessage as exc:
            self.log("rejected", level="warn", event_id=exc.event_id, reason=exc.reason, **where)
            self._reject(tp, po, msg, exc.event_id, exc.reason, None)
            return
        self.log("received", format=ev.format, source=ev.source, **ev.log_fields())
        if ev.is_result:
            return self._skip(po, ev, "a result published by xzatoma")
        reason = self.filters.check(ev)
        if reason:
            return self._skip(po, ev, reason)
        if ev.plan is None:
            self.log("rejected", level="warn", reason=ev.plan_error, **ev.log_fields())
            return self._reject(tp, po, msg, ev.id, ev.plan_error, ev)
        outside = context_outside(ev.plan, self.s.working_dir)
        if outside:
            self.log("rejected", level="warn", reason=outside, **ev.log_fields())
            return self._reject(tp, po, msg, ev.id, outside, ev)
        if self.s.dry_run:
            line = {"event_id": ev.id, "type": ev.type, "source": ev.source, "format": ev.format,
                    "topic": ev.topic, "partition": ev.partition, "offset": ev.offset,
                    "plan_location": ev.plan_location, "name": ev.plan_name(), "version": ev.plan_version(),
                    "goal": ev.plan.goal, "instructions": len(ev.plan.instructions)}
            from xzatoma_store import redact_data  # the goal is the event's text: a credential in it is not shown
            self.out.write(json.dumps(redact_data(line), ensure_ascii=True) + "\n")
            self.out.flush()
            self.counts["would_run"] += 1
            self.metrics.watch_event("dry_run")
            return self._settle(po, ev.offset)
        job = Job(ev, po)
        job.tp = tp
        with self.cond:
            self.backlog.append(job)

    def _skip(self, po, ev, reason):
        self.log("filtered", reason=reason, **ev.log_fields())
        self.counts["filtered"] += 1
        self.metrics.watch_event("filtered")
        self._settle(po, ev.offset)

    def _settle(self, po, offset):
        with self.cond:
            po.settled(offset)
            self.settled += 1
            self.cond.notify_all()

    def _reject(self, tp, po, msg, event_id, reason, ev):
        """Bad input never blocks a partition: log, a rejected result when the id is known, dead-letter, commit."""
        self.counts["rejected"] += 1
        self.metrics.watch_event("rejected")
        if not self.s.dry_run:
            if event_id:
                if ev is None:
                    ev = Event(id=event_id, topic=msg.topic, partition=msg.partition, offset=msg.offset)
                result = result_event(ev, {"status": "rejected", "error": reason}, self.source, self.s.answer_limit)
                self._publish(self.s.output_topic, event_id.encode("utf-8"), _encode(result), RESULT_HEADERS,
                              "result", give_up_after=3)
            if self.s.dead_letter_topic:
                headers = list(msg.headers or []) + [("xzatoma_reason", reason.encode("utf-8", "replace")[:1000]),
                                                     ("xzatoma_origin", ("%s:%s:%s" % (msg.topic, msg.partition,
                                                                                     msg.offset)).encode())]
                self._publish(self.s.dead_letter_topic, msg.key, msg.value, headers, "dead_letter", give_up_after=3)
        self._settle(po, msg.offset)

    # -- running --
    def _start_runs(self):
        if self.s.dry_run:
            return
        with self.cond:
            rotated = 0
            while self.backlog and len(self.in_flight) < self.s.max_concurrent and not self.stopping.is_set() \
                    and rotated < len(self.backlog):
                job = self.backlog.popleft()
                ev = job.event
                if ev.id in self.running_ids:  # the same id is running: decide after it finishes
                    self.backlog.append(job)
                    rotated += 1
                    continue
                rotated = 0
                record = self.store.event_record(ev.id) if self.store is not None else None
                if record is not None and record.get("status") in RESULT_TYPES:
                    if record.get("published_at") or not record.get("result"):
                        self.log("duplicate", status=record.get("status"),
                                 conversation_id=record.get("conversation_id"), **ev.log_fields())
                        self.counts["duplicate"] += 1
                        self.metrics.watch_event("duplicate")
                        job.po.settled(ev.offset)
                        self.settled += 1
                        continue
                    job.stored = json.loads(record["result"])
                self.in_flight[(job.tp, ev.offset)] = job
                self.running_ids.add(ev.id)
                self.metrics.watch_in_flight(len(self.in_flight))
                self.executor.submit(self._work, job)

    def _flow_control(self):
        """Pause fetching while the backlog is full, so memory stays bounded and the group sees us alive."""
        try:
            assigned = self.consumer.assignment()
            full = self.stopping.is_set() or bool(self.backlog) or len(self.in_flight) >= self.s.max_concurrent
            if self.s.dry_run:
                full = self.stopping.is_set()
            paused = self.consumer.paused()
            if full:
                todo = [tp for tp in assigned if tp not in paused]
                if todo:
                    self.consumer.pause(*todo)
            else:
                ready = [tp for tp in paused if tp not in self.needs_position]
                if ready:
                    self.consumer.resume(*ready)
        except Exception as exc:  # an assignment changing under us: next round
            self.log("flow_control", level="debug", error=_one_line(exc))

    def _work(self, job):
        ev = job.event
        settle = True
        try:
            if job.stored is not None:  # finished before a crash, never published: publish that result again
                result, status = job.stored, job.stored.get("data", {}).get("status", "completed")
                self.log("republish", status=status, **ev.log_fields())
            else:
                result, status = self._execute(job)
                if result is None:
                    settle = False
                    return
            published = self._publish(self.s.output_topic, ev.id.encode("utf-8"), _encode(result), RESULT_HEADERS,
                                       "result")
            if not published:
                settle = False  # not committed: redelivered, and the stored result is published then
                return
            if self.store is not None:
                self.store.event_published(ev.id)
            if self.xzepr is not None and job.stored is None:
                self._xzepr(ev, status, result)
            self.log("finished", status=status, conversation_id=result["data"].get("conversation_id"),
                     duration=result["data"].get("duration_seconds"), result_id=result["id"], **ev.log_fields())
            self.counts[status] += 1
            self.metrics.watch_event(status)
        except Exception as exc:  # a bug must not stop the watcher nor block the partition
            self.log("error", level="error", error="%s: %s" % (type(exc).__name__, _one_line(exc)),
                     **ev.log_fields())
        finally:
            with self.cond:
                self.in_flight.pop((job.tp, ev.offset), None)
                self.running_ids.discard(ev.id)
                if settle:
                    job.po.settled(ev.offset)
                    self.settled += 1
                self.metrics.watch_in_flight(len(self.in_flight))
                self.cond.notify_all()
            self._start_runs()  # the next waiting event starts now, not when the loop's poll returns

    def _execute(self, job):
        """Run the plan; (result event, status), or (None, None) when interrupted by us (redelivered later)."""
        ev = job.event
        from xzatoma_store import redact
        self.log("started", goal=redact(ev.plan.goal)[:200], **ev.log_fields())  # redacted before the cut
        if self.xzepr is not None:
            self._xzepr(ev, "started", None)
        start = time.monotonic()
        try:
            outcome = self.run_plan(job) or {}
        except Exception as exc:
            outcome = {"status": "failed", "error": "%s: %s" % (type(exc).__name__, _one_line(exc))}
        duration = round(time.monotonic() - start, 3)
        outcome.setdefault("duration_seconds", duration)
        self.metrics.watch_run(duration)
        status = result_status(outcome.get("status"))
        result = result_event(ev, outcome, self.source, self.s.answer_limit)
        if status == "interrupted" and job.cancel.is_set():
            # stopped by shutdown or a lost partition: recorded as interrupted in the conversation, offset not
            # committed, so the event is redelivered and runs to completion later
            self.log("interrupted", conversation_id=outcome.get("conversation_id"), duration=duration,
                     **ev.log_fields())
            self.counts["interrupted"] += 1
            self.metrics.watch_event("interrupted")
            self._publish(self.s.output_topic, ev.id.encode("utf-8"), _encode(result), RESULT_HEADERS, "result",
                          give_up_after=1)  # informational: the completed result follows on redelivery
            return None, None
        if self.store is not None:
            self.store.record_event(ev.id, outcome.get("conversation_id"), status, result=json.dumps(result),
                                    metadata=json.dumps(ev.metadata()))
        return result, status

    def _xzepr(self, ev, phase, result):
        name = "%s.%s" % (ev.plan_name() or "xzatoma.plan", phase)
        payload = {"trigger_event_id": ev.id}
        if result is not None:
            payload.update({k: result["data"].get(k) for k in ("status", "conversation_id", "error", "turns",
                                                                "tool_calls", "duration_seconds")})
            payload["result_id"] = result["id"]
        try:
            self.xzepr.post_event(name, ev, phase in ("started", "completed"), payload)
            self.log("xzepr_posted", name=name, **ev.log_fields())
        except XzeprError as exc:
            self.counts["xzepr_failed"] += 1
            self.metrics.watch_event("xzepr_failed")
            self.log("xzepr_failed", level="error", name=name, error=str(exc), **ev.log_fields())

    def _publish(self, topic, key, value, headers, what, give_up_after=None):
        """Send and wait for the broker's ack; retry with backoff until it works, the grace period ends, or
        `give_up_after` attempts. Returns whether it was published."""
        attempt = 0
        while True:
            producer = self.producer
            try:
                producer.send(topic, key=key, value=value, headers=headers).get(timeout=self.s.publish_timeout)
                return True
            except Exception as exc:  # KafkaError, or a timeout while the broker is away
                attempt += 1
                if attempt % 3 == 0:
                    self._renew_producer(producer)
                if self.hard_stop.is_set() or (give_up_after and attempt >= give_up_after):
                    self.log("publish_failed", level="error", what=what, topic=topic, attempts=attempt,
                             error=_one_line(exc))
                    return False
                delay = self._backoff(attempt)
                self.log("publish_retry", level="warn", what=what, topic=topic, attempt=attempt, retry_in=delay,
                         error=_one_line(exc))
                self.hard_stop.wait(delay)

    def _renew_producer(self, failed):
        """A producer can be left in a state it does not leave (a broker that forgot its producer id after a
        restart): after repeated failures, publish through a new one."""
        with self.producer_lock:
            if self.producer is not failed:
                return  # another worker renewed it already
            try:
                self.producer = self.kafka.KafkaProducer(**self.producer_opts)
            except Exception as exc:
                self.log("producer_failed", level="warn", error=_one_line(exc))
                return
        try:
            failed.close(timeout=1)
        except Exception:
            pass
        self.log("producer_renewed", level="warn")

    # -- committing --
    def _commit(self, tps=None):
        if self.s.dry_run:
            return
        points = self.tracker.commit_points(tps)
        if not points:
            return
        try:
            self.consumer.commit(_offsets(self.kafka, points))
        except Exception as exc:  # CommitFailedError in a rebalance, or the broker away: retried next round
            self.log("commit_failed", level="warn", error=_one_line(exc))
            return
        self.tracker.committed(points)
        for tp, offset in sorted(points.items(), key=lambda kv: kv[0].partition):
            self.log("committed", topic=tp.topic, partition=tp.partition, offset=offset)

    # -- rebalances (called by the consumer's IO thread) --
    def _revoke(self, revoked):
        """Finish (within the grace period) runs of partitions being given up; their offsets to commit."""
        revoked = set(revoked)
        deadline = time.monotonic() + self.s.shutdown_grace
        self.rebalancing = True  # never idle while the group is still deciding (the clock restarts at assignment)
        with self.cond:
            # events fetched but not started are dropped (their offsets stay unsettled, so the commit stops before
            # them): whoever owns the partition next, perhaps us again, reads on from the committed offset
            self.backlog = collections.deque(j for j in self.backlog if j.tp not in revoked)

            def mine():
                return [j for (tp, _), j in self.in_flight.items() if tp in revoked]
            while mine() and time.monotonic() < deadline and not self.hard_stop.is_set():
                self.cond.wait(min(0.5, max(0.01, deadline - time.monotonic())))
            stragglers = mine()
            for job in stragglers:
                job.cancel.set()
            end = time.monotonic() + 10
            while mine() and time.monotonic() < end:
                self.cond.wait(0.2)
            points = {} if self.s.dry_run else self.tracker.commit_points(revoked)
        if revoked:
            self.log("revoked", partitions=_tps(revoked), interrupted=len(stragglers) or None)
        return points

    def _revoked_committed(self, revoked, points, error=None):
        if error is not None:
            self.log("commit_failed", level="warn", error=_one_line(error))
        elif points:
            self.tracker.committed(points)
            for tp, offset in sorted(points.items(), key=lambda kv: kv[0].partition):
                self.log("committed", topic=tp.topic, partition=tp.partition, offset=offset)
        self.tracker.forget(revoked)

    def _assigned(self, assigned):
        # The consumer keeps its fetch position for a partition it gets back, past events we dropped unstarted (or
        # past the end of a log a broker lost). Hold them until the loop has moved them to the committed offset.
        with self.cond:
            self.needs_position |= set(assigned)
        if assigned:
            try:
                self.consumer.pause(*assigned)
            except Exception:
                pass
        self.tracker.assign(assigned)
        self.assigned_at = time.monotonic()
        self.rebalancing = False
        self.log("assigned", partitions=_tps(assigned))

    def _lost(self, lost):
        lost = set(lost)
        with self.cond:
            for (tp, _), job in self.in_flight.items():
                if tp in lost:
                    job.cancel.set()
            self.backlog = collections.deque(j for j in self.backlog if j.tp not in lost)
        self.tracker.forget(lost)
        self.log("lost", level="warn", partitions=_tps(lost))

    # -- stopping --
    def _shutdown(self):
        self.stopping.set()
        try:
            self._flow_control()  # pause everything: no new events
        except Exception:
            pass
        deadline = time.monotonic() + self.s.shutdown_grace
        while self.in_flight and time.monotonic() < deadline and not self.hard_stop.is_set():
            self._commit()
            try:
                self.consumer.poll(timeout_ms=100)  # paused: keeps the group membership, returns nothing
            except Exception:
                time.sleep(0.1)
        with self.cond:
            for job in self.in_flight.values():
                job.cancel.set()
            end = time.monotonic() + 10
            while self.in_flight and time.monotonic() < end:
                self.cond.wait(0.2)
        self.hard_stop.set()
        self._commit()
        self.executor.shutdown(wait=False)
        try:
            self.consumer.close(autocommit=False)
        except Exception as exc:
            self.log("close_failed", level="warn", error=_one_line(exc))
        if self.producer is not None:
            try:
                self.producer.flush(timeout=5)
                self.producer.close(timeout=5)
            except Exception:
                pass
        self.log("stopped", received=self.received, settled=self.settled,
                 **{k: v for k, v in sorted(self.counts.items())})


def _listener(kafka, watcher):
    """A rebalance listener: runs of revoked partitions finish and are committed before the partitions go."""
    async_base = getattr(kafka, "AsyncConsumerRebalanceListener", None)
    if async_base is not None:  # kafka-python 3: the listener runs on the consumer's IO loop; commit by awaiting
        class AsyncListener(async_base):
            async def on_partitions_revoked(self, revoked):
                points = watcher._revoke(revoked)
                error = None
                if points:
                    try:
                        await watcher.consumer.commit_async(_offsets(kafka, points))
                    except Exception as exc:
                        error = exc
                watcher._revoked_committed(revoked, points, error)

            async def on_partitions_assigned(self, assigned):
                watcher._assigned(assigned)

            async def on_partitions_lost(self, lost):
                watcher._lost(lost)
        return AsyncListener()

    class Listener(kafka.ConsumerRebalanceListener):  # kafka-python 2: called inside poll() on our thread
        def on_partitions_revoked(self, revoked):
            points = watcher._revoke(revoked)
            error = None
            if points:
                try:
                    watcher.consumer.commit(_offsets(kafka, points))
                except Exception as exc:
                    error = exc
            watcher._revoked_committed(revoked, points, error)

        def on_partitions_assigned(self, assigned):
            watcher._assigned(assigned)
    return Listener()


def _offsets(kafka, points):
    make = kafka.OffsetAndMetadata
    extra = ("", -1) if len(make._fields) >= 3 else ("",)  # kafka-python 2.0 has no leader_epoch
    return {tp: make(offset, *extra) for tp, offset in points.items()}


def _tps(tps):
    return ",".join("%s:%d" % (tp.topic, tp.partition) for tp in sorted(tps, key=lambda t: (t.topic, t.partition)))


def _encode(doc):
    return json.dumps(doc, ensure_ascii=False).encode("utf-8")


def _one_line(exc, width=300):
    from xzatoma_store import redact  # before the cut (the log redacts whole lines, but half a key is not one)
    text = " ".join(redact(str(exc)).split()) or type(exc).__name__
    return text if len(text) <= width else text[: width - 1] + "…"


def create_topics(opts, topics, partitions=1):
    """Create the topics that do not exist yet (--create-topics)."""
    import kafka
    from kafka.errors import TopicAlreadyExistsError
    admin = kafka.KafkaAdminClient(**opts)
    try:
        existing = set(admin.list_topics())
        missing = [t for t in dict.fromkeys(topics) if t and t not in existing]
        if missing:
            try:
                admin.create_topics([kafka.admin.NewTopic(t, partitions, 1) for t in missing])
            except TopicAlreadyExistsError:
                pass
    finally:
        admin.close()


# ---- Publish: wrap a plan in a CloudEvent (or an XZepr event) and send it ----


def plan_payload(text, source):
    """The plan as it travels: an object when the file is YAML/JSON, else its text (Markdown). Validated first."""
    from xzatoma_tools import PlanError, detect_plan_format, parse_plan
    try:
        plan = parse_plan(text, source=source)
    except PlanError as exc:
        raise WatchError("invalid plan: %s" % exc)
    fmt = detect_plan_format(text, source)
    if fmt == "json":
        return json.loads(text), plan
    if fmt == "yaml":
        import yaml
        return yaml.safe_load(text), plan
    return text, plan


def build_event(plan_data, plan, event_type=None, source=None, xzepr=False, event_id=None):
    event_id = event_id or str(uuid.uuid4())
    event_type = event_type or "xzatoma.plan.requested"
    source = source or "xzatoma://%s/publish" % socket.gethostname()
    now = now_rfc3339()
    if not xzepr:
        return {"specversion": "1.0", "id": event_id, "source": source, "type": event_type, "time": now,
                "datacontenttype": "application/json", "data": {"plan": plan_data}}
    version = plan.version if plan.version and semver_key(plan.version) else "1.0.0"
    inner = {"id": event_id, "name": event_type, "version": version, "release": "", "platform_id": "xzatoma",
             "package": "xzatoma", "description": plan.goal, "payload": {"plan": plan_data}, "success": True,
             "event_receiver_id": "", "created_at": now}
    return {"success": True, "id": event_id, "specversion": "1.0.1", "type": event_type, "source": source,
            "api_version": "v1", "name": event_type, "version": version, "release": "", "platform_id": "xzatoma",
            "package": "xzatoma", "time": now,
            "data": {"events": [inner], "event_receivers": [], "event_receiver_groups": []}}


def publish(brokers, topic, event, key=None, security=None, timeout=30.0):
    """Send one event (structured mode) and wait for the broker's ack; returns the event id."""
    kafka = require_kafka("publish")
    opts = client_options(brokers, security)
    if "bootstrap_timeout_ms" in getattr(kafka.KafkaProducer, "DEFAULT_CONFIG", {}):
        opts["bootstrap_timeout_ms"] = 10000
    try:
        producer = kafka.KafkaProducer(acks="all", **opts)
    except kafka.errors.KafkaError as exc:
        raise PublishError("cannot reach the Kafka brokers %s: %s" % (brokers, _one_line(exc)))
    try:
        producer.send(topic, key=(key or event["id"]).encode("utf-8"), value=_encode(event),
                      headers=RESULT_HEADERS).get(timeout=timeout)
    except Exception as exc:
        raise PublishError("cannot publish to %s: %s" % (topic, _one_line(exc)))
    finally:
        try:
            producer.close(timeout=5)
        except Exception:
            pass
    return event["id"]


class PublishError(Exception):
    """The broker did not take the event (exit 1: the task failed, not the usage)."""

    exit_code = 1
