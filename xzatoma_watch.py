"""XZatoma watcher: `xzatoma watch` and `xzatoma publish` over Kafka (optional: pip install 'xzatoma[kafka]').

Read top to bottom: the optional dependency, semantic versions, messages (format
detection, bounds and plan extraction), filters, result events (bounded to fit),
the XZepr API client, offsets, the decision log, settings and jobs, the watcher
loop, broker plumbing, and publish. kafka-python is imported inside the functions
that talk to a broker. This module never imports xzatoma: xzatoma hands it its
settings, the store, and a function that runs one plan (a Session of kind
'watch'); so the loop is testable with any callable.
"""

import collections
import functools
import json
import math
import os
import re
import socket
import sys
import threading
import time
import uuid

from xzatoma_store import bounded_text, render_untrusted

# ---- The optional dependency ----


class WatchError(Exception):
    """A usage, configuration or plan problem: one line for a person, exit code 2."""

    exit_code = 2


def require_kafka(command="watch"):
    try:
        import kafka
    except ImportError:
        from xzatoma_store import install_hint
        raise WatchError("xzatoma %s needs the Python package kafka-python: %s"
                         % (command, install_hint("kafka-python", extra="kafka")))
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


VERSION_DIGITS = 64  #: a version's number longer than this is not a version


def semver_key(text):
    """A sortable key for a semantic version (semver.org precedence), or None when it is not one."""
    if isinstance(text, bool) or not isinstance(text, str):
        return None
    m = _SEMVER.match(text.strip())
    if not m or any(len(part) > VERSION_DIGITS for part in re.findall(r"\d+", text)):
        return None  # INFO: 5,000 digits raised in int() (Python's limit is 4,300) and rejected a filtered event
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
            if not v or any(len(n) > VERSION_DIGITS for n in re.findall(r"\d+", version)):
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
#: words of a context key (`working_dir`, `workingDir`: "working" and "dir") that make its texts directories, at any
#: depth; a word ending in "dir" (basedir, srcdir) too. `path` and `root` only as the whole key at the top, as
#: ever: anywhere, they named URL paths (`api_path: /v1/health`, an OpenAPI `paths` list), refused as directories
CONTEXT_DIR_KEYS = ("directory", "directories", "dir", "dirs", "dirpath", "dirname", "workdir", "cwd", "cwds",
                    "repository", "repositories", "repo", "repos", "folder", "folders", "workspace", "workspaces")
CONTEXT_TOP_KEYS = ("path", "root", "workingdirectory")


class _Unhandled(Exception):
    """What went wrong after a message was read, with the event it was read as."""

    def __init__(self, event, cause):
        super().__init__(str(cause))
        self.event, self.cause = event, cause


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


# INFO: one message may cost one message, never a partition (issue 22). What a message can make the watcher
# hold is bounded before it is parsed: its size, its headers, the length of each attribute a result or a log
# line repeats, and (xzatoma_plans.load_json/load_yaml) the depth, values and alias expansion of its document.
MAX_MESSAGE_BYTES = 8 << 20  #: larger messages are rejected unread (watcher.max_message_bytes)
MAX_HEADERS = 256  #: headers of one message
ID_MAX_BYTES = 1024  #: an event id (or a bare plan's key): results, logs and the store repeat it
#: the longest id a result names: one cut (_cut_id), with its mark and digest
ID_CUT_BYTES = ID_MAX_BYTES + len("…".encode("utf-8")) + 16
ATTRIBUTE_MAX_BYTES = 4096  #: any other CloudEvents attribute (type, source, subject, …)


def _cut_id(text):
    """An id over ID_MAX_BYTES, cut (and marked) so that a result can still name it; one within it, whole (ids
    of 1,022 to 1,024 bytes were cut to make room for the mark they did not need: two of them were one id). The
    cut keeps ID_MAX_BYTES and adds its mark past them, so no valid id is ever the same text (cut within the
    limit, 'A' x 1,100 was answered as the valid 'A' x 1,021 + '…', which then never ran), and 16 hex digits of
    the whole id's SHA-256 follow the mark, so two long ids sharing their first 1 KB stay two."""
    cut, was_cut = bounded_text(text, ID_MAX_BYTES)
    if not was_cut:
        return text
    import hashlib
    return cut + "…" + hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:16]


def _load_document(text):
    """JSON, else YAML, both bounded; BadMessage when it is neither or over the limits."""
    from xzatoma_plans import DocumentError, load_json, load_yaml
    stripped = text.lstrip()
    json_error = None
    if stripped.startswith(("{", "[", '"')):
        try:
            return load_json(text)
        except DocumentError as exc:
            if exc.over_limit:
                raise BadMessage("JSON %s" % exc)
            json_error = exc
    try:
        return load_yaml(text)
    except DocumentError as exc:
        reason = exc if exc.over_limit or json_error is None else json_error
        raise BadMessage("neither JSON nor YAML: %s" % str(reason).splitlines()[0][:200])


def _is_xzepr(doc):
    data = doc.get("data")
    return (isinstance(data, dict) and isinstance(data.get("events"), list)) or \
        ("platform_id" in doc and "api_version" in doc)


def message_id_hint(key, headers):
    """The id a message is answered under when it cannot be read: a binary CloudEvent's ce_id header (the last,
    in any case, as decode_message reads it) when it is text, else its key, else None. One rule for a message
    rejected as read and one set aside unread (they differed: the first exact-case ce_id against the last)."""
    named = [(name.lower(), raw) for name, raw in list(headers or ())[:MAX_BUILT_HEADERS] if isinstance(name, str)]
    ids = [raw for name, raw in named if name == "ce_id"]
    types = [raw for name, raw in named if name == "content-type"]
    if not _binary_mode(any(name == "ce_specversion" for name, _ in named), types[-1] if types else None):
        ids = []  # not a binary CloudEvent: a ce_id header names nothing (it took over another event's id)
    for raw in (ids[-1] if ids else None, key):
        try:
            if raw and _text(raw).strip():  # a blank ce_id names nothing either: the key does
                return _cut_id(_text(raw))
        except (UnicodeDecodeError, AttributeError, TypeError):
            pass
    return None


def _binary_mode(specversion_header, content_type):
    """Whether a record is a binary-mode CloudEvent: a ce_specversion header, and no content-type of a structured
    one. INFO: the Kafka binding (3.2) makes `application/cloudevents…` structured whatever else comes with it (a
    valid structured event that also carried ce_* headers was read as binary: "no plan")."""
    if isinstance(content_type, bytes):
        content_type = content_type.decode("latin-1")
    return specversion_header and not (content_type or "").strip().lower().startswith("application/cloudevents")


def decode_message(topic, partition, offset, key, value, headers=(), fmt="auto", max_bytes=MAX_MESSAGE_BYTES,
                   timestamp=None):
    """An Event from one Kafka record, or BadMessage. The plan is parsed and validated here. `timestamp`: the
    record's (milliseconds), part of a keyless bare plan's id."""
    position = "%s:%s:%s" % (topic, partition, offset)
    try:
        key_text = _text(key) or None
    except UnicodeDecodeError:
        key_text = None
    long_key = 0  # a key over ID_MAX_BYTES: cut, it would make two events one id, so a bare plan under it is refused
    if key_text is not None:
        key_text, long_key = _cut_id(key_text), len(key_text.encode("utf-8"))
        long_key = long_key if long_key > ID_MAX_BYTES else 0
    headers = list(headers or ())
    id_hint = message_id_hint(key, headers)  # bad headers or a bad body must not cost the event its result
    if len(headers) > MAX_HEADERS:
        raise BadMessage("%d headers, over the limit of %d" % (len(headers), MAX_HEADERS), id_hint)
    hdrs = {}
    for name, raw in headers:
        try:
            name = _text(name).lower()
        except (UnicodeDecodeError, AttributeError):
            continue  # not a name the watcher reads (ce_*, content-type)
        if not (name.startswith("ce_") or name == "content-type"):
            continue  # tracing and the like: never decoded, never a reason to reject
        raw = raw if raw is not None else b""
        if len(raw) > ATTRIBUTE_MAX_BYTES and name != "ce_id":
            raise BadMessage("header %r is %d bytes, over the limit of %d" % (name[:64], len(raw),
                                                                              ATTRIBUTE_MAX_BYTES), id_hint)
        try:
            hdrs[name] = _text(raw)
        except UnicodeDecodeError:
            raise BadMessage("header %r is not UTF-8" % (name[:64],), id_hint)
    binary = fmt in ("auto", "cloudevents") and _binary_mode("ce_specversion" in hdrs, hdrs.get("content-type"))
    if value is None or not value.strip():
        raise BadMessage("empty message", id_hint)
    if len(value) > max_bytes:
        raise BadMessage("the message is %d bytes, over the limit of %d (watcher.max_message_bytes)"
                         % (len(value), max_bytes), id_hint)
    try:
        text = _text(value)
    except UnicodeDecodeError as exc:
        if not binary:
            raise BadMessage("not UTF-8 text (byte %d)" % exc.start, id_hint)
        text = None  # a binary CloudEvent's data (an image): no plan, told only to an event the filters keep
    ev = Event(topic=topic, partition=partition, offset=offset, key=key_text)

    if fmt == "plan":
        return _bare_plan(ev, text, position, long_key, timestamp, value)
    if binary:  # binary content mode
        from xzatoma_plans import DocumentError, load_json
        attrs = {k[3:]: v for k, v in hdrs.items() if k.startswith("ce_")}
        data = text
        content_type = hdrs.get("content-type", "")
        if text is not None and ("json" in content_type or text.lstrip().startswith(("{", "["))):
            try:
                data = load_json(text)
            except DocumentError as exc:
                if exc.over_limit:
                    raise BadMessage("data: JSON %s" % exc, _cut_id(attrs["id"]) if attrs.get("id") else id_hint)
                data = text  # not JSON after all: the plan parser says what it is
        try:
            _attributes(ev, attrs, "cloudevents")
        except BadMessage as exc:  # a blank ce_id: answered under the key, as an unreadable body is
            raise BadMessage(exc.reason, exc.event_id or id_hint)
        if text is None:
            ev.plan_error = "no plan in the event (its data is not UTF-8 text)"
            return ev
        ev.data = data
        return _extract_plan(ev)
    try:
        doc = _load_document(text)
    except BadMessage as exc:
        from xzatoma_plans import detect_plan_format
        # a Markdown plan is no YAML: it is read as the plan it is (it was rejected, attack round 15a)
        if fmt == "auto" and detect_plan_format(text) == "markdown":
            return _bare_plan(ev, text, position, long_key, timestamp, value)
        raise BadMessage(exc.reason, id_hint)  # a binary CloudEvent's ce_id names it even when its body is bad
    if isinstance(doc, dict) and "specversion" in doc and fmt != "plan":
        kind = "xzepr" if fmt == "xzepr" or (fmt == "auto" and _is_xzepr(doc)) else "cloudevents"
        if _id_was_mended(doc, text):
            raise BadMessage("the event id holds half a character (a lone surrogate escape, \\uD800 to \\uDFFF), "
                             "which no text can", id_hint)
        try:
            _attributes(ev, doc, kind)
        except BadMessage as exc:  # no string id (none, or a number): answered under the key, as a body that
            raise BadMessage(exc.reason, exc.event_id or id_hint)  # cannot be read is (it went unanswered)
        ev.data = doc.get("data") if "data" in doc or "data_base64" not in doc else _base64_data(ev, doc)
        return _extract_plan(ev)
    if fmt in ("xzepr", "cloudevents"):
        raise BadMessage("not a CloudEvent: no 'specversion' attribute (--format %s)" % fmt,
                         _body_id(doc, text, id_hint))
    return _bare_plan(ev, text, position, long_key, timestamp, value)


def _place(position, timestamp, value):
    """A keyless bare plan's id: where it is, and when. INFO: offsets start again at 0 on a topic made anew (or a
    broker that keeps them in memory, restarted), and a new plan there was a "duplicate" of an old one; a record
    without a time (-1) is told by what it holds (attack rounds 12 and 13)."""
    if isinstance(timestamp, int) and timestamp >= 0:
        return "%s@%d" % (position, timestamp)
    import hashlib
    return "%s#%s" % (position, hashlib.sha256(value if isinstance(value, bytes) else b"").hexdigest()[:16])


def _number_id(value):
    """The text of an id sent as a JSON integer (CloudEvents ids are strings: a producer that sends 123 means
    "123"), else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        text = str(value)  # JSON's integers stop at 4,300 digits; an id at ID_MAX_BYTES (10**18 lost its result)
        return text if len(text) <= ID_MAX_BYTES else None
    return None


def _body_id(doc, text, fallback):
    """The id a document that is no event names for its answer, as an event's is read: its text (cut), or the
    number it holds; else `fallback` (half a character mended to '?' is no id: review found this path missed)."""
    event_id = doc.get("id") if isinstance(doc, dict) else None
    number = _number_id(event_id)
    if number is not None:
        return number
    if isinstance(event_id, str) and event_id.strip() and not _id_was_mended(doc, text):
        return _cut_id(event_id)
    return fallback


def _id_was_mended(doc, text):
    """Whether the JSON id was half a character that load_json mended to '?' (it was then the id of another
    event: "p-q\\ud800" took "p-q?", found by an attack round). Only then is the document read again, unmended."""
    from xzatoma_plans import has_surrogate_escape
    event_id = doc.get("id")
    if not isinstance(event_id, str) or "?" not in event_id or not has_surrogate_escape(text):
        return False
    try:
        json.loads(text)["id"].encode("utf-8")  # within the bounds load_json checked
    except UnicodeEncodeError:
        return True
    except (ValueError, LookupError, TypeError, AttributeError):  # YAML, whose escapes load_yaml refuses
        pass
    return False


def _base64_data(ev, doc):
    """A structured CloudEvent's data_base64 (CloudEvents' JSON format: binary data) as the plan's document: JSON
    when it reads as JSON (bounded as a message is), else its text (a YAML or Markdown plan); None when it is not
    base64 of UTF-8 text or its JSON is over the bounds: no plan, which only an event the filters keep is told
    (rejected at once, an image on a shared topic got a result though the filters skipped its type)."""
    import base64
    import binascii
    from xzatoma_plans import DocumentError, load_json
    raw = doc.get("data_base64")
    try:
        text = base64.b64decode(raw if isinstance(raw, str) else "", validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None  # binary data (an image, protobuf): no plan, said only if it passes the filters
    if "json" in str(doc.get("datacontenttype") or "") or text.lstrip().startswith(("{", "[")):
        try:
            return load_json(text)
        except DocumentError as exc:
            if exc.over_limit:
                return None
    return text


def _attributes(ev, attrs, kind):
    ev.format = kind
    event_id = attrs.get("id")
    if event_id is not None and not isinstance(event_id, str):  # 123 is told under it; 1.5, true, {} under none
        raise BadMessage("the event id must be a string (CloudEvents), not %s" % _json_kind(event_id),
                         _number_id(event_id))
    ev.id = _cut_id(event_id) if isinstance(event_id, str) and event_id.strip() else None
    if ev.id is not None and ev.id != event_id:
        raise BadMessage("the event id is %d bytes, over the limit of %d" % (len(event_id.encode("utf-8")),
                                                                             ID_MAX_BYTES), ev.id)
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
            value = str(value)
            if len(value) > ATTRIBUTE_MAX_BYTES // 4 and len(value.encode("utf-8")) > ATTRIBUTE_MAX_BYTES:
                raise BadMessage("attribute '%s' is over the limit of %d bytes" % (name, ATTRIBUTE_MAX_BYTES), ev.id)
            setattr(ev, name, value)
    success = attrs.get("success")
    if isinstance(success, str):
        success = success.strip().lower() not in ("false", "0", "no")
    ev.success = None if success is None else bool(success)


def _json_kind(value):
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        shown = str(value)
        return "the number %s" % (shown if len(shown) <= 40 else "of %d digits" % len(shown))
    return {dict: "an object", list: "an array"}.get(type(value), type(value).__name__)


def _bare_plan(ev, text, position, long_key=0, timestamp=None, value=b""):
    from xzatoma_plans import PlanError, parse_plan
    if long_key:
        raise BadMessage("the message key (a bare plan's event id) is %d bytes, over the limit of %d"
                         % (long_key, ID_MAX_BYTES), ev.key)
    ev.format, ev.id, ev.plan_location = "plan", ev.key or _place(position, timestamp, value), "value"
    try:
        ev.plan = parse_plan(text, source="message %s" % position)
    except PlanError as exc:
        ev.plan_error = str(exc)
    return ev


def _find_plan(ev):
    from xzatoma_plans import looks_like_plan
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
    from xzatoma_plans import PlanError, parse_plan, plan_from_data
    where, value = _find_plan(ev)
    ev.data = None  # read: a waiting event holds its plan, not the whole document (whose values cost 25x its bytes)
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
    """Why the plan's context names a directory outside the jail, or None. Every text in it, at any depth, whose
    own key has a word that names a directory (CONTEXT_DIR_KEYS, or one ending in "dir", in any case and spelling:
    `workingDir`, `"directory "`, `basedir`), or that is one of the context's own keys in CONTEXT_TOP_KEYS, is
    resolved, a file: URL as its path (attack rounds named /etc in each of these ways). The run is jailed whatever
    this says: this tells the sender early."""
    ctx = plan.context if plan is not None else None
    if not isinstance(ctx, (dict, list)):
        return None
    root = os.path.realpath(working_dir)
    checked = 0
    for key, value, top in _context_texts(ctx):
        words = re.findall(r"[a-z]+|[0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", key).lower())
        whole = "".join(words)
        if not (any(w in CONTEXT_DIR_KEYS or (w.endswith(("dir", "dirs")) and w not in ("redir", "redirs"))
                    for w in words) or (top and whole in CONTEXT_TOP_KEYS)):
            continue
        path = _context_path(value)
        if path is None:
            continue
        if len(value) > 4096:  # longer than any path (PATH_MAX): and realpath's walk of it took seconds per 100 KB
            return "context %s is %d characters, longer than a path can be" % (key, len(value))
        if "\x00" in value or "\x00" in path:  # no path holds one (realpath raised ValueError: no result)
            return "context %s holds a NUL character, which no path can" % key
        checked += 1
        if checked > 1000:
            return "the context names more than 1,000 directories"
        resolved = os.path.realpath(os.path.join(root, os.path.expanduser(path)))
        if resolved != root and not resolved.startswith(root.rstrip(os.sep) + os.sep):
            # the watcher's own path is not named: the reason goes back to whoever sent the event
            return "context %s %r is outside the working directory" % (key, value[:200])
    return None


def _context_texts(ctx):
    """(key, text, whether its key is one of the context's own) for every text in a plan's context, depth first; a
    list's items count under its key, and a list context's mappings as the context's own (a list under a top-level
    `path` went unread: found in review). Bounded as the document that held it."""
    stack = [("context", ctx, 0)]  # the mappings a value sits in: its key is the context's own at 1
    while stack:
        key, value, depth = stack.pop()
        if isinstance(value, str):
            yield key, value, depth == 1
        elif isinstance(value, dict):
            stack.extend((str(k)[:256], v, depth + 1) for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((key, v, depth) for v in reversed(value))


def _context_path(value):
    """The path a context text names: itself, stripped, or a file: URL's path; None for blank text and for a URL
    of another kind or an scp-like repository address (git@host:repo), which name no directory here."""
    text = value.strip()
    if not text:
        return None
    if re.match(r"^file:", text, re.I):
        from urllib.parse import unquote, urlsplit
        return unquote(urlsplit(text).path) or "/"
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text) or re.match(r"^[\w.-]+@[\w.-]+:", text):
        return None
    return text


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
                "rejected": "xzatoma.plan.rejected", "interrupted": "xzatoma.plan.interrupted",
                # an answer without the tool work the plan needed (README: Honest completion)
                "unverified": "xzatoma.plan.unverified"}
RESULT_HEADERS = [("content-type", STRUCTURED_CONTENT_TYPE.encode())]


def now_rfc3339():
    from xzatoma_store import rfc3339
    return rfc3339(millis=True)


REDACT_MARGIN = 32768  #: redacted beyond a cut: longer than any credential shape (a PEM block is up to 16 KB)


def clipped(text, limit):
    """(text redacted, then cut to `limit` UTF-8 bytes, whether it was cut). Redacting before cutting leaves no
    half a key; only the head a margin past the limit is redacted (8 MB of text took seconds, per field)."""
    from xzatoma_store import redact
    text = text if isinstance(text, str) else str(text)
    head = text[:limit + REDACT_MARGIN]
    out, cut = bounded_text(redact(head), limit)
    return out, cut or len(head) < len(text)


def result_status(status):
    """The agent's run status as one of the result kinds."""
    if status in RESULT_TYPES:
        return status
    return "interrupted" if status in ("cancelled", "terminated") else "failed"


# Every field of a result is bounded, and the whole event fits under the producer's max_request_size: a 2 MB
# goal copied whole made a result the producer refused forever, and the partition's commit stopped (issue 22).
# INFO: JSON sends a control character as six bytes (\u0001). Only answer, goal and error could be cut, so a
# 4 KB type of them (24 KB) left a rejected event with no result at all at the smallest max_request_size, and 100
# steps of them (150 KB) turned a completed run into "failed: a result event cannot fit" (issue 22). Every field
# from the event or the run can now be cut; only the frame cannot (the status, and the subject: an id of at most
# ID_CUT_BYTES, 6 KB as JSON), and it fits in the smallest budget a watcher has: 16384 bytes, the least
# watcher.kafka.max_request_size, less RECORD_OVERHEAD and a key of ID_CUT_BYTES (Watcher._budget; tested).
FIELD_MAX_BYTES = {"trigger_event_id": ID_CUT_BYTES, "trigger_type": ATTRIBUTE_MAX_BYTES, "conversation_id": 256,
                   "goal": 8192, "error": 8192}
#: cut further when the whole event is over its budget, tier by tier, the largest of a tier first: what matters
#: least goes first (steps, warnings, the type), then the answer, goal, error and usage (16 numbers: the smallest
#: unless their names are not), then the ids of the conversation and (in data; `subject` keeps it whole) of the
#: trigger. The status is never cut nor changed.
SHRINKABLE = (("steps", "warnings", "trigger_type"), ("answer", "goal", "error", "usage"),
              ("conversation_id", "trigger_event_id"))
#: seconds the consumer loop's own store calls wait for another process's lock (marks, a lag report's look-up)
LOOP_STORE_PATIENCE = 1.0
RECORD_OVERHEAD = 1024  #: bytes of a Kafka record beyond its value and key (batch header, headers, lengths)


def result_event(ev, outcome, source, answer_limit=65536, max_bytes=None):
    """The CloudEvent published for one event that passed the filters. Each text field is redacted, then cut to
    its bound (`data.truncated` maps each field cut to its size before: bytes of a text, items of a list); with
    `max_bytes` (a watcher's budget, 14317 bytes at least) the encoded event fits in that many bytes, whatever the
    event and the outcome held, cut in SHRINKABLE's order, its status and subject whole."""
    # every consumer of the results topic reads it: the goal and an error quote the event, and a credential in it
    outcome = outcome if isinstance(outcome, dict) else {}  # went out again (issue 12)
    status = result_status(outcome.get("status"))
    limits = dict(FIELD_MAX_BYTES, answer=answer_limit)
    texts = (("trigger_event_id", ev.id), ("trigger_type", ev.type),
             ("conversation_id", outcome.get("conversation_id")),
             ("goal", ev.plan.goal if ev.plan is not None else None), ("answer", outcome.get("answer")),
             ("error", outcome.get("error")))
    data, truncated = {"status": status}, {}
    for name, value in texts:
        if value is None:
            data[name] = None
            continue
        data[name], cut = clipped(value, limits[name])
        if cut:
            truncated[name] = len(str(value).encode("utf-8", "replace"))
    warnings = outcome.get("warnings")
    warnings = [w for w in warnings if isinstance(w, str)] if isinstance(warnings, list) else []
    data["warnings"] = [clipped(w, 1024)[0] for w in _first(warnings, 8, "warnings", truncated)]
    usage = outcome.get("usage")
    usage = [(str(k)[:64], v) for k, v in usage.items() if _finite(v)] if isinstance(usage, dict) else []
    data["usage"] = dict(_first(usage, 16, "usage", truncated))
    for name, kind, default in (("turns", int, 0), ("tool_calls", int, 0), ("duration_seconds", float, 0.0)):
        value = outcome.get(name, default)
        data[name] = value if _finite(value) else kind(default)
    # the plan's progress as the run left it: the first 100 steps, each text 256 bytes (~30 KB, 150 KB as JSON)
    steps = outcome.get("steps")
    steps = [s for s in steps if isinstance(s, dict) and isinstance(s.get("text"), str) and
             isinstance(s.get("status"), str)] if isinstance(steps, list) else []
    data["steps"] = [{"step": n, "text": clipped(s["text"], 256)[0], "status": s["status"][:16]}
                     for n, s in enumerate(_first(steps, 100, "steps", truncated), 1)]
    planned = len(ev.plan.instructions) if ev.plan is not None and steps else 0
    if planned > len(steps):  # the run's list holds 100 (core's MAX_STEPS): the rest went unnamed before
        truncated.setdefault("steps", planned)
    doc = {"specversion": "1.0", "id": str(uuid.uuid4()), "source": source, "type": RESULT_TYPES[status],
           "subject": data["trigger_event_id"] if ev.id is None else ev.id, "time": now_rfc3339(),
           "datacontenttype": "application/json", "data": data}
    if max_bytes is not None:
        fit(doc, [(data, names) for names in SHRINKABLE], max_bytes, truncated)
    if "answer" in truncated:
        data["answer_truncated"] = True
    if truncated:
        data["truncated"] = truncated
    if max_bytes is not None and len(_encode(doc)) > max_bytes:  # only a budget no watcher has
        raise ValueError("a result event cannot fit in %d bytes" % max_bytes)
    return doc


def _first(items, limit, name, truncated):
    """The first `limit` of `items`; when some are left out, how many there were is noted in `truncated`."""
    if len(items) > limit:
        truncated[name] = len(items)
    return items[:limit]


def fit(doc, tiers, max_bytes, truncated, note_bytes=200):
    """Cut fields of `doc` until it encodes to at most `max_bytes`, less `note_bytes` (and 32 a field) for the
    note of what was cut. `tiers` lists (a mapping inside `doc`, names in it), cut in that order, in each the
    largest as encoded first: a text at a character's end, a list or mapping by items from its end. Each field
    cut is noted in `truncated` with its size before (bytes of a text, items of a list) unless it is there
    already. Returns whether it fits."""
    reserve = note_bytes + 32 * sum(len(names) for _, names in tiers)
    for fields, names in tiers:
        again = set()  # fields cut once already
        while True:
            over = len(_encode(doc)) + reserve - max_bytes
            if over <= 0:
                return True
            sizes = {n: len(_encode(fields[n])) for n in names if isinstance(fields.get(n), (str, list, dict))
                     and fields[n]}
            if not sizes:
                break
            name = max(sizes, key=sizes.get)
            value = fields[name]
            if isinstance(value, str):
                raw = len(value.encode("utf-8", "replace"))
                truncated.setdefault(name, raw)
                # its share of what must go, as if its characters were alike; cut again, at least `over` bytes
                # go (a character takes as many bytes in JSON as in UTF-8, or up to 6 when escaped)
                keep = raw * max(0, sizes[name] - over) // sizes[name]
                keep = min(keep, raw - over) if name in again else keep
                fields[name] = bounded_text(value, max(0, min(keep, raw - 1)))[0]
            else:
                items = list(value.items()) if isinstance(value, dict) else list(value)
                truncated.setdefault(name, len(items))
                while items and over > 0:
                    over -= len(_encode(items.pop())) + 1
                fields[name] = dict(items) if isinstance(value, dict) else items
            again.add(name)
    return len(_encode(doc)) + reserve <= max_bytes


def result_source(group, host=None):
    return "xzatoma://%s/%s" % (host or socket.gethostname(), group)


# ---- XZepr API client: receiver discovery, started/completed events ----


class XzeprError(Exception):
    def __init__(self, message, answered=False):
        super().__init__(message)
        self.answered = answered  #: the API answered (4xx, a status past 599): asking again changes nothing


XZEPR_REPLY_BYTES = 1 << 20  #: of an answer, what is read (a receiver's id, an event's)


class XzeprClient:
    """Posts run lifecycle events to XZepr; retries 5xx and connection errors with backoff, then gives up."""

    RECEIVER = {"name": "xzatoma", "type": "xzatoma.plan.result", "version": "1.0.0",
                "description": "XZatoma plan runs triggered by events", "schema": {}}

    @staticmethod
    def endpoint(api_url):
        """(scheme, host, port) of the API; ValueError when it is not an http(s) URL with a host."""
        from urllib.parse import urlsplit
        url = urlsplit(api_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError("needs http:// or https:// and a host, like https://xzepr.example.com")
        return url.scheme, url.hostname, url.port or (443 if url.scheme == "https" else 80)

    def __init__(self, api_url, api_key=None, timeout=10.0, attempts=4, backoff=0.5, max_backoff=8.0, sleep=None,
                 max_body_bytes=65536, budget=30.0, proxy=None, ssl_context=None):
        self.scheme, self.host, self.port = self.endpoint(api_url)
        self.api_url = api_url.rstrip("/")
        self.max_body_bytes = max_body_bytes  #: an event posted is at most this long (JSON, UTF-8)
        self.api_key = api_key
        #: seconds one attempt may take, answer read whole; attempts; the waits between them
        self.timeout, self.attempts, self.backoff, self.max_backoff = timeout, attempts, backoff, max_backoff
        self.budget = budget  #: seconds one request may take in all, every attempt and wait included
        self.proxy = proxy  #: (host, port, Proxy-Authorization or None) as network.proxies say, or None
        self.ssl_context = ssl_context  #: for https: the CA certificates the configuration names
        self.sleep = sleep or time.sleep
        self._receiver = None
        self._lock = threading.Lock()
        self.retries = 0  #: attempts that failed and were retried (for logs and tests)

    def request(self, method, path, body=None, give_up=None, attempts=None):
        """The answer's JSON (None when it has none): 2xx. XzeprError for any other answer, or none in time.
        INFO: a redirect is an error, not followed: the API does not move, and following one carried the API key
        to whatever host it named. A 2xx is never sent again, whatever its body (sent again, one run was posted
        eight times), and 4xx are final; 5xx and no answer are tried again while the budget lasts."""
        data = json.dumps(body, ensure_ascii=False).encode("utf-8", "replace") if body is not None else None
        headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "xzatoma-watch"}
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        where = "XZepr %s %s" % (method, path.split("?")[0])
        give_up = give_up or time.monotonic() + self.budget  # one budget for a post, its receiver's look-up too
        delay, attempts = self.backoff, attempts or self.attempts
        for attempt in range(1, attempts + 1):
            try:
                status, raw = self._send(method, path, data, headers, max(0.1, min(self.timeout,
                                                                                    give_up - time.monotonic())))
            except Exception as exc:  # refused, reset, a garbled status line, the deadline: no answer
                problem = _one_line(exc) or type(exc).__name__
            else:
                if status < 300:  # 1xx other than 100 (http.client takes it for the answer): taken, and then 2xx
                    try:
                        return json.loads(raw.decode("utf-8")) if raw.strip() else None
                    except (ValueError, RecursionError):
                        return None  # taken; what came back is not JSON we can read
                if status < 500 or status >= 600:
                    raise XzeprError("%s: HTTP %d%s" % (where, status, " (redirects are not followed)"
                                                        if status in (301, 302, 303, 307, 308) else ""), True)
                problem = "HTTP %d" % status
            if attempt == attempts or time.monotonic() + delay >= give_up:
                raise XzeprError("%s failed after %d attempts: %s" % (where, attempt, problem))
            self.retries += 1
            self.sleep(delay)
            delay = min(self.max_backoff, delay * 2)

    def _send(self, method, path, data, headers, seconds):
        """(status, body up to 1 MiB) of one attempt, all of it within `seconds`: a watchdog shuts the socket down
        then (a socket timeout bounds each read, not a reply trickled a byte at a time)."""
        import http.client
        import socket
        from urllib.parse import urlsplit
        url = urlsplit(self.api_url + path)
        host, port = self.host, self.port
        target = (url.path or "/") + ("?" + url.query if url.query else "")
        headers = dict(headers)
        if self.proxy is None:
            conn = (http.client.HTTPSConnection(host, port, timeout=seconds, context=self.ssl_context)
                    if self.scheme == "https" else http.client.HTTPConnection(host, port, timeout=seconds))
        elif self.scheme == "https":  # CONNECT through the proxy, then TLS with the API itself
            conn = http.client.HTTPSConnection(self.proxy[0], self.proxy[1], timeout=seconds, context=self.ssl_context)
            conn.set_tunnel(host, port, headers={"Proxy-Authorization": self.proxy[2]} if self.proxy[2] else None)
        else:  # a plain proxy is asked for the absolute URL
            conn = http.client.HTTPConnection(self.proxy[0], self.proxy[1], timeout=seconds)
            target = "http://%s:%d%s" % (host, port, target)
            if self.proxy[2]:
                headers["Proxy-Authorization"] = self.proxy[2]
        late, sockets = threading.Event(), []

        def watchdog():
            late.set()
            for sock in sockets + [conn.sock]:
                if sock is not None:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
        timer = threading.Timer(seconds, watchdog)
        timer.daemon = True
        timer.start()
        # INFO: each status line read, through http.client's _read_status (unchanged from 3.9 to 3.13): a 2xx whose
        # headers then cannot be read (120 of them, one of 70 KB, a reset) is taken all the same, never sent again
        statuses, resp = [], None

        class Answer(http.client.HTTPResponse):
            def _read_status(self):
                line = super()._read_status()
                statuses.append(line[1])
                return line
        conn.response_class = Answer
        try:
            try:
                conn.connect()
            except Exception:  # INFO: a proxy's answer to CONNECT is read as a status line too (set_tunnel)
                if statuses and 400 <= statuses[-1] < 500 and not late.is_set():
                    return statuses[-1], b""  # the tunnel refused (407: the proxy's credentials): final, as a 4xx
                if late.is_set():
                    raise XzeprError("no answer within %g s" % seconds)
                raise
            del statuses[:]  # the tunnel's 200 is the proxy's, not the API taking the post (its TLS may yet fail)
            try:
                sockets.append(conn.sock)  # the response keeps it when the reply says Connection: close (and conn
                conn.request(method, target, body=data, headers=headers)  # forgets it): shut down all the same
                resp = conn.getresponse()
            except Exception:
                if statuses and statuses[-1] != 100 and statuses[-1] < 300:
                    return statuses[-1], b""
                if late.is_set():
                    raise XzeprError("no answer within %g s" % seconds)
                raise
            if not 200 <= resp.status < 300:
                return resp.status, b""
            try:
                return resp.status, resp.read(XZEPR_REPLY_BYTES)
            except Exception:  # taken (a 2xx is never sent again): what came with it could not be read, or in time
                return resp.status, b""
        finally:
            timer.cancel()
            conn.close()
            if resp is not None:
                resp.close()

    def receiver_id(self, give_up=None):
        give_up = give_up or time.monotonic() + self.budget
        if not self._lock.acquire(timeout=max(0.0, give_up - time.monotonic())):  # another post looks it up
            raise XzeprError("XZepr receiver look-up still under way after the post's %g s" % self.budget)
        try:
            delay = self.backoff
            while self._receiver is None:
                found = self.request("GET", "/api/v1/receivers?name=" + self.RECEIVER["name"], give_up=give_up)
                items = found if isinstance(found, list) else []
                if isinstance(found, dict):
                    items = found.get("receivers") or found.get("data") or found.get("items") or []
                for item in items if isinstance(items, list) else []:
                    if isinstance(item, dict) and item.get("name") == self.RECEIVER["name"] and item.get("id"):
                        self._receiver = str(item["id"])
                        break
                else:
                    try:  # made once: unanswered, it may be made all the same, so it is looked up again first
                        made = self.request("POST", "/api/v1/receivers", dict(self.RECEIVER), give_up=give_up,
                                            attempts=1)  # (tried again as it was, a slow API had 4 receivers)
                    except XzeprError as exc:
                        if exc.answered or time.monotonic() + delay >= give_up:
                            raise
                        self.retries += 1
                        self.sleep(delay)
                        delay = min(self.max_backoff, delay * 2)
                        continue
                    if isinstance(made, dict) and isinstance(made.get("data"), dict):
                        made = made["data"]
                    if not isinstance(made, dict) or not made.get("id"):
                        raise XzeprError("XZepr POST /api/v1/receivers returned no id")
                    self._receiver = str(made["id"])
                if len(self._receiver) > 256:  # every post carries it whole: one of 1 MB made none fit
                    self._receiver = None
                    raise XzeprError("XZepr's receiver id is over 256 characters")
            return self._receiver
        finally:
            self._lock.release()

    def post_event(self, name, ev, success, payload):
        """POST one lifecycle event. Every text in it is bounded (a plan's name and an event's attributes are
        someone else's), and the body fits in max_body_bytes (at least 16 KB), the error cut first, the name and
        status never (`payload.truncated` says what was)."""
        give_up = time.monotonic() + self.budget
        phase = name.rsplit(".", 1)[-1]
        body = {"name": clipped(name[:-len(phase) - 1], 255 - len(phase))[0] + "." + phase,
                "version": ev.plan_version() or "1.0.0", "release": ev.release or "",
                "platform_id": ev.platform_id or "xzatoma", "package": ev.package or "xzatoma",
                "description": "xzatoma plan %s for event %s" % (phase, ev.id),
                "payload": dict(payload), "success": bool(success), "event_receiver_id": self.receiver_id(give_up)}
        truncated = {}
        for key, limit in (("version", 256), ("release", 256), ("platform_id", 256), ("package", 256),
                           ("description", 2048)):
            body[key], cut = clipped(str(body[key]), limit)  # redacted as a result is: the event's texts
            if cut:
                truncated[key] = True
        payload = body["payload"]
        for key, value in payload.items():
            if value is not None and not isinstance(value, (str, int, float, bool)):
                value = json.dumps(value, ensure_ascii=False, default=str)  # redacted and cut as a text
            if isinstance(value, str):
                payload[key], cut = clipped(value, FIELD_MAX_BYTES.get(key, ID_MAX_BYTES))
                if cut:
                    truncated[key] = len(value.encode("utf-8", "replace"))
        # cut, when over: the payload's texts (the error first), then the body's, then the trigger's id
        texts = tuple(k for k, v in payload.items() if isinstance(v, str) and k not in ("trigger_event_id", "status"))
        fit(body, [(payload, texts), (body, ("description", "release", "platform_id", "package", "version")),
                   (payload, ("trigger_event_id",))], self.max_body_bytes, truncated)
        if truncated:
            payload["truncated"] = truncated
        return self.request("POST", "/api/v1/events", body, give_up=give_up)


# ---- Offsets: commit per partition up to the lowest unfinished message ----


class PartitionOffsets:
    """One assigned partition: offsets received but not settled, and what may be committed."""

    def __init__(self):
        self.pending = {}  #: offset received and not settled -> when it was received (time.monotonic())
        self.highest = None
        self.committed = None  #: the group's committed offset as this watcher knows it (None: nothing yet)
        self.advanced_at = time.monotonic()  #: when `committed` last moved on (or the partition was assigned)
        self.turn_at = 0.0  #: when its oldest work was last seen merely waiting its turn (see Watcher._their_turn)
        self.turned_at = 0.0  #: the lag report that last saw it so
        self.assigned_at = time.monotonic()  #: when it was assigned (a lag report after it has seen it)
        self.done = set()  #: offsets settled and not yet committed (lost with the partition: read again elsewhere)
        self.gone = False  #: given up (revoked or lost): what settles here now counts for nothing
        #: read again from this offset, the group's own being out of the log's range: committed though nothing
        #: is received (the group's offset is set right at once), and below the group's offset
        self.restarted_at = None

    def received(self, offset):
        self.pending[offset] = time.monotonic()
        self.highest = offset if self.highest is None else max(self.highest, offset)

    def settled(self, offset):
        """Whether this counts as an event settled: not when the partition is gone (a run that ended after its
        partition was lost: --max-events stopped with nothing committed, found by attack round 12)."""
        if self.pending.pop(offset, None) is not None:
            self.done.add(offset)
            return not self.gone
        return False

    def resume_point(self):
        """Where reading must resume for nothing to be skipped: the lowest unfinished offset, else the next one."""
        if self.highest is None:
            return None
        return min(self.pending) if self.pending else self.highest + 1

    def commit_point(self):
        """The offset to commit (the next message to read after a restart), or None when nothing is new."""
        if self.highest is None:
            point = self.restarted_at
        else:
            point = min(self.pending) if self.pending else self.highest + 1
        return point if point is not None and (self.committed is None or point > self.committed) else None

    def read_to(self):
        """The offset after all this partition was read to, by what was received or committed (None: neither)."""
        known = [x for x in (self.committed, None if self.highest is None else self.highest + 1) if x is not None]
        return max(known) if known else None


class OffsetTracker:
    def __init__(self):
        self.lock = threading.Lock()
        self.partitions = {}
        #: {tp: (committed offset, since when it was stalled)} of partitions given up stalled: assigned again at the
        #: offset where it was, its stall goes on (a rebalance every few minutes reset it, and the alert never
        #: fired); one given up idle starts afresh (its next run inherited the idle time as a stall)
        self.unmoved = {}
        self.reported_at = 0.0  #: when the last lag report gave turns (waiting_turn)

    def get(self, tp):
        with self.lock:
            po = self.partitions.get(tp)
            if po is None:
                po = self.partitions[tp] = PartitionOffsets()
            return po

    def assign(self, tps):
        with self.lock:
            for tp in tps:
                if tp not in self.partitions:
                    po = self.partitions[tp] = PartitionOffsets()
                    if tp in self.unmoved:  # until its committed offset says whether it moved meanwhile
                        po.advanced_at = self.unmoved[tp][1]

    def forget(self, tps):
        """Drop partitions; how many of their events were settled but never committed (they count for nothing)."""
        with self.lock:
            dropped = [(tp, self.partitions.pop(tp, None)) for tp in tps]
            for tp, po in dropped:
                if po is not None:
                    po.gone = True
                if po is None or po.committed is None:
                    continue  # not positioned again yet (a broker away): what was remembered of it stands
                seen = self.reported_at > po.assigned_at
                if seen:  # stalled: not given a turn at the last lag report
                    stalled = po.turned_at < self.reported_at
                elif po.pending or po.done:  # no report since it was assigned: stalled when work waits there
                    stalled = True
                else:  # nothing waits: as it was given back, if it was (idle, it starts afresh)
                    stalled = self.unmoved.get(tp, (None,))[0] == po.committed
                if not stalled:
                    self.unmoved.pop(tp, None)
                elif seen or tp not in self.unmoved:
                    self.unmoved[tp] = (po.committed, max(po.advanced_at, po.turn_at))
            return sum(len(po.done) for tp, po in dropped if po is not None)

    def restart(self, tp, offset):
        """The partition is read again from `offset`: what it held is forgotten (its runs still answer their
        events, and settle where they were received, counting for nothing), and `offset` is committed next."""
        with self.lock:
            old = self.partitions.get(tp)
            if old is not None:
                old.gone = True
            po = self.partitions[tp] = PartitionOffsets()
            po.restarted_at = offset
            self.unmoved.pop(tp, None)

    def rewound(self, tp, offset):
        """Where this partition was read to, when a message at `offset` comes from before it (else None): its log
        was read again from an earlier offset (Kafka's answer to an offset out of its range: the client starts
        again from the oldest)."""
        with self.lock:
            po = self.partitions.get(tp)
            read_to = po.read_to() if po is not None else None
            return read_to if read_to is not None and offset < read_to and offset not in po.pending else None

    def read_to_all(self):
        """{tp: the offset after all it was read to, by what was received or committed} (see PartitionOffsets)."""
        with self.lock:
            points = {tp: po.read_to() for tp, po in self.partitions.items()}
        return {tp: point for tp, point in points.items() if point is not None}

    def resume_points(self, tps):
        with self.lock:
            return {tp: po.resume_point() for tp, po in self.partitions.items()
                    if tp in tps and po.resume_point() is not None}

    def commit_points(self, tps=None):
        with self.lock:
            items = [(tp, po) for tp, po in self.partitions.items() if tps is None or tp in tps]
            return {tp: point for tp, point in ((tp, po.commit_point()) for tp, po in items) if point is not None}

    def read_to(self):
        """{tp: the offset after all it received (else its committed offset)} for partitions where nothing waits."""
        with self.lock:
            points = {tp: po.highest + 1 if po.highest is not None else po.committed
                      for tp, po in self.partitions.items() if not po.pending}
        return {tp: point for tp, point in points.items() if point is not None}

    def skipped(self, tp, offset):
        """The client read past `offset` without giving it out (a transaction marker): nothing there waits."""
        with self.lock:
            po = self.partitions.get(tp)
            if po is not None and not po.pending and (po.highest is None or offset > po.highest):
                po.highest = offset

    def committed(self, points):
        with self.lock:
            for tp, point in points.items():
                po = self.partitions.get(tp)
                if po is not None:
                    if po.committed is None and self.unmoved.get(tp, (None,))[0] == point:
                        po.advanced_at = self.unmoved[tp][1]  # where it was when given up: stalled still
                    elif po.committed is None or point > po.committed:
                        po.advanced_at = time.monotonic()
                    po.committed = point
                    po.done.difference_update([offset for offset in list(po.done) if offset < point])  # settled
                    # meanwhile under the watcher's lock are kept: list() and difference_update() are atomic

    def stalled(self):
        """{tp: seconds since the committed offset last moved on, or since its oldest work last merely waited its
        turn} for every assigned partition: a backlog that drains, however large, is not a stall."""
        now = time.monotonic()
        with self.lock:
            return {tp: round(now - max(po.advanced_at, po.turn_at), 3) for tp, po in self.partitions.items()}

    def heads(self):
        """{tp: (the lowest offset received and not settled or None, whether settled ones wait for a commit)}."""
        with self.lock:
            return {tp: (min(po.pending) if po.pending else None, bool(po.done))
                    for tp, po in self.partitions.items()}

    def waiting_turn(self, since):
        """{tp: the last moment its oldest work merely waited its turn}: its stall counts from no earlier."""
        with self.lock:
            self.reported_at = now = time.monotonic()
            for tp, at in since.items():
                if tp in self.partitions:
                    po = self.partitions[tp]
                    po.turn_at, po.turned_at = max(po.turn_at, at), now

    def committed_offsets(self):
        """{tp: the committed offset this watcher knows, or None} for every assigned partition."""
        with self.lock:
            return {tp: po.committed for tp, po in self.partitions.items()}

    def highest_offsets(self):
        """{tp: the offset after the highest received} for the assigned partitions that received any."""
        with self.lock:
            return {tp: po.highest + 1 for tp, po in self.partitions.items() if po.highest is not None}

    def oldest_waiting(self):
        """Seconds the oldest message received and not yet settled has waited (0 when none waits)."""
        with self.lock:
            times = [min(list(po.pending.values())) for po in self.partitions.values() if po.pending]
        return round(time.monotonic() - min(times), 3) if times else 0.0

    def settled_all(self):
        with self.lock:
            return all(not po.pending and (po.highest is None or po.committed == po.highest + 1)
                       for po in self.partitions.values())


# ---- The decision log: one line per decision, text or JSON ----

LEVELS = {"debug": 10, "info": 20, "warn": 30, "error": 40}


def _clean(text):
    """Text from a topic never reaches a terminal with what it should not: shown escaped by the rule all untrusted
    text follows (render_untrusted: by Unicode category, so controls, bidi marks, tag characters and whatever
    else is invisible, not a list of them that missed some), and line breaks too, so a decision is one line."""
    return render_untrusted(text).replace("\n", "\\n").replace("\t", "\\t")


class WatchLog:
    """The decision log: one line per decision, text or JSON, redacted and bounded.

    INFO: a log on a pipe, a terminal or a socket is written by a thread of its own, from a bounded queue: a reader
    that stops reading (a stalled log shipper, `2>&1 | less`) froze every thread that logged, the consumer loop
    and the signal's stopper included, so the watcher neither committed nor stopped on SIGTERM (attack round 15b).
    Now the lines it cannot take are dropped and counted, said when it reads again, and the watcher goes on. The
    thread writes with os.write, holding no lock of the stream's: at exit it is left behind, never waited for."""

    QUEUE_LINES = 4096  #: lines waiting for a slow reader before more are dropped

    def __init__(self, stream=None, fmt="text", level="info", redact=None):
        self.stream = stream if stream is not None else sys.stderr
        self.fmt, self.level = fmt, LEVELS.get(level, 20)
        self.redact = redact or (lambda text: text)
        self.lock = threading.Lock()
        self.dropped = 0  #: lines dropped because the log's reader did not keep up
        self._fd = _blocking_fd(self.stream)  #: the descriptor the writer thread writes, or None: written here
        self._queue = None
        self._writer = None

    def __call__(self, decision, level="info", **fields):
        if LEVELS.get(level, 20) < self.level:
            return
        line = self._line(decision, level, fields)
        if self._fd is not None:
            self._enqueue(line)
            return
        with self.lock:
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass

    def _line(self, decision, level, fields):
        """One decision as its line: text or JSON, fields bounded, the whole redacted."""
        fields = {k: self._bounded(v) for k, v in fields.items() if v is not None}
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
        return self.redact(line)

    def _enqueue(self, line):
        import queue
        with self.lock:
            if self._writer is None:
                self._queue = queue.Queue(self.QUEUE_LINES)
                self._writer = threading.Thread(target=self._write_lines, name="xzatoma-log", daemon=True)
                self._writer.start()
        try:
            self._queue.put_nowait(line)
        except queue.Full:
            with self.lock:
                self.dropped += 1

    def _write_lines(self):
        encoding = getattr(self.stream, "encoding", None) or "utf-8"
        while True:
            line = self._queue.get()
            try:
                if line is None:
                    return
                with self.lock:
                    dropped, self.dropped = self.dropped, 0
                if dropped:
                    self._write(self._line("log_dropped", "warn", {"lines": dropped, "reason": "the log's reader "
                                                                   "did not keep up"}), encoding)
                self._write(line, encoding)
            finally:
                self._queue.task_done()

    def _write(self, line, encoding):
        data = (line + "\n").encode(encoding, "backslashreplace")
        try:
            while data:
                data = data[os.write(self._fd, data):]
        except OSError:
            pass  # a closed log: what is left is lost, as a write to it would be

    def close(self, timeout=2.0):
        """Write what waits, for at most `timeout` seconds (a reader that never reads is not waited for)."""
        if self._writer is None:
            return
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(None, timeout=timeout)
        except Exception:
            return
        self._writer.join(max(0.0, deadline - time.monotonic()))

    def _bounded(self, value):
        """A field cut to LOG_FIELD_CHARS, redacted before the cut leaves half a credential (a filtered event's
        name of a million characters was one 11.5 MB line)."""
        if isinstance(value, (bool, int, float)):
            return value
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        if len(text) <= LOG_FIELD_CHARS:
            return value
        out, _ = clipped(text, LOG_FIELD_CHARS)
        return out + "…[%d characters more]" % (len(text) - len(out))


def _blocking_fd(stream):
    """The descriptor under `stream` when a write to it can wait on a reader (a pipe, a terminal, a socket), its
    Python buffer flushed first; None for files, StringIO and the like (written at once, in order)."""
    import stat
    try:
        fd = stream.fileno()
        mode = os.fstat(fd).st_mode
        stream.flush()
    except (AttributeError, OSError, ValueError):
        return None
    return fd if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode) else None


LOG_FIELD_CHARS = 2048  #: of one field of a decision line, in bytes (escaped after: at most 10 characters each)


class _NoMetrics:
    def __getattr__(self, name):
        return lambda *args, **kw: None


# ---- Watcher settings, connection options and jobs ----


class Settings:
    """What a watcher needs, already resolved (flags > environment > config > defaults) by xzatoma."""

    DEFAULTS = dict(
        brokers="localhost:9092", topic="xzepr.events", group_id="xzatoma-watcher", output_topic=None,
        dead_letter_topic=None, create_topics=False, security={}, working_dir=".", max_concurrent=1,
        max_events=None, idle_exit=None, dry_run=False, format="auto", shutdown_grace=30.0, answer_limit=65536,
        poll_ms=200, backoff_initial=0.5, backoff_max=30.0, publish_timeout=10.0, consumer_options=None,
        host=None, lag_interval=5.0, max_message_bytes=MAX_MESSAGE_BYTES, max_request_size=1048576,
        max_attempts=2, claim_lease=60.0, publish_attempts=20)
    # max_message_bytes: larger messages are rejected unread. max_request_size: the producer's limit, which every
    # result (and dead-letter copy) is made to fit. max_attempts: a message that stopped the watcher (a crash while
    # reading or running it) that many times is set aside. claim_lease: seconds a claim on an event id outlives a
    # watcher that stopped renewing it. publish_attempts: tries of a result the broker refuses (retriable errors)
    # before a small failed result takes its place.

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


def check_brokers(brokers, flag):
    """Bootstrap servers as kafka-python takes them (host[:port], comma-separated), else WatchError: a port that is
    not a number or no broker at all reached the client, whose ValueError and IndexError were "internal errors"."""
    entries = [b.strip() for b in brokers.split(",")] if isinstance(brokers, str) else list(brokers or ())
    if not any(entries):
        raise WatchError("%s: no broker given (host:port, comma-separated)" % flag)
    for entry in filter(None, entries):
        hostport = re.sub(r"^[A-Za-z_]+://", "", entry)  # PLAINTEXT://host:port, as kafka-python reads it
        host, colon, port = hostport.rpartition(":") if not hostport.endswith("]") else (hostport, "", "")
        if not colon:
            host = hostport
        if not host.strip("[]") or colon and not (re.fullmatch(r"[0-9]{1,5}", port) and 0 < int(port) < 65536):
            raise WatchError("%s: %r is not host:port (a port is 1 to 65535)" % (flag, entry[:100]))
    return brokers


def check_topic(name, flag):
    """A topic name Kafka accepts (its Topic.validate: 1-249 of [a-zA-Z0-9._-], not "." or ".."), else WatchError:
    a watcher given one it can never publish to ran every event and then held each result for good."""
    if not name or name in (".", "..") or len(name) > 249 or re.search(r"[^a-zA-Z0-9._-]", name):
        shown = name if len(name or "") <= 60 else name[:57] + "..."
        raise WatchError("%s: %r is not a Kafka topic name (1 to 249 of the letters a-z A-Z, digits, '.', '_' and "
                         "'-'; not '.' or '..')" % (flag, shown))
    return name


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


#: events that may wait for their turn (a claim held elsewhere, their id running here) while fetching goes on:
#: each holds its message (at most watcher.max_message_bytes)
HELD_MAX = 16
BACKLOG_MAX = 256  #: events received and waiting, past which nothing more is fetched
#: the bytes they hold (their records as fetched, and their plans parsed: _message_bytes), past which nothing more
#: is fetched: copies of one id running here count once toward HELD_MAX, and 256 copies of 8 MB held 2 GB (found
#: by an attack round)
BACKLOG_BYTES = 64 << 20


class Job:
    """One event being run: handed to the run-one-plan function."""

    def __init__(self, event, partition_offsets, stored=None, message=None, rejection=None):
        self.event = event
        self.plan = event.plan
        # a rejected event is answered, never run: nothing is made of its plan (to_prompt() failing on it there
        # killed the watcher: an uncaught error in the path that handles errors, round 16b)
        self.prompt = event.plan.to_prompt() if event.plan is not None and stored is None and rejection is None \
            else None
        self.title = event.plan.goal if event.plan is not None else event.id
        self.metadata = event.metadata()
        self.cancel = threading.Event()  #: set on shutdown after the grace period, or on a lost partition
        self.po = partition_offsets
        self.stored = stored  #: a result recorded earlier but never published: publish it, run nothing
        self.unrecorded = False  #: `stored` is a result the store could not record yet: recorded before it goes out
        self.copy_pending = None  #: the reason of a dead-letter copy to make once `stored` is recorded
        self.tp = None
        self.message = message  #: the Kafka record it came from (its dead-letter copy)
        self.not_before = 0.0  #: time.monotonic() before which it is not tried again (claimed by another process)
        self.store_failures = 0  #: claims that failed because the store could not be used
        self.delays = 0  #: times its result could not be published at all (the next try waits longer)
        self.claimed = False  #: this watcher holds its id's claim in the store
        self.held_elsewhere = False  #: its claim was last refused (another live process holds it, or the store failed)
        self.rejection = rejection  #: why the event is rejected: answered like a run (claimed, recorded, published)
        self.answered = None  #: the store's record of its id when that is answered already (a duplicate)
        self.lease_lost = False  #: its run was stopped because its claim could not be renewed (_claims_lapsing)
        self.decoded = _decoded_bytes(event.plan) + _text_bytes(self.prompt)  #: about what its plan takes in
        #: memory, parsed and as a prompt (see BACKLOG_BYTES)
        self.started_at = None  #: when its run last started (time.monotonic())


# ---- The watcher: its loop, consume → filter → extract → queue, lag, flow control ----


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
        self.slot_freed_at = time.monotonic()  #: when a run last gave its slot back (see _their_turn)
        #: runs in a row that found nothing listening where the model server should be, and when the next may try
        #: (time.monotonic()): meanwhile no run starts, then one at a time until one reaches it (_model_away)
        self.model_failures, self.model_back_at = 0, 0.0
        self.stopping = threading.Event()  #: take no more events
        self.hard_stop = threading.Event()  #: the grace period is over: give up retries
        self.stop_deadline = None  #: time.monotonic() when the shutdown's grace period ends, once it has begun
        self.received = self.settled = 0
        self.counts = collections.Counter()
        self.consumer = self.producer = self.executor = None
        self.producer_lock = threading.Lock()
        self.producer_opts = {}
        self.assigned_at = None
        self.rebalancing = False
        self.needs_position = set()  # partitions just assigned: read on from the committed offset first
        self.revoking = set()  # partitions being given up: a job of theirs is never queued again
        self.gauges_lock = threading.Lock()  #: a partition's gauges are set, or dropped, one at a time
        self.kafka = None
        #: who claims event ids in the store: this process, this watcher (two watchers of one process differ)
        self.owner = "%s:%d:%s" % (socket.gethostname(), os.getpid(), uuid.uuid4().hex[:12])
        self.finished = threading.Event()  #: set when the watcher has stopped (ends the claims' heartbeat)
        #: store writes that failed (a claim's release, a result marked published), retried by the claims'
        #: heartbeat until they succeed: a claim left behind holds its id for as long as this process lives
        self.chores = collections.deque()
        self.chores_lock = threading.Lock()  #: the heartbeat and the stop may do them at once: one at a time
        #: ids whose result is out and not yet marked so in the store (a chore): a copy is a duplicate, not
        #: published again from the store's unmarked record
        self.unmarked = {}  #: event id -> (topic, partition, offset) of the message its result answered
        import queue
        self.stop_requests = queue.SimpleQueue()  #: signals' stop requests, for the stopper thread (signal_stop)

    # -- control --
    def signal_stop(self, reason):
        """request_stop, from a signal handler. INFO: a handler runs on the main thread between two of its steps,
        so it must take no lock that thread may hold: request_stop logs, and SIGTERM while the main thread wrote a
        log line hung the watcher for good, a second signal too (found by an attack round). SimpleQueue.put is
        reentrant, made for this; a thread of the watcher's own does the rest."""
        self.stop_requests.put(reason)

    def _stopper(self):
        while True:
            reason = self.stop_requests.get()
            if reason is None:
                return
            self.request_stop(reason)

    def request_stop(self, reason="signal"):
        if self.stopping.is_set():
            self.log("stop_now", level="warn", reason=reason + " again: not waiting for running plans")
            self.hard_stop.set()
            for job in list(self.in_flight.values()):
                job.cancel.set()
        else:
            self.stop_deadline = time.monotonic() + self.s.shutdown_grace  # the grace period counts from here
            self.log("stopping", reason=reason, running=len(self.in_flight),
                     grace_seconds=self.s.shutdown_grace)
        self.stopping.set()
        with self.cond:
            self.cond.notify_all()

    def run(self):
        """Watch until stopped (signal, --max-events, --idle-exit); returns the exit code."""
        threading.Thread(target=self._stopper, name="xzatoma-stop", daemon=True).start()
        try:
            return self._run()
        finally:
            self.stop_requests.put(None)

    def _run(self):
        self.kafka = require_kafka("watch")
        guard_client(self.kafka)
        from concurrent.futures import ThreadPoolExecutor
        self.executor = ThreadPoolExecutor(max_workers=self.s.max_concurrent, thread_name_prefix="xzatoma-watch")
        self._connect()
        if self.consumer is None:
            self.executor.shutdown(wait=False)
            return 0
        if self.store is not None and not self.s.dry_run:
            threading.Thread(target=self._keep_claims, name="xzatoma-lease", daemon=True).start()
        try:
            self._loop()
        finally:
            try:
                self._shutdown()
            finally:
                self.finished.set()
                self._do_chores()
        return 0

    def _keep_claims(self):
        """The claims' heartbeat: while this watcher lives, every event id it claimed stays claimed, and what
        could not be written to the store when it should have been is tried again. Claims it cannot renew for half
        their lease are given up: their runs are stopped, to be tried again, before another watcher may take
        them over (one in another pid namespace judges the lease by the clock alone: a store locked past the
        lease had two watchers run one id at once, found by attack round 12)."""
        renewed = time.monotonic()
        patience = min(5.0, self.s.claim_lease / 8)  # the beat must not miss the lease
        while not self.finished.wait(max(0.2, self.s.claim_lease / 4)):
            try:
                with self.store.patience(patience):
                    self.store.renew_claims(self.owner, self.s.claim_lease)
                renewed = time.monotonic()
            except Exception as exc:  # a locked or failing database: the next beat tries again
                self.log("claims_not_renewed", level="warn", error=_one_line(exc))
                if time.monotonic() - renewed > self.s.claim_lease / 2:
                    self._claims_lapsing(time.monotonic() - renewed)
            # after the renewal, and as patient: a chore waiting out the busy timeout first (a chore is due just
            # when the store was locked) held the lapse back past the lease itself (found in review)
            self._do_chores(patience)

    def _claims_lapsing(self, unrenewed):
        with self.cond:
            jobs = [job for job in self.in_flight.values() if job.claimed and not job.cancel.is_set()]
            for job in jobs:
                job.lease_lost = True
                job.cancel.set()
        if jobs:
            self.log("claims_lapsing", level="error", running=len(jobs), unrenewed_seconds=round(unrenewed, 1),
                     reason="the store has not renewed this watcher's claims for half their lease (watcher."
                     "claim_lease): their runs are stopped and tried again, never run beside another watcher's")

    def _do_chores(self, patience=None):
        with self.chores_lock:
            while self.chores:
                event_id, write = self.chores[0]
                published = event_id in self.unmarked and write == self.store.event_published
                with self.cond:
                    if event_id in self.running_ids and not published:  # claimed again meanwhile: its run ends it
                        self.chores.popleft()
                        continue
                    # INFO: no copy of the id starts while its claim is written (a claim a copy had just made was
                    # released by the retry of an earlier release: the copy ran unclaimed)
                    held = event_id not in self.running_ids
                    self.running_ids.add(event_id)
                try:
                    if patience is None:
                        write(event_id, self.owner)
                    else:
                        with self.store.patience(patience):
                            write(event_id, self.owner)
                except Exception as exc:
                    self.log("store_failed", level="warn", error=_one_line(exc), event_id=event_id, retry=True)
                    return
                finally:
                    if held:
                        with self.cond:
                            self.running_ids.discard(event_id)
                            self.cond.notify_all()
                self.chores.popleft()
                if published:
                    self.unmarked.pop(event_id, None)

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
                consumer_opts.update(_quiet_sensors(kafka.KafkaConsumer))
                # a transaction its producer aborted never happened: its events are not run (kafka-python >= 2.1)
                if "isolation_level" in getattr(kafka.KafkaConsumer, "DEFAULT_CONFIG", {}):
                    consumer_opts["isolation_level"] = "read_committed"
                consumer_opts.update(self.s.consumer_options or {})
                consumer = kafka.KafkaConsumer(**consumer_opts)
                producer = None
                # max_block_ms: a send waits for the topic's metadata (or room in its buffer) no longer than for
                # an ack, so a broker that stops answering costs a logged retry, not a minute's silence
                self.producer_opts = dict(opts, acks="all", linger_ms=0, retries=3,
                                          max_request_size=self.s.max_request_size,
                                          max_block_ms=int(self.s.publish_timeout * 1000),
                                          **_producer_limits(kafka.KafkaProducer, self.s.publish_timeout))
                if not self.s.dry_run:
                    producer = kafka.KafkaProducer(**self.producer_opts)
                consumer.subscribe([self.s.topic], listener=_listener(kafka, self))
                self.consumer, self.producer = consumer, producer
                self.end_probe = EndProbe(kafka, opts)
                self.log("connected", brokers=",".join(self.s.bootstrap), topic=self.s.topic,
                         group=self.s.group_id, output_topic=None if self.s.dry_run else self.s.output_topic,
                         max_concurrent=self.s.max_concurrent, dry_run=self.s.dry_run or None)
                if not crc_in_c():
                    self.log("slow_crc", level="warn", hint="pip install crc32c: kafka-python checks every batch's "
                             "CRC-32C in pure Python without it, 110 ms of CPU for each MB read or written")
                return
            except kafka.errors.KafkaError as exc:
                if isinstance(exc, kafka.errors.KafkaConfigurationError):  # no broker cures it (it was retried
                    raise WatchError("the Kafka client refuses its settings: %s" % _one_line(exc))  # for good)
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
            except Exception as exc:
                where = getattr(exc, "xzatoma_unreadable", None)  # see _guard_dead_batches
                if where is not None:  # a record the client cannot read: it costs that record, then on
                    self._unreadable(where[0], where[1], where[1], _error_text(exc), moved=False)
                    continue
                if not isinstance(exc, self.kafka.errors.KafkaError):
                    raise
                poll_failures += 1
                self.log("poll_failed", level="warn", attempt=poll_failures, error=_one_line(exc))
                self.stopping.wait(self._backoff(poll_failures))
                continue
            got = False
            for tp, messages in records.items():
                if self.s.max_events:
                    # what this watcher holds (_held), not what it received: events
                    # dropped unstarted at a rebalance come again, and were cut off here, and the watcher that
                    # was to stop after max_events settled hung (nothing more ran or was committed)
                    cut = max(0, self.s.max_events - self._held())
                    if cut < len(messages):  # what is not taken is read again after a restart: never committed
                        unread = unread_stand_in(messages[cut].headers)  # a range: from its first offset
                        self.consumer.seek(tp, unread[0] if unread else messages[cut].offset)
                        messages = messages[:cut]
                if messages:  # got, even when a stop leaves them unread: never taken for markers (_past_markers)
                    got = True
                    self.received += self._handle_batch(tp, messages)
            self._start_runs()
            if not got:
                self._past_markers()
            self._commit(timeout=self.s.publish_timeout)  # a frozen broker must not hold the loop (nor a stop)
            now = time.monotonic()
            if got or self.in_flight or self.backlog or self.assigned_at is None or self.rebalancing:
                last_activity = max(now if (got or self.in_flight or self.backlog) else last_activity,
                                    self.assigned_at or 0)
            elif self.s.idle_exit and now - max(last_activity, self.assigned_at) >= self.s.idle_exit:
                self.log("idle_exit", idle_seconds=self.s.idle_exit)
                break
            if now - last_lag >= self.s.lag_interval:
                last_lag = now
                self._check_ends()
                if self._lag_wanted():
                    self._report_lag()

    def _position_assigned(self):
        with self.cond:
            todo = [tp for tp in self.needs_position if tp in self.consumer.assignment()]
            self.needs_position &= set(self.consumer.assignment())
        for tp in todo:
            try:
                offset = self.consumer.committed(tp)
                start = None if offset is None else self._out_of_range(tp, offset)
                if offset is None or start is not None:
                    self.consumer.seek_to_beginning(tp)  # a new group (or a broker that lost it): the oldest
                else:
                    self.consumer.seek(tp, offset)
            except Exception as exc:  # the broker away, or the partition gone again: next round
                self.log("position_failed", level="warn", partition=tp.partition, error=_one_line(exc))
                continue
            with self.cond:
                self.needs_position.discard(tp)
            if start is not None:
                self.tracker.restart(tp, start)  # committed at once: the group's offset is set right
            elif offset is not None:
                self.tracker.committed({tp: offset})  # the lag counts from here until this watcher commits
            self.log("positioned", topic=tp.topic, partition=tp.partition,
                     offset=start if start is not None else offset or 0)

    def _out_of_range(self, tp, offset):
        """The partition's first offset when the group's committed `offset` is out of its log's range, else None.
        INFO: past the end (the topic deleted and made anew, a broker that lost its data), Tansu 0.6 answers each
        fetch with nothing, and Kafka with OFFSET_OUT_OF_RANGE, where the client starts again from the oldest but
        the watcher committed only past the group's offset: either way no event was answered again, and every
        gauge read 0 (attack round 17a). Before the start, its records were deleted unread. The partition is read
        from its start; the store answers once what was answered before."""
        start = _offsets_call(self.consumer.beginning_offsets, [tp]).get(tp)
        end = _offsets_call(self.consumer.end_offsets, [tp]).get(tp)
        if start is None or end is None:
            return None
        if offset > end:  # Tansu's ListOffsets may fall short of the end (EndProbe): its high watermark says
            end = max(end, self.end_probe.ends({tp: end}).get(tp, offset))
        if start <= offset <= end:
            return None
        self.log("offset_out_of_range", level="warn", topic=tp.topic, partition=tp.partition, offset=offset,
                 start=start, end=end, reason=(
                     "the log ends before the group's offset (the topic made anew, or the broker lost its data): "
                     "read again from its start" if offset > end else
                     "%d records were deleted before they were read: read on from the oldest" % (start - offset)))
        return start

    def _check_ends(self):
        """A partition whose log now ends before where it was read to is read again from its start (see
        _out_of_range: a topic made anew under a running watcher). Its end as the broker's ListOffsets or the
        last fetch says it, and when that is short, as a fetch of its end says it (EndProbe)."""
        if self.stopping.is_set():
            return
        assigned = [tp for tp in self.consumer.assignment() if tp not in self.needs_position and self._serving(tp)]
        read_to = self.tracker.read_to_all()
        if not any(tp in read_to for tp in assigned):
            return
        try:
            ends = _offsets_call(self.consumer.end_offsets, [tp for tp in assigned if tp in read_to])
        except Exception as exc:  # the broker away: the next round asks again
            self.log("lag_unknown", level="debug", error=_one_line(exc))
            return
        # a paused partition is not fetched: its high watermark is the old log's, and hid the new one's end until
        # the backlog drained (22 s, and 3 events skipped, round 17d)
        paused = set(self.consumer.paused())
        known = {tp: end if tp in paused else max(end, self.consumer.highwater(tp) or 0) for tp, end in ends.items()}
        short = {tp: end for tp, end in known.items() if end < read_to[tp]}
        if not short:
            return
        for tp, end in self.end_probe.ends(short).items():
            if end >= read_to[tp]:
                continue
            try:
                start = _offsets_call(self.consumer.beginning_offsets, [tp]).get(tp, 0)
                self.consumer.seek_to_beginning(tp)
            except Exception as exc:  # unassigned meanwhile, or the broker away: the next round
                self.log("position_failed", level="warn", partition=tp.partition, error=_one_line(exc))
                continue
            self.log("offset_out_of_range", level="warn", topic=tp.topic, partition=tp.partition,
                     offset=read_to[tp], start=start, end=end, reason="the log ends before where it was read to "
                     "(the topic made anew, or the broker lost its data): read again from its start")
            self.tracker.restart(tp, start)

    def _held(self):
        """Events this watcher holds toward --max-events: settled, running, waiting to run."""
        with self.cond:
            return self.settled + len(self.in_flight) + len(self.backlog)

    def _past_markers(self):
        """A transaction's commit or abort marker takes an offset the client never gives out, as do the records of
        an aborted transaction: with one last on a partition, its commit stopped short of the end, for good (the
        lag read 1 and the commit looked stalled). When everything received is settled and the client reads from
        further on, that is committed. INFO: not once a stop is asked for: what a poll fetched is then left unread,
        the client's position past it, and it was committed as markers, never answered (found in review)."""
        if self.s.dry_run or self.stopping.is_set():
            return
        for tp, read_to in self.tracker.read_to().items():
            if tp in self.needs_position:
                continue
            try:
                position = self.consumer.position(tp, **_bounded(self.consumer.position, 0.2))
            except Exception:  # unassigned meanwhile, or the client busy finding it: next round
                continue
            if isinstance(position, int) and position > read_to:
                self.tracker.skipped(tp, position - 1)

    # -- lag: what waits, from what is committed --
    def _lag_wanted(self):
        """Only when someone reads it (metrics, or the debug log): it asks the broker for end offsets."""
        debug = getattr(self.log, "level", LEVELS["debug"]) <= LEVELS["debug"]
        return debug or not isinstance(self.metrics, _NoMetrics)

    def _report_lag(self):
        """Per partition, the end offset (asked of the broker: a paused partition is not fetched, so what the
        consumer last saw of it is stale) minus the group's committed offset: every message not yet settled and
        committed, whether fetched, running, publishing or not read yet (issue 22: the old gauge, from what was
        fetched, read 0 while 32 of 40 events waited). With it: runs in flight and the oldest waiting age."""
        lags = {}
        try:
            # the partitions served: during a rebalance the client still lists those given up (their lag then
            # read as the whole partition, and stayed on after the other member took them: found by an attack)
            assigned = [tp for tp in self.consumer.assignment() if tp not in self.needs_position and self._serving(tp)]
            # the stall is what this watcher knows, and told even while the broker is away (the gauge froze at
            # its last value for as long as the broker was, and an outage of hours never fired the alert)
            self.tracker.waiting_turn(self._their_turn(assigned))
            stalled, heads = self.tracker.stalled(), self.tracker.heads()
            for tp in assigned:  # 0 when nothing waits here (it kept its last value through an outage)
                head, uncommitted = heads.get(tp, (None, False))
                self._gauge(self.metrics.watch_commit_stalled, tp,
                            stalled.get(tp, 0.0) if head is not None or uncommitted else 0.0)
            if assigned:
                ends = _offsets_call(self.consumer.end_offsets, assigned)
                committed = self.tracker.committed_offsets()
                unknown = [tp for tp in assigned if committed.get(tp) is None]
                starts = _offsets_call(self.consumer.beginning_offsets, unknown) if unknown else {}
                highest = self.tracker.highest_offsets()
                # INFO: each of these only ever falls short of the true end: the broker's answer (Tansu 0.6
                # answers with the last batch's first offset + 1), the last fetch's high watermark (stale while
                # paused), the next offset after the highest received. A paused partition is asked by a fetch
                furthest = {tp: max(known) for tp, known in (
                    (tp, [x for x in (ends.get(tp), self.consumer.highwater(tp), highest.get(tp)) if x is not None])
                    for tp in assigned) if known}
                paused = set(self.consumer.paused())
                for tp, end in self.end_probe.ends({tp: end for tp, end in furthest.items() if tp in paused}).items():
                    furthest[tp] = max(furthest[tp], end)
                for tp in assigned:
                    base = committed.get(tp)
                    base = starts.get(tp) if base is None else base
                    if tp in furthest and base is not None:
                        lags[tp] = max(0, furthest[tp] - base)
                        self._gauge(self.metrics.watch_lag, tp, lags[tp])
                        # how long work has waited here without a commit: 0 when nothing waits
                        self._gauge(self.metrics.watch_commit_stalled, tp, stalled.get(tp, 0.0) if lags[tp] else 0.0)
        except Exception as exc:  # the broker away: the lag keeps its last value, the next round asks again
            self.log("lag_unknown", level="debug", error=_one_line(exc))
        oldest = self.tracker.oldest_waiting()
        self.metrics.watch_in_flight(len(self.in_flight))
        self.metrics.watch_oldest_waiting(oldest)
        self.log("lag", level="debug", lag=",".join("%d=%d" % (tp.partition, n) for tp, n in sorted(
            lags.items(), key=lambda kv: kv[0].partition)) or None, in_flight=len(self.in_flight),
            backlog=len(self.backlog), oldest_waiting=oldest)

    def _serving(self, tp):
        return tp in self.tracker.partitions and tp not in self.revoking

    def _gauge(self, setter, tp, value):
        """A partition's gauge, set only while it is served: checked and set at once against _clear_gauges (a
        report begun before a rebalance set it again after the series was dropped)."""
        with self.gauges_lock:
            if self._serving(tp):
                setter(tp.topic, tp.partition, value)

    def _clear_gauges(self, tps):
        with self.gauges_lock:  # another member reports them now
            for tp in tps:
                self.metrics.watch_lag_clear(tp.topic, tp.partition)

    def _their_turn(self, assigned):
        """{partition: the last moment its oldest work merely waited its turn}, for those whose oldest work is not
        received yet, or queued ready to run: now, when a run slot is free (it starts, or is fetched, at once);
        else when a run last gave its slot back, so a backlog that drains is no stall, however large, and one
        behind runs that never end is (found by attack rounds: one event queued behind another partition's ten
        runs read as stalled for all ten). A stall is where the oldest work runs, waits to publish its result,
        waits for a claim held elsewhere, or waits for a commit."""
        heads = self.tracker.heads()
        with self.cond:
            queued = {(job.tp, job.event.offset): job for job in self.backlog}
            refused = {job.event.id for job in queued.values() if job.held_elsewhere}
        if refused and self.store is not None:  # refused once, perhaps held no longer (its holder died meanwhile):
            try:                                # asked again, not assumed (a stale refusal read as a stall)
                with self.store.patience(LOOP_STORE_PATIENCE):
                    refused = self.store.claimed_elsewhere(refused, self.owner, self.s.claim_lease)
            except Exception:  # the store failing: the refusal stands
                pass
        now = time.monotonic()
        with self.cond:
            since = now if len(self.in_flight) < self.s.max_concurrent else self.slot_freed_at
            running = {job.event.id: job.started_at or now for job in self.in_flight.values()}
            turn = {}
            for tp in assigned:
                head, uncommitted = heads.get(tp, (None, False))
                job = queued.get((tp, head))
                if head is None and not uncommitted:
                    turn[tp] = since
                elif job is not None and not job.delays and job.event.id not in refused and job.not_before <= now \
                        and not self.model_failures:  # waiting for the model server is a stall (round 17e: the
                    # alert never fired, whatever the wait). A copy of an id running here waits for that run,
                    # however many others end meanwhile
                    turn[tp] = running.get(job.event.id, since)
        return turn

    # -- reading: one partition's batch, each message, and crash-loops --
    def _handle_batch(self, tp, messages):
        """Read one partition's fetched messages in order. Before, the store is told which offsets are being
        read; a mark that another process left there means it died reading one of them. Those are then read one
        at a time, each marked first, and one begun more than watcher.max_attempts times is set aside unread:
        a message that crashes the watcher costs that message, not the partition (nor a restart loop)."""
        read_to = self.tracker.rewound(tp, messages[0].offset)
        if read_to is not None:
            self.log("offset_out_of_range", level="warn", topic=tp.topic, partition=tp.partition, offset=read_to,
                     start=messages[0].offset, reason="the client read the log again from an earlier offset (Kafka's "
                     "answer to an offset out of the log's range): its offsets start again from there")
            self.tracker.restart(tp, messages[0].offset)
        marks = self.store is not None and not self.s.dry_run
        consumer = "%s/%s/%d" % (self.s.group_id, tp.topic, tp.partition)
        single = messages[0].offset == messages[-1].offset
        left, counted = self._mark(consumer, messages[0].offset, messages[-1].offset) if marks else (None, 1)
        handled = 0
        for i, msg in enumerate(messages):
            if self.stopping.is_set():  # the rest is read again after a restart (never received: not committed)
                break
            handled += 1
            if left is not None and left[0] <= msg.offset <= left[1]:
                # a batch of one was begun, and counted, by the mark above (marked again, one crash counted twice)
                attempts = counted if single else self._mark(consumer, msg.offset, msg.offset)[1]
                if attempts > self.s.max_attempts:
                    self._set_aside(tp, msg, attempts - 1)
                    self._commit([tp])  # now: a crash before the next commit would read it again
                else:
                    self._handle(tp, msg)
                if i + 1 < len(messages):
                    self._mark(consumer, messages[i + 1].offset, messages[-1].offset)
                continue
            self._handle(tp, msg)
        if marks:
            try:
                with self.store.patience(LOOP_STORE_PATIENCE):
                    self.store.end_attempt(consumer, self.owner)
            except Exception as exc:
                self.log("store_failed", level="warn", error=_one_line(exc))
        return handled

    def _mark(self, consumer, first, last):
        try:
            with self.store.patience(LOOP_STORE_PATIENCE):
                return self.store.begin_attempt(consumer, first, last, self.owner)
        except Exception as exc:  # an unusable store costs the crash-loop guard, never a message
            self.log("store_failed", level="warn", error=_one_line(exc))
            return None, 1

    def _set_aside(self, tp, msg, crashes):
        po = self.tracker.get(tp)
        po.received(msg.offset)
        reason = ("set aside unread: the watcher stopped %d times while reading it (watcher.max_attempts %d)"
                  % (crashes, self.s.max_attempts))
        event_id = _guess_id(msg)
        self.log("set_aside", level="error", event_id=event_id, reason=reason, topic=msg.topic,
                 partition=msg.partition, offset=msg.offset)
        self.counts["set_aside"] += 1
        self._reject(tp, po, msg, event_id, reason, None, counted=True, now=True)

    def _unreadable(self, tp, first, last, reason, moved=True):
        """Records the client could not read (see guard_client), `first` to `last`: set aside unread with a
        dead-letter note of where they are, and committed past. `moved`: the client reads on after them by itself
        (a stand-in); else the position is moved past them (the backstop's failed batch), the only thing that
        makes the client let its dead batch go."""
        po = self.tracker.get(tp)
        po.received(last)
        reason = _unread_reason(first, last, reason)
        self.log("unreadable", level="error", reason=reason, topic=tp.topic, partition=tp.partition, offset=first,
                 **({"last_offset": last} if last != first else {}))
        self.counts["unreadable"] += last - first + 1
        with self.cond:
            self.settled += last - first  # each record of the range is one settled (--max-events); _reject adds one
        self._reject(tp, po, _Unread(tp.topic, tp.partition, first, last), None, reason, None, counted=True)
        if not moved:
            try:
                self.consumer.seek(tp, last + 1)
            except Exception as exc:  # unassigned meanwhile: whoever owns it now meets the record and does the same
                self.log("position_failed", level="warn", partition=tp.partition, error=_one_line(exc))
            self._commit([tp], timeout=self.s.publish_timeout)

    def _handle(self, tp, msg):
        unread = unread_stand_in(msg.headers)
        if unread is not None:
            return self._unreadable(tp, unread[0], msg.offset, unread[1])
        po = self.tracker.get(tp)
        po.received(msg.offset)
        try:
            self._read(tp, po, msg)
        except Exception as exc:  # a bug, or what nobody foresaw: this message is rejected, the partition goes on
            ev, exc = (exc.event, exc.cause) if isinstance(exc, _Unhandled) else (None, exc)
            if msg.offset not in po.pending or any(j.tp == tp and j.event.offset == msg.offset
                                                   for j in list(self.backlog)):
                self.log("error", level="error", error="%s: %s" % (type(exc).__name__, _one_line(exc)),
                         topic=msg.topic, partition=msg.partition, offset=msg.offset)
                return  # settled or queued already: the failure came after, and costs nothing more
            reason = "the watcher could not read this message: %s: %s" % (type(exc).__name__, _one_line(exc))
            self.log("rejected", level="error", reason=reason, topic=msg.topic, partition=msg.partition,
                     offset=msg.offset)
            # answered under the id it was read with, once read (a guess from its key or headers named another)
            try:
                self._reject(tp, po, msg, ev.id if ev is not None else _guess_id(msg), reason, ev)
            except Exception as again:  # the last resort: settled (_reject's finally), the partition goes on
                self.log("error", level="error", error="no result for this message either: %s: %s"
                         % (type(again).__name__, _one_line(again)), topic=msg.topic, partition=msg.partition,
                         offset=msg.offset)

    def _read(self, tp, po, msg):
        where = dict(topic=msg.topic, partition=msg.partition, offset=msg.offset)
        try:
            ev = decode_message(msg.topic, msg.partition, msg.offset, msg.key, msg.value, msg.headers,
                                self.s.format, self.s.max_message_bytes, getattr(msg, "timestamp", None))
        except BadMessage as exc:
            self.log("rejected", level="warn", event_id=exc.event_id, reason=exc.reason, **where)
            self._reject(tp, po, msg, exc.event_id, exc.reason, None)
            return
        try:
            self._admit(tp, po, msg, ev)
        except Exception as exc:
            raise _Unhandled(ev, exc)

    def _admit(self, tp, po, msg, ev):
        """A message read: skipped, rejected, printed (a dry run) or queued to run."""
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
                    "goal": clipped(ev.plan.goal, FIELD_MAX_BYTES["goal"])[0],
                    "instructions": len(ev.plan.instructions)}
            from xzatoma_store import redact_data  # the goal is the event's text: a credential in it is not shown
            try:
                self.out.write(json.dumps(redact_data(line), ensure_ascii=True) + "\n")
                self.out.flush()
            except (OSError, ValueError, AttributeError) as exc:
                # `| head -1` went, or stdout was closed (None): never the message's fault (each later one was
                # "rejected", attack round 15b)
                self.log("output_closed", level="warn", error=_one_line(exc))
                self.request_stop("the dry run's output was closed")
                return
            self.counts["would_run"] += 1
            self.metrics.watch_event("dry_run")
            return self._settle(po, ev.offset)
        job = Job(ev, po, message=Kept(msg, self.s.max_request_size))
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
            if po.settled(offset):
                self.settled += 1
            self.cond.notify_all()

    def _reject(self, tp, po, msg, event_id, reason, ev, counted=False, now=False):
        """Bad input never blocks a partition. With its id known, a rejected event is answered as a run is (a job:
        claimed, recorded, its result published or kept until it can be, never answered twice by watchers sharing
        the store); without, a dead-letter copy. The offset is settled whatever happens on the way. `now`: a
        message that stopped the watcher as it read it is answered and settled here, at once (a few tries), so
        that its offset is committed before anything else can stop the watcher again and have it read once more."""
        queued = False
        try:
            if not counted:
                self.counts["rejected"] += 1
            self.metrics.watch_event("rejected")
            if not self.s.dry_run:
                if event_id and ev is None:
                    ev = Event(id=event_id, topic=msg.topic, partition=msg.partition, offset=msg.offset)
                if event_id and not now:
                    job = Job(ev, po, message=Kept(msg, self.s.max_request_size), rejection=reason)
                    job.tp = tp
                    with self.cond:
                        self.backlog.append(job)
                    queued = True
                else:
                    if event_id:
                        self._answer_now(ev, reason)
                    self._dead_letter(msg, reason)
        finally:
            if not queued:
                self._settle(po, msg.offset)

    def _answer_now(self, ev, reason):
        """A message that stopped the watcher as it read it, answered at once under its claim and the store's fence,
        as every result is: not at all when its id is answered already or runs in another watcher sharing the store
        (found by an attack round: a set-aside message got a second result). A store that cannot be used does not
        keep it from being answered: it must be settled now."""
        with self.cond:  # running here (a copy): that run answers it, and its claim is not ours to release
            running = ev.id in self.running_ids
            self.running_ids.add(ev.id)
        if running:
            self.log("duplicate", reason="running in this watcher", **ev.log_fields())
            return
        try:
            self._answer_claimed(ev, reason)
        finally:
            with self.cond:
                self.running_ids.discard(ev.id)
                self.cond.notify_all()

    def _answer_claimed(self, ev, reason):
        claimed, record = None, None
        if self.store is not None:
            try:
                claimed, _, record = self.store.claim_event(ev.id, self.owner, self.s.claim_lease)
            except Exception as exc:
                self.log("store_failed", level="warn", error=_one_line(exc), **ev.log_fields())
        try:
            if ev.id in self.unmarked or claimed is False or (record is not None and (
                    record.get("published_at") or not record.get("result"))):
                self.log("duplicate", reason="answered already, or running in another watcher", **ev.log_fields())
                return
            if record is not None:
                result = json.loads(record["result"])  # finished before a crash and never published: that one
            else:
                result = result_event(ev, {"status": "rejected", "error": reason}, self.source, self.s.answer_limit,
                                      self._budget(ev.id))
                if claimed and not self._store_call(self.store.record_event, ev, ev.id, None, "rejected",
                                                    result=json.dumps(result), metadata=json.dumps(ev.metadata()),
                                                    owner=self.owner, lease=self.s.claim_lease):
                    return self._claim_lost(ev)
            if self._publish(self.s.output_topic, ev.id.encode("utf-8"), _encode(result), RESULT_HEADERS, "result",
                             give_up_after=3) is None and claimed:
                self._mark_published(ev)
                claimed = False
        finally:
            if claimed:
                try:
                    self.store.release_claim(ev.id, self.owner)
                except Exception:  # held while this process lives, then free: nothing is lost
                    pass

    def _store_call(self, method, ev, *args, **kw):
        """A store write that must not stop a message being answered now: True when done, and unless it said
        False; a failure is logged."""
        try:
            return method(*args, **kw) is not False
        except Exception as exc:
            self.log("store_failed", level="warn", error=_one_line(exc), **ev.log_fields())
            return True

    def _rejected(self, job):
        """A rejected event's answer: its result recorded, its input copied to the dead-letter topic."""
        result = result_event(job.event, {"status": "rejected", "error": job.rejection}, self.source,
                              self.s.answer_limit, self._budget(job.event.id))
        try:
            self._record(job, None, "rejected", result)
        except RecordFailed as exc:
            exc.copy = job.rejection  # copied once it is recorded
            raise
        self._dead_letter(job.message, job.rejection)
        return result, "rejected"

    def _dead_letter(self, msg, reason):
        """A copy of the message, with why and where from, on --dead-letter-topic (when given). A copy that would
        not fit under max_request_size with the added headers is sent cut, and says so."""
        if not self.s.dead_letter_topic or self.s.dry_run or msg is None:
            return
        origin = next((value for name, value in msg.headers or () if name == "xzatoma_origin"), None)
        if origin is not None:  # a copy is not copied again: two watchers, each's copies the other's input, loop
            self.log("dead_letter_skipped", level="warn", reason="it is a dead-letter copy already",
                     origin=bounded_text(origin.decode("utf-8", "replace") if isinstance(origin, bytes)
                                         else str(origin), 300)[0], topic=msg.topic,
                     partition=msg.partition, offset=msg.offset)
            return
        # the reason redacted, as the log's and the result's are (a token quoted in a rejection went out whole)
        ours = [("xzatoma_reason", clipped(reason, 1000)[0].encode("utf-8")),
                ("xzatoma_origin", (getattr(msg, "origin", None) or
                                    "%s:%s:%s" % (msg.topic, msg.partition, msg.offset)).encode())]
        headers = _plain_headers(msg.headers)
        value, key = msg.value, msg.key
        key_size = getattr(msg, "key_size", None) or len(key or b"")
        if key is not None and len(key) > ID_MAX_BYTES * 4:
            key = key[:ID_MAX_BYTES * 4]
        if key is not None and key_size > len(key):  # said, as a cut value is (a 5,000-byte key went out cut
            ours.append(("xzatoma_key_truncated", str(key_size).encode()))  # to 4,096 silently, round 17b)
        room = self.s.max_request_size - RECORD_OVERHEAD - len(key or b"") - _headers_size(ours)
        if _headers_size(headers) > room // 4 or getattr(msg, "headers_dropped", 0):
            ours.append(("xzatoma_headers_dropped", str(len(headers) or msg.headers_dropped).encode()))
            headers = []
        room -= _headers_size(headers) + 64  # the note of a cut (and of headers dropped)
        size = getattr(msg, "size", None) or len(value or b"")
        if value is not None and size > room:
            ours.append(("xzatoma_truncated", str(size).encode()))
            value = value[:max(0, room)]
        error = self._publish(self.s.dead_letter_topic, key, value, headers + ours, "dead_letter", give_up_after=3)
        if error is None:
            self.counts["dead_lettered"] += 1

    def _budget(self, event_id):
        """Bytes a result keyed by `event_id` may take: the producer's max_request_size less the record's frame."""
        return self.s.max_request_size - RECORD_OVERHEAD - len((event_id or "").encode("utf-8"))

    # -- running --
    def _start_runs(self):
        if self.s.dry_run:
            return
        with self.cond:
            rotated = 0
            now = time.monotonic()
            # the model server away: no run asks it until it may be back, then one at a time; a rejection or a
            # stored result to publish needs no model, and goes on (round 17e)
            model_wait = self.model_failures and (now < self.model_back_at or any(
                _asks_model(job) for job in self.in_flight.values()))
            while self.backlog and len(self.in_flight) < self.s.max_concurrent and not self.stopping.is_set() \
                    and rotated < len(self.backlog):
                job = self.backlog.popleft()
                ev = job.event
                if ev.id in self.running_ids or job.not_before > now or (model_wait and _asks_model(job)):
                    self.backlog.append(job)
                    rotated += 1
                    continue
                rotated = 0
                model_wait = model_wait or (self.model_failures and _asks_model(job))  # the one that tries it
                self.in_flight[(job.tp, ev.offset)] = job
                job.started_at = now
                self.running_ids.add(ev.id)
                self.metrics.watch_in_flight(len(self.in_flight))
                self.executor.submit(self._work, job)

    def _ready_or_many(self):
        """Whether a waiting event could start now, waits to publish its result (the output topic refuses: no
        more is run meanwhile), or too many wait. One that waits for a claim held elsewhere (a watcher frozen
        mid-run keeps it as long as it lives) or for its id running here stopped fetching on every partition while
        it waited (found by an attack round); up to HELD_MAX may wait so while others run."""
        now = time.monotonic()
        with self.cond:
            if len(self.backlog) >= BACKLOG_MAX or any(
                    job.delays or (job.not_before <= now and job.event.id not in self.running_ids)
                    for job in self.backlog) or sum(map(_message_bytes, self.backlog)) >= BACKLOG_BYTES:
                return True
            return len({job.event.id for job in self.backlog}) >= HELD_MAX + self.s.max_concurrent  # ids, not
            # copies: 40 copies of one held id (a producer retrying) stopped every partition

    def _flow_control(self):
        """Pause fetching while the backlog is full, so memory stays bounded and the group sees us alive."""
        try:
            assigned = self.consumer.assignment()
            full = self.stopping.is_set() or len(self.in_flight) >= self.s.max_concurrent or self._ready_or_many()
            if self.s.dry_run:
                full = self.stopping.is_set()
            if self.s.max_events:  # used up: nothing more is taken, so nothing more is fetched (it spun)
                full = full or self._held() >= self.s.max_events
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

# ---- The watcher, one event: claim → run (or reject) → record → publish → release; then rebalances, stop ----

    def _work(self, job):
        """One event, start to end: claim its id, run it (or publish what a crashed run left, or set it aside),
        deliver the result, release the claim. Whatever goes wrong ends in a result and the offset settled."""
        ev = job.event
        settle, again, step = True, False, None
        try:
            step = self._claim(job)
            if step == "held":
                settle = again = True
                return
            if step == "duplicate":
                self.counts["duplicate"] += 1
                self.metrics.watch_event("duplicate")
                if job.rejection is not None and job.answered is not None and not self._answered_from(job):
                    # another bad message under an answered id: no result (the id has one), but not lost either
                    self._dead_letter(job.message, "%s; its id is answered already, so it has no result"
                                      % job.rejection)
                return
            fresh = job.unrecorded  # a result that waited for the store: recorded now, then published
            if step == "republish":  # finished before a crash, never published: publish that result again
                result, status = job.stored, job.stored.get("data", {}).get("status", "completed")
                if fresh:
                    self._record(job, result["data"].get("conversation_id"), status, result)
                    job.unrecorded = False
                    if job.copy_pending is not None:
                        self._dead_letter(job.message, job.copy_pending)
                        job.copy_pending = None
                else:
                    self.log("republish", status=status, **ev.log_fields())
            elif job.rejection is not None:
                result, status = self._rejected(job)
            elif step == "set_aside":
                result, status = self._set_aside_run(job)
            else:
                result, status = self._execute(job)
                if result is None:
                    settle = False  # interrupted by us: not committed, redelivered and run to completion later
                    # or its claim lapsed, or the model server is away: tried again here
                    again = (job.lease_lost or status == "model_away") and not self.stopping.is_set()
                    return
            if not self._deliver(job, result, status):
                # nothing could be published (the output topic refuses everything, or the grace period ended):
                # kept, and tried again later (the stored result is published then, nothing is run again)
                settle, again = False, not self.hard_stop.is_set()
                job.stored, job.delays = result, job.delays + 1
                return
            if job.rejection is not None:  # logged and counted when it was read
                return
            if self.xzepr is not None and (step != "republish" or job.delays or fresh):  # ran here: end posted
                self._xzepr(ev, status, result)
            self.log("finished", status=status, conversation_id=result["data"].get("conversation_id"),
                     duration=result["data"].get("duration_seconds"), result_id=result["id"], **ev.log_fields())
            self.counts[status] += 1
            self.metrics.watch_event(status)
        except ClaimLost:
            self._claim_lost(ev)
        except RecordFailed as exc:
            settle = False
            if job.lease_lost and not self.stopping.is_set():  # kept, and recorded once it is claimed again
                self._record_failed(job, exc)
                again = True
            else:  # stopped with the store still failing: nothing is out, so it runs again where it is redelivered
                self.log("interrupted", reason="its result could not be recorded before its run was stopped (a stop "
                         "or its partition gone)", **ev.log_fields())
                if job.rejection is None:  # a rejected message was counted as such when it was read
                    self.counts["interrupted"] += 1
                    self.metrics.watch_event("interrupted")
        except Exception as exc:  # a bug must cost this event, never the watcher nor the partition
            settle = self._fail(job, exc)
            again = not settle and not self.hard_stop.is_set()
        finally:
            if job.claimed:  # not ended with its published result (interrupted, failed, or nothing published)
                try:
                    self.store.release_claim(ev.id, self.owner)
                except Exception as exc:  # it would hold the id while this process lives: tried again
                    self.log("store_failed", level="warn", error=_one_line(exc), event_id=ev.id, retry=True)
                    self.chores.append((ev.id, self.store.release_claim))
                job.claimed = False
            with self.cond:
                self.in_flight.pop((job.tp, ev.offset), None)
                if not job.held_elsewhere:  # a claim refused, or the store failing, is no run's turn ending: it
                    self.slot_freed_at = time.monotonic()  # restarted every other partition's stall (round 12)
                self.running_ids.discard(ev.id)
                if again:
                    settle = False
                    if job.lease_lost:  # stopped as its claim lapsed: a run afresh, when it is claimed again
                        job.lease_lost, job.cancel = False, threading.Event()
                    if job.tp not in self.revoking and job.tp in self.tracker.partitions:
                        tries = job.delays or job.store_failures
                        job.not_before = time.monotonic() + (self._backoff(tries) if tries else 0.5)
                        for other in self.backlog:  # copies of its id would get the same answer meanwhile
                            if other.event.id == ev.id:
                                other.not_before = max(other.not_before, job.not_before)
                        self.backlog.append(job)
                if settle:
                    if job.po.settled(ev.offset):
                        self.settled += 1
                self.metrics.watch_in_flight(len(self.in_flight))
                self.cond.notify_all()
            self._start_runs()  # the next waiting event starts now, not when the loop's poll returns

    def _record_failed(self, job, exc):
        """The store could not record the result before its claim lapsed: the result waits in memory, unpublished,
        and the event is tried again, backing off (claimed again, then recorded, then published)."""
        job.stored, job.unrecorded = exc.result, True
        if exc.copy is not None:
            job.copy_pending = exc.copy
        job.store_failures += 1
        job.held_elsewhere = True

    def _claim_lost(self, ev):
        self.log("claim_lost", level="warn", reason="another watcher sharing the store answered this event or "
                 "holds it (this one stalled past watcher.claim_lease, or could not claim it): its result is the one "
                 "published", **ev.log_fields())
        self.counts["claim_lost"] += 1
        self.metrics.watch_event("claim_lost")

    def _claim(self, job):
        """What to do with this event id, decided in one transaction of the shared store: 'run', 'duplicate'
        (finished and published), 'republish' (finished, never published), 'held' (another watcher process
        runs it now: try again shortly), or 'set_aside' (claimed by watchers that died running it too often)."""
        ev = job.event
        if self.store is None:
            return "run" if job.stored is None else "republish"
        if ev.id in self.unmarked:  # its result is out; the store is told so by a chore (found by an attack round:
            self.log("duplicate", status="published", **ev.log_fields())  # a copy published it once more)
            where = dict(zip(("topic", "partition", "offset"), self.unmarked.get(ev.id) or ()))
            job.answered = {"metadata": json.dumps(where)}  # which message it answered (_answered_from)
            return "duplicate"
        try:
            claimed, attempts, record = self.store.claim_event(ev.id, self.owner, self.s.claim_lease)
        except Exception as exc:  # a locked or failing database: tried again, backing off, for as long as it fails
            # INFO: never answered without its claim. Given up after 5 tries, a "failed" result went out while
            # another watcher sharing the store ran the event (a backup held the database's lock for minutes):
            # two results, and no record of the first. The partition waits instead, and its stall shows.
            job.store_failures += 1
            job.held_elsewhere = True
            self.log("store_failed", level="error" if job.store_failures >= 5 else "warn", error=_one_line(exc),
                     tries=job.store_failures, **ev.log_fields())
            return "held"
        job.claimed, job.held_elsewhere = claimed, not claimed
        if record is not None and (record.get("published_at") or not record.get("result")):
            job.answered = record
            self.log("duplicate", status=record.get("status"), conversation_id=record.get("conversation_id"),
                     **ev.log_fields())
            return "duplicate"
        if not claimed:
            if job.not_before == 0.0:
                self.log("claimed_elsewhere", **ev.log_fields())
            return "held"
        if record is not None and record.get("status") in RESULT_TYPES:
            job.stored = json.loads(record["result"])
            return "republish"
        if job.stored is not None:  # a result this watcher could not publish (and could not record) before
            return "republish"
        if attempts > self.s.max_attempts:
            job.attempts = attempts
            return "set_aside"
        return "run"

    @staticmethod
    def _answered_from(job):
        """Whether the stored answer of the job's id was for this very message (read again after a restart: its
        dead-letter copy was made then), not another one under the same id."""
        try:
            where = json.loads(job.answered.get("metadata") or "{}")
            ev = job.event
            return (where.get("topic"), where.get("partition"), where.get("offset")) == (ev.topic, ev.partition,
                                                                                        ev.offset)
        except (ValueError, AttributeError):
            return True  # not known: no second copy

    def _set_aside_run(self, job):
        ev = job.event
        reason = ("set aside: the watcher stopped %d times while running it (watcher.max_attempts %d)"
                  % (job.attempts - 1, self.s.max_attempts))
        self.log("set_aside", level="error", reason=reason, **ev.log_fields())
        self.counts["set_aside"] += 1
        result = result_event(ev, {"status": "failed", "error": reason}, self.source, self.s.answer_limit,
                              self._budget(ev.id))
        try:
            self._record(job, None, "failed", result)
        except RecordFailed as exc:
            exc.copy = reason
            raise
        self._dead_letter(job.message, reason)
        return result, "failed"

    def _record(self, job, conversation_id, status, result):
        """Store the result before it is published, behind the store's fence: ClaimLost when another watcher
        claims the event (it took it over) or has published its result; that one is what goes out."""
        ev = job.event
        if self.store is not None:
            tries = 0
            while True:
                # INFO: a store that fails here (full, locked, read-only) is waited for as the run was: its claim
                # held and renewed, its partition's revoke and a stop's grace waiting on it. Put back in the queue,
                # the claim went and another watcher ran the event again, and a rebalance or a stop dropped the
                # finished run (attack round 15c). Only a cancel (the grace over, the partition gone, the claim
                # lapsing) gives up: RecordFailed, nothing published.
                try:
                    fenced = self.store.record_event(ev.id, conversation_id, status, result=json.dumps(result),
                                                     metadata=json.dumps(ev.metadata()), owner=self.owner,
                                                     lease=self.s.claim_lease)
                    break
                except Exception as exc:
                    tries += 1
                    self.log("store_failed", level="error" if tries >= 5 else "warn", error=_one_line(exc),
                             tries=tries, waiting="its result, to be recorded before it is published",
                             **ev.log_fields())
                    if job.cancel.wait(self._backoff(tries)) or self.hard_stop.is_set():
                        raise RecordFailed(result, exc)
            if not fenced:
                job.claimed = False
                raise ClaimLost(ev.id)

    def _deliver(self, job, result, status):
        """Publish the result, then mark it published (ending the claim). A result the broker will not take (it
        says it never will, or it refused it watcher.publish_attempts times) is replaced by a small failed result,
        and the input is copied to the dead-letter topic: one result always goes out. False when not even that
        could be published (the output topic refuses everything, or the grace period ended): the stored result
        stays, to be published on the next try."""
        ev = job.event
        key = ev.id.encode("utf-8")
        error = self._publish(self.s.output_topic, key, _encode(result), RESULT_HEADERS, "result",
                              give_up_after=self.s.publish_attempts)
        if error is not None and not self.hard_stop.is_set():
            data = result.get("data") if isinstance(result.get("data"), dict) else {}
            reason = "the %s result could not be published: %s" % (status, error)
            replacement = result_event(ev, {"status": "failed", "error": reason,
                                            "conversation_id": data.get("conversation_id")},
                                       self.source, self.s.answer_limit, self._budget(ev.id))
            error = self._publish(self.s.output_topic, key, _encode(replacement), RESULT_HEADERS, "result")
            if error is None:
                self.log("result_replaced", level="error", status=status, reason=reason, **ev.log_fields())
                self.counts["result_replaced"] += 1
                self.metrics.watch_event("result_replaced")
                try:
                    self._record(job, data.get("conversation_id"), "failed", replacement)
                except RecordFailed as exc:  # out already: the first result's record stands, marked below
                    self.log("store_failed", level="warn", error=_one_line(exc.error), **ev.log_fields())
                self._dead_letter(job.message, reason)
        if error is not None:
            return False
        if self.store is not None:
            self._mark_published(ev)
            job.claimed = False
        return True

    def _mark_published(self, ev):
        """The store told the event's result is out, its claim ending with it; failing, a chore tries again and the
        id is held until then (released at once, the next claimant published the stored result once more: found by
        attack round 12)."""
        try:
            self.store.event_published(ev.id, self.owner)
        except Exception as exc:
            self.log("store_failed", level="warn", error=_one_line(exc), retry=True, **ev.log_fields())
            self.unmarked[ev.id] = (ev.topic, ev.partition, ev.offset)
            self.chores.append((ev.id, self.store.event_published))

    def _fail(self, job, exc):
        """An error nobody foresaw while handling one event: a failed result and a dead-letter copy, then the
        offset settled. Returns whether to settle (False only when the grace period ended first)."""
        ev = job.event
        reason = "the watcher failed while handling this event: %s: %s" % (type(exc).__name__, _one_line(exc))
        self.log("error", level="error", error=reason, **ev.log_fields())
        self.counts["error"] += 1
        self.metrics.watch_event("error")
        try:
            result = result_event(ev, {"status": "failed", "error": reason}, self.source, self.s.answer_limit,
                                  self._budget(ev.id))
            try:
                self._record(job, None, "failed", result)
            except RecordFailed as exc:  # never out without its record: it waits for the store
                exc.copy = reason
                self._record_failed(job, exc)
                return False
            self._dead_letter(job.message, reason)
            job.stored, job.delays = result, job.delays + 1  # what is tried again when nothing can be published
            return self._deliver(job, result, "failed")
        except ClaimLost:
            self._claim_lost(ev)
            return True
        except Exception as again:  # the last resort: this event goes without a result, the partition goes on
            self.log("error", level="error", error="no result for this event either: %s: %s"
                     % (type(again).__name__, _one_line(again)), **ev.log_fields())
            return True

    def _execute(self, job):
        """Run the plan; (result event, status), or (None, None) when interrupted by us (redelivered later)."""
        ev = job.event
        self.log("started", goal=clipped(ev.plan.goal, 200)[0], **ev.log_fields())  # redacted before the cut
        if self.xzepr is not None:
            self._xzepr(ev, "started", None)
        start = time.monotonic()
        try:
            outcome = self.run_plan(job)
        except Exception as exc:
            outcome = {"status": "failed", "error": "%s: %s" % (type(exc).__name__, _one_line(exc))}
        if outcome is None:
            outcome = {}
        if not isinstance(outcome, dict):
            outcome = {"status": "failed", "error": "the run returned %s, not an outcome" % type(outcome).__name__}
        duration = round(time.monotonic() - start, 3)
        if outcome.get("model_unreachable"):  # never answered so: run again, here or where it is redelivered
            self._model_away(job, outcome.get("error"))
            return None, "model_away"
        if self.model_failures:
            with self.cond:
                self.model_failures = 0
            self.log("model_available", **ev.log_fields())
        outcome.setdefault("duration_seconds", duration)
        self.metrics.watch_run(duration)
        status = result_status(outcome.get("status"))
        if status == "interrupted" and job.cancel.is_set():
            # stopped by shutdown or a lost partition: recorded as interrupted in the conversation, offset not
            # committed, so the event is redelivered and runs to completion later
            self.log("interrupted", conversation_id=outcome.get("conversation_id"), duration=duration,
                     **ev.log_fields())
            self.counts["interrupted"] += 1
            self.metrics.watch_event("interrupted")
            # nothing published: the run after redelivery publishes the event's one result (an "informational"
            # interrupted result here made two results for one event)
            return None, None
        result = result_event(ev, outcome, self.source, self.s.answer_limit, self._budget(ev.id))
        self._record(job, outcome.get("conversation_id"), status, result)
        return result, status

    def _model_away(self, job, error):
        """Nothing listens where the model server should be (a local server restarting, down): the event is not
        answered but run again once the server is back, and no other run starts meanwhile, then one at a time,
        backing off. Each run had failed in a millisecond, and the whole backlog was answered `failed` and
        committed during a restart of the server (attack round 17c). The wait shows as the stall it is."""
        with self.cond:
            self.model_failures += 1
            wait = self._backoff(self.model_failures)
            self.model_back_at = time.monotonic() + wait
        self.counts["model_unavailable"] += 1
        self.log("model_unavailable", level="warn" if self.model_failures < 5 else "error", error=error,
                 retry_in=wait, **job.event.log_fields())

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
        except Exception as exc:  # XZepr is told what happened, or not: it never decides whether a plan runs
            self.counts["xzepr_failed"] += 1
            self.metrics.watch_event("xzepr_failed")
            error = str(exc) if isinstance(exc, XzeprError) else "%s: %s" % (type(exc).__name__, _one_line(exc))
            self.log("xzepr_failed", level="error", name=name, error=error, **ev.log_fields())

    def _publish(self, topic, key, value, headers, what, give_up_after=None):
        """Send and wait for the broker's ack; retry with backoff until it works, the grace period ends,
        `give_up_after` attempts fail, or the error says the record can never be taken (too large, invalid, not
        allowed: KafkaError.retriable is False). Returns None when published, else why not (one line).
        INFO: a send whose ack is late may be on its way, or written already (a frozen broker reads it when it
        wakes): it is waited for, never sent again nor given up on, or one event got two results (seen: a broker
        restarted mid-stream; one frozen with a result in flight). Only an answer counts as a failed attempt:
        its producer gives one within 3 publish timeouts (_producer_limits). A hard stop ends the wait (the
        result stays stored, to be published after a restart). `give_up_after` counts refusals, answers of the
        broker: a broker that answers nothing for 17 minutes had a completed run's result replaced by `failed`
        after 20 timeouts (attack round 17c); it is waited for, its stall shown, as long as it is silent."""
        attempt, refused, future, sent_at, stale, error = 0, 0, None, 0.0, None, None
        while True:
            if stale is not None:  # INFO: its last send expired unanswered, and no new producer could be made (the
                # broker still silent): sent again only through a new one, once the broker answers. Sent again
                # through the old one at every expiry, a broker frozen for 110 s wrote the result twice, and longer
                # silences more times (attack round 17e)
                self._renew_producer(stale)
                if self.producer is stale:
                    if self.hard_stop.is_set():
                        self.log("publish_failed", level="error", what=what, topic=topic, attempts=attempt, error=error)
                        return error
                    self.hard_stop.wait(self._backoff(attempt))
                    continue
                stale = None
            producer = self.producer
            try:
                if future is None:
                    future, sent_at = producer.send(topic, key=key, value=value, headers=headers), time.monotonic()
                future.get(timeout=self.s.publish_timeout)
                return None
            except Exception as exc:  # KafkaError, or a timeout while the broker is away
                pending = future is not None and not future.is_done
                if pending and not self.hard_stop.is_set() and \
                        time.monotonic() - sent_at < 4 * self.s.publish_timeout:
                    self.log("publish_waiting", level="warn", what=what, topic=topic, error=_one_line(exc))
                    continue
                # it failed (or was never sent): the next try sends it again. One its producer gave up on after
                # delivery_timeout_ms, or never answered for (a producer whose renewal failed while the broker
                # was frozen 20 s answered nothing after it woke: the partition stopped), is not tried through
                # that producer again: a broker that restarted empty left one that never delivered another
                expired = future is not None and not self.hard_stop.is_set() and \
                    (pending or isinstance(exc, self.kafka.errors.KafkaTimeoutError))
                if future is not None and self.producer is not producer and not _refused_for_good(self.kafka, exc):
                    # its producer was renewed for another record's sake, and closed by force under it: the broker
                    # may have it (sent again at once, one event got two results, attack round 12). As a late
                    # ack, it is waited out before it goes again
                    left = sent_at + 4 * self.s.publish_timeout - time.monotonic()
                    if left > 0 and not self.hard_stop.is_set():
                        self.log("publish_waiting", level="warn", what=what, topic=topic, error=_one_line(exc),
                                 reason="its producer was renewed under it")
                        self.hard_stop.wait(left)
                future, error = None, _one_line(exc)
                attempt += 1
                refused += not expired
                permanent = _refused_for_good(self.kafka, exc)
                if (attempt % 3 == 0 or expired) and not self.hard_stop.is_set():
                    self._renew_producer(producer)
                    stale = producer if expired and self.producer is producer else None
                if permanent or self.hard_stop.is_set() or (give_up_after and refused >= give_up_after):
                    self.log("publish_failed", level="error", what=what, topic=topic, attempts=attempt, error=error)
                    return error
                delay = self._backoff(attempt)
                self.log("publish_retry", level="warn", what=what, topic=topic, attempt=attempt, retry_in=delay,
                         error=error)
                self.hard_stop.wait(delay)

    def _renew_producer(self, failed):
        """A producer can be left in a state it does not leave (a broker that forgot its producer id after a
        restart): after repeated failures, publish through a new one. The old one is closed by force: kafka-python
        3's close(timeout) raises when its flush times out, and left it running, to deliver late."""
        with self.producer_lock:
            if self.producer is not failed:
                return  # another worker renewed it already (and closed it)
            try:
                self.producer = self.kafka.KafkaProducer(**self.producer_opts)
            except Exception as exc:
                self.log("producer_failed", level="warn", error=_one_line(exc))
                return
        _close_by_force(failed)
        self.log("producer_renewed", level="warn")

    # -- committing --
    def _commit(self, tps=None, timeout=None):
        """Commit what is settled; `timeout` (seconds) bounds the wait where the client allows it (a frozen
        broker held a stopping watcher in each commit for 30 s: SIGTERM with a 2 s grace exited after 70 s)."""
        if self.s.dry_run:
            return
        points = self.tracker.commit_points(tps)
        if not points:
            return
        try:
            self.consumer.commit(_offsets(self.kafka, points), **_bounded(self.consumer.commit, timeout))
        except Exception as exc:  # CommitFailedError in a rebalance, or the broker away: retried next round
            self.log("commit_failed", level="warn", error=_one_line(exc))
            return
        self.tracker.committed(points)
        for tp, offset in sorted(points.items(), key=lambda kv: kv[0].partition):
            self.log("committed", topic=tp.topic, partition=tp.partition, offset=offset)

    # -- rebalances (called by the consumer's IO thread) --
    def _revoke(self, revoked):
        """_revoking, waited for on this thread (kafka-python 2 calls it inside poll(): its heartbeat thread goes
        on meanwhile). The offsets to commit."""
        steps = self._revoking(revoked)
        while True:
            try:
                wait = next(steps)
            except StopIteration as done:
                return done.value
            with self.cond:
                self.cond.wait(wait)

    def _revoking(self, revoked):
        """Give up partitions: drop their events not started, let their runs finish within the grace period (or
        what is left of the shutdown's), then interrupt the rest. A generator: it yields how long to wait before it
        looks again, and returns the offsets to commit.
        INFO: kafka-python 3 calls the listener on its IO loop, which sends the heartbeats too: waiting there as
        one call stopped them, the member was evicted mid-run and its event ran twice (attack round 12). Its async
        listener awaits each wait instead (_listener)."""
        revoked = set(revoked)
        deadline = time.monotonic() + self.s.shutdown_grace
        if self.stop_deadline is not None:  # a rebalance while stopping starts no grace period of its own
            deadline = min(deadline, self.stop_deadline)
        self.rebalancing = True  # never idle while the group is still deciding (the clock restarts at assignment)
        with self.cond:
            # events fetched but not started are dropped (their offsets stay unsettled, so the commit stops before
            # them): whoever owns the partition next, perhaps us again, reads on from the committed offset
            self.revoking |= revoked
            self.backlog = collections.deque(j for j in self.backlog if j.tp not in revoked)

        def mine():
            with self.cond:
                return [j for (tp, _), j in self.in_flight.items() if tp in revoked]
        while mine() and time.monotonic() < deadline and not self.hard_stop.is_set():
            yield min(0.2, max(0.01, deadline - time.monotonic()))
        stragglers = mine()
        for job in stragglers:
            job.cancel.set()
        # stopping, the shutdown waited for them already: those left are stuck (a store locked by another process)
        end = time.monotonic() + (0 if self.hard_stop.is_set() else 10)
        while mine() and time.monotonic() < end:
            yield 0.2
        with self.cond:
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
        with self.cond:  # settled, never committed (the commit failed): they count for nothing, as when lost
            uncommitted = self.tracker.forget(revoked)
            if not self.s.dry_run:  # a dry run commits nothing: what it printed counts
                self.settled -= uncommitted
        self._clear_gauges(revoked)

    def _assigned(self, assigned):
        # The consumer keeps its fetch position for a partition it gets back, past events we dropped unstarted (or
        # past the end of a log a broker lost). Hold them until the loop has moved them to the committed offset.
        with self.cond:
            self.needs_position |= set(assigned)
            self.revoking -= set(assigned)
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
            self.revoking |= lost
            self.backlog = collections.deque(j for j in self.backlog if j.tp not in lost)
            # settled, never committed: whoever owns the partitions now reads them again, and --max-events counts
            # what is settled and committed (it stopped with nothing committed after a lost partition)
            uncommitted = self.tracker.forget(lost)
            if not self.s.dry_run:  # a dry run commits nothing: what it printed counts
                self.settled -= uncommitted
        self._clear_gauges(lost)
        self.log("lost", level="warn", partitions=_tps(lost), uncommitted=uncommitted or None)

    # -- stopping --
    def _shutdown(self):
        self.stopping.set()
        try:
            self._flow_control()  # pause everything: no new events
        except Exception:
            pass
        if self.store is not None and self.in_flight and not self.s.dry_run:
            try:  # a kill after the grace period is then no crash of theirs (Store.stopping_claims)
                with self.store.patience(LOOP_STORE_PATIENCE):
                    self.store.stopping_claims(self.owner)
                self.log("runs_stopping", running=len(self.in_flight))
            except Exception as exc:
                self.log("store_failed", level="warn", error=_one_line(exc))
        if self.stop_deadline is None:  # stopped by itself (--max-events, --idle-exit), not by a signal
            self.stop_deadline = time.monotonic() + self.s.shutdown_grace
        deadline = self.stop_deadline
        while self.in_flight and time.monotonic() < deadline and not self.hard_stop.is_set():
            self._commit(timeout=max(0.1, deadline - time.monotonic()))
            try:
                self.consumer.poll(timeout_ms=100)  # paused: keeps the group membership, returns nothing
            except Exception:
                time.sleep(0.1)
        with self.cond:
            for job in self.in_flight.values():
                job.cancel.set()
            # a cancelled run ends within a second (its model request cut, its command stopped); one that does not
            # is stuck (a store another process holds locked): its event is read again after the restart anyway
            end = time.monotonic() + 5
            while self.in_flight and time.monotonic() < end:
                self.cond.wait(0.2)
        self.hard_stop.set()
        self._commit(timeout=5)
        if self._lag_wanted():
            self._report_lag()  # the last word on what is left waiting
        self.end_probe.close()
        self.executor.shutdown(wait=False)
        # INFO: kafka-python 3's close leaves the group without a bound (its timeout_ms covers the commit only):
        # a frozen broker held a stopping watcher there for 30 s. It closes in a thread of its own, given 6 s.
        errors = []

        def close():
            try:
                self.consumer.close(autocommit=False, **_bounded(self.consumer.close, 5))
            except Exception as exc:
                errors.append(exc)
        closing = threading.Thread(target=close, name="xzatoma-close", daemon=True)
        closing.start()
        closing.join(6)
        if closing.is_alive() or errors:
            self.log("close_failed", level="warn", error=_one_line(errors[0]) if errors else
                     "the consumer did not close within 6 s (the broker slow or away); the group moves its "
                     "partitions after its session timeout")
        if self.producer is not None:
            # every publish waited for its ack: what the producer still holds was given up on (its result is
            # stored, to be published after a restart), and is dropped, not delivered as well
            _close_by_force(self.producer)
        self.log("stopped", received=self.received, settled=self.settled,
                 **{k: v for k, v in sorted(self.counts.items())})


# ---- Records the client cannot read: each set aside where it is, never a spin, never a skip ----
# INFO: this section reaches into kafka-python's record classes (3.x; a client without them is left as it is).
# kafka-python raises a record batch it cannot unpack (a codec whose library is not installed, a failed CRC, a
# corrupt body, a header name that is not UTF-8) out of poll() once, then keeps the dead batch in line and spins
# on it inside every later poll, silently, at full CPU; the one error is dropped unseen when the partition was
# paused. Records after a bad one in its batch could not be reached at all (the client decodes a batch from its
# start, every time). Here each record the client cannot read becomes a stand-in record where it was, carrying
# why; the watcher sets it aside (a log line, a dead-letter note of its origin, the commit) and reads on.

#: a batch whose body would inflate past this is unreadable (a 509 KiB gzip bomb inflated to 512 MiB, held twice)
MAX_INFLATED_BATCH = 64 << 20
#: a record with more headers is not built (2 million empty ones took 300 MB); up to it, MAX_HEADERS rejects
MAX_BUILT_HEADERS = 16 * MAX_HEADERS


class _Mark(str):
    """The name of the header that marks a stand-in. A str of this class: one from the wire is a plain str, so no
    producer can forge the mark (`headers[0][0] is UNREADABLE`)."""


UNREADABLE = _Mark("xzatoma-unreadable")


def unread_stand_in(headers):
    """(first offset, reason) when a consumed record is a stand-in for records that could not be read, else None."""
    if headers and headers[0][0] is UNREADABLE:
        doc = json.loads(headers[0][1])
        return doc["first"], doc["reason"]
    return None


class _Unread:
    """What is known of a record the client could not read: where it is (its dead-letter note carries only that)."""

    def __init__(self, topic, partition, first, last):
        self.topic, self.partition, self.offset = topic, partition, last
        self.origin = "%s:%s:%s" % (topic, partition, first if first == last else "%d-%d" % (first, last))
        self.key, self.value = None, b""  # empty, not null: a null value is a deletion on a compacted topic
        self.headers = []


def _unread_reason(first, last, reason):
    """Why records were set aside unread, and for a missing codec, how to read them."""
    reason = "set aside unread: the Kafka client could not read %s: %s" % (
        "the record" if first == last else "records %d to %d" % (first, last), reason)
    codec = re.search(r"UnsupportedCodecError.*?\b(lz4|snappy|zstd)\b", reason)
    if codec:
        from xzatoma_store import install_hint
        package = {"lz4": "lz4", "snappy": "python-snappy", "zstd": "zstandard"}[codec.group(1)]
        reason += "; to read %s records: %s" % (codec.group(1), install_hint(package, extra="kafka-codecs"))
    return reason


def _error_text(exc):
    text = _one_line(exc)
    return text if text.startswith(type(exc).__name__) else "%s: %s" % (type(exc).__name__, text)


def _bounded_gunzip(payload):
    """kafka-python's gzip_decode, bounded: a body inflating past MAX_INFLATED_BATCH is refused, not held. Read in
    small steps, so a body of many members costs time in its length (taking each member's leftover whole made
    6 MiB of empty members take 31 s, past the group's poll interval: a crash loop)."""
    import zlib

    def pieces():
        view, pos, inflater = memoryview(payload), 0, None
        while pos < len(view):
            chunk = bytes(view[pos:pos + 2048])
            if inflater is None:  # a member starts; zeros before it are padding, as gzip.GzipFile reads them
                rest = chunk.lstrip(b"\x00")
                pos += len(chunk) - len(rest)
                if not rest:
                    continue
                chunk, inflater = rest, zlib.decompressobj(16 + zlib.MAX_WBITS)
            yield inflater.decompress(chunk, _INFLATE_STEP)
            pos += len(chunk) - len(inflater.unconsumed_tail) - len(inflater.unused_data)
            if inflater.eof:
                inflater = None
        if inflater is not None:
            raise ValueError("the gzip body is cut short")
    return _bounded_join(pieces())


# INFO: the other codecs kafka-python reads (with the kafka-codecs extra) inflate a batch whole and unbounded in
# its kafka.codec (a 12.8 KB zstd batch took a watcher from 34 MB to 844 MB). Each is read here as kafka-python
# reads it, in pieces of at most _INFLATE_STEP (asked for whole, a bound is allocated whole), under the same bound
# as gzip, joined by the one _bounded_join.
_INFLATE_STEP = 1 << 20


def _too_big():
    return ValueError("the batch inflates past %d bytes" % MAX_INFLATED_BATCH)


def _bounded_join(pieces):
    """The pieces a decoder gives out, joined; refused as soon as they pass MAX_INFLATED_BATCH."""
    out, size = [], 0
    for piece in pieces:
        size += len(piece)
        if size > MAX_INFLATED_BATCH:
            raise _too_big()
        if piece:  # a body of many empty blocks or frames is not a list of as many empty pieces
            out.append(piece)
    return b"".join(out)


def _bounded_unzstd(payload):
    """kafka-python's zstd_decode (zstandard's stream reader, across frames), bounded."""
    import io
    import zstandard
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(payload), read_across_frames=True) as reader:
        return _bounded_join(iter(lambda: reader.read(_INFLATE_STEP), b""))


def _bounded_unlz4(payload):
    """kafka-python's lz4_decode (lz4.frame.decompress: one LZ4 frame, what follows it ignored), bounded."""
    try:
        import lz4.frame
    except ImportError:  # kafka-python also reads lz4 with the old lz4f or lz4framed: those have no bound to give
        from kafka.errors import UnsupportedCodecError
        raise UnsupportedCodecError("lz4 is read here only with the lz4 package") from None
    decompressor = lz4.frame.LZ4FrameDecompressor()

    def pieces():
        data = payload
        while not decompressor.eof:
            piece, data = decompressor.decompress(data, max_length=_INFLATE_STEP), b""
            if not piece and decompressor.needs_input:
                raise ValueError("the lz4 frame is cut short")
            yield piece
    return _bounded_join(pieces())


def _bounded_unsnappy(payload):
    """kafka-python's snappy_decode, bounded: xerial's framing (a 16-byte header, then blocks each after its
    length: snappy-java's, as Java producers write) or one raw block. A raw block starts with its inflated length,
    a varint (snappy's format_description.txt), and inflates to exactly that or fails; it is checked against what
    is left of the bound before snappy is asked for it. One pass: kafka-python's copies the rest of the body for
    each block (6 MiB of empty blocks took 140 s there, 3 s here)."""
    import snappy

    def blocks():
        if not (len(payload) > 16 and payload[:8] == b"\x82SNAPPY\x00"):  # as kafka.codec._detect_xerial_stream
            yield payload
            return
        pos = 16
        while pos < len(payload):
            size = int.from_bytes(payload[pos:pos + 4], "big", signed=True)
            if size < 0 or pos + 4 + size > len(payload):
                raise ValueError("the snappy body is cut short")
            yield payload[pos + 4:pos + 4 + size]
            pos += 4 + size

    def pieces():
        left = MAX_INFLATED_BATCH
        for block in blocks():
            claimed = shift = 0
            for byte in block[:5]:  # a 32-bit little-endian varint
                claimed, shift = claimed | (byte & 0x7F) << shift, shift + 7
                if byte < 0x80:
                    break
            if claimed > left:
                raise _too_big()
            piece = snappy.decompress(block)
            left -= len(piece)
            yield piece
    return _bounded_join(pieces())


def _peek_record(buffer, pos, decode_varint):
    """(end, offset delta, header count) of the v2 record at `pos`, read only as far as its header count, or None
    when not even that can be read (the fields as kafka-python reads them; KIP-98 record format)."""
    try:
        length, start = decode_varint(buffer, pos)
        end = start + length
        if length < 0 or end > len(buffer):
            return None
        _, p = decode_varint(buffer, start)  # attributes
        _, p = decode_varint(buffer, p)  # timestamp delta
        delta, p = decode_varint(buffer, p)
        for _ in range(2):  # key, value: a length (-1: null), then the bytes
            n, p = decode_varint(buffer, p)
            p += max(n, 0)
        count, p = decode_varint(buffer, p)
        return (end, delta, count) if p <= end else None
    except (IndexError, ValueError):
        return None


def _read_batch(batch, unpack, next_record, check_crc, make_record, decode_varint):
    """The records of one v2 batch, each one that cannot be read replaced by a stand-in at its offset; when the
    batch or the rest of it cannot be told apart, one stand-in for its unread offsets (kafka-python moves past
    a batch to its header's last offset, as it does for a readable one)."""
    def stand_in(first, last, reason):
        doc = json.dumps({"first": first, "reason": reason}).encode()
        # at the range's last offset: the client drops records below where it reads from, and moves on after it
        return make_record(0, last, batch.first_timestamp, batch.timestamp_type, None, None, [(UNREADABLE, doc)])
    reason = None
    try:
        if not check_crc(batch):
            reason = "its batch failed its CRC check"
        else:
            unpack(batch)  # inflates a compressed body
    except Exception as exc:
        reason = "its batch could not be unpacked (%s)" % _error_text(exc)
    if reason is not None:
        yield stand_in(batch.base_offset, batch.last_offset, reason)
        return
    done = batch.base_offset - 1  # the last offset given out
    failed = False  # a record could not be read: a gap after it is records it hid (a length that lied)
    while True:
        peek = _peek_record(batch._buffer, batch._pos, decode_varint) \
            if batch._next_record_index < batch._num_records else None
        if peek is not None and peek[2] > MAX_BUILT_HEADERS:
            problem = "%d headers, over the limit of %d" % (peek[2], MAX_BUILT_HEADERS)
        else:
            try:
                record = next_record(batch)
            except StopIteration:
                return
            except Exception as exc:
                problem = _error_text(exc)
            else:
                if not done < record.offset <= batch.last_offset:  # two events on one offset: one would be lost
                    problem, peek = "offset %d out of order" % record.offset, None
                else:
                    if failed and record.offset > done + 1:
                        yield stand_in(done + 1, record.offset - 1, "they could not be told apart after a record "
                                                                    "that could not be read")
                    done = record.offset
                    yield record
                    continue
        offset = batch.base_offset + peek[1] if peek is not None else None
        if offset is None or not done < offset <= batch.last_offset:  # the rest cannot be told apart
            if done < batch.last_offset:
                yield stand_in(done + 1, batch.last_offset, "the rest of its batch could not be read (%s)" % problem)
            return
        batch._pos, batch._next_record_index = peek[0], batch._next_record_index + 1
        if offset > done + 1:
            yield stand_in(done + 1, offset - 1, "they could not be told apart before a record that could not be read")
        done, failed = offset, True
        yield stand_in(offset, offset, "it could not be read (%s)" % problem)


def guard_client(kafka):
    """Fit kafka-python with the above (once; a client without those classes is left as it is)."""
    records = getattr(getattr(kafka, "record", None), "default_records", None)
    batch_class = getattr(records, "DefaultRecordBatch", None)
    needed = ("_maybe_uncompress", "validate_crc", "__next__", "_buffer", "_pos", "_next_record_index",
              "_num_records", "last_offset", "first_timestamp", "timestamp_type")
    if batch_class is not None and all(hasattr(batch_class, n) for n in needed) and \
            not getattr(batch_class, "xzatoma_guard", False) and hasattr(records, "gzip_decode"):
        unpack, next_record, check_crc = batch_class._maybe_uncompress, batch_class.__next__, batch_class.validate_crc
        make_record, decode_varint = records.DefaultRecord, records.decode_varint
        batch_class.__iter__ = lambda self: _read_batch(self, unpack, next_record, check_crc, make_record,
                                                        decode_varint)
        batch_class.validate_crc = lambda self: True  # checked as the batch is read, where a failure is set aside
        batch_class.xzatoma_guard = True
        records.gzip_decode = _bounded_gunzip
        # looked up in the module's globals as a batch is unpacked (it imports them by name from kafka.codec); a
        # codec whose library is missing is still refused first, by kafka.codec's has_* (UnsupportedCodecError)
        for name, bounded in (("zstd_decode", _bounded_unzstd), ("lz4_decode", _bounded_unlz4),
                              ("snappy_decode", _bounded_unsnappy)):
            if hasattr(records, name):
                setattr(records, name, bounded)
    _guard_dead_batches(kafka)


def _guard_dead_batches(kafka):
    """The backstop for what the batch reader does not see (another record format, a failure of its own): a batch
    that failed raises the same error on every take(), not once, carrying where (`xzatoma_unreadable`); the
    watcher sets that record aside and moves the position past it, which makes the client let the batch go."""
    cls = getattr(getattr(getattr(getattr(kafka, "consumer", None), "fetcher", None), "Fetcher", None),
                  "PartitionRecords", None)
    take = getattr(cls, "take", None)
    if take is None or getattr(take, "xzatoma_guard", False):
        return

    def guarded_take(self, *args, **kwargs):
        failed = getattr(self, "_xzatoma_failed", None)
        if failed is not None:
            raise failed.with_traceback(None)  # the same error again, its traceback not grown by each raise
        try:
            return take(self, *args, **kwargs)
        except Exception as exc:
            where = getattr(self, "topic_partition", None), getattr(self, "next_fetch_offset", None)
            if where[0] is not None and isinstance(where[1], int):
                exc.xzatoma_unreadable = where
                self._xzatoma_failed = exc
            raise
    guarded_take.xzatoma_guard = True
    cls.take = guarded_take


# ---- Broker plumbing: the rebalance listener, offsets and paused partitions' ends, final errors, unread ids ----


def _listener(kafka, watcher):
    """A rebalance listener: runs of revoked partitions finish and are committed before the partitions go."""
    async_base = getattr(kafka, "AsyncConsumerRebalanceListener", None)
    if async_base is not None:  # kafka-python 3: the listener runs on the consumer's IO loop; commit by awaiting
        class AsyncListener(async_base):
            async def on_partitions_revoked(self, revoked):
                sleep = getattr(getattr(watcher.consumer, "_net", None), "sleep", None)  # the IO loop's own
                if sleep is None:
                    points = watcher._revoke(revoked)
                else:
                    steps, points = watcher._revoking(revoked), None
                    while True:
                        try:
                            wait = next(steps)
                        except StopIteration as done:
                            points = done.value
                            break
                        await sleep(wait)  # heartbeats go on while runs finish
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


# The errors that say this record will never be taken, however often it is sent: the broker or the producer
# refuses it for its size, its form or its topic. Anything else (a broker away, a leader moving, a producer id
# forgotten after a restart) is retried, up to the caller's bound.
RECORD_REFUSED = ("MessageSizeTooLargeError", "RecordListTooLargeError", "RecordTooLargeError", "InvalidRecordError",
                  "CorruptRecordError", "CorruptRecordException", "InvalidTopicError", "TopicAuthorizationFailedError",
                  "UnsupportedForMessageFormatError", "InvalidRequiredAcksError")


def _refused_for_good(kafka, exc):
    errors = getattr(kafka, "errors", None)
    if errors is None or not isinstance(exc, errors.KafkaError):
        return not isinstance(exc, (OSError, TimeoutError))  # a bug (a wrong type sent): trying again is no cure
    return type(exc).__name__ in RECORD_REFUSED


class EndProbe:
    """The true end of partitions this watcher does not fetch (paused behind its runs): a fetch of each one's
    last known record, whose response carries the partition's high watermark. INFO: neither cheaper answer can be
    trusted alone there: the consumer's own high watermark is as old as its last fetch, and Tansu 0.6 answers
    ListOffsets with the last record batch's first offset + 1 (40 events produced in one batch read as lag 2).
    Group-less, made on first use; it holds at most one record batch per partition asked about."""

    def __init__(self, kafka, options):
        self.kafka = kafka
        self.options = dict(options, group_id=None, enable_auto_commit=False, auto_offset_reset="latest",
                            fetch_max_wait_ms=50, max_partition_fetch_bytes=1, fetch_max_bytes=1,
                            key_deserializer=None, value_deserializer=None, **_quiet_sensors(kafka.KafkaConsumer))
        if "bootstrap_timeout_ms" in self.options:  # it is made in the watcher's loop: a broker away costs 1 s
            self.options["bootstrap_timeout_ms"] = 1000
        self.consumer = None  #: made when first asked, closed by close() (or after it failed)

    def ends(self, known, budget=0.5):
        """{partition: high watermark} for {partition: the furthest end known so far}, for those answering
        within budget seconds; never raises (the broker away: nothing is learned this round)."""
        if not known:
            return {}
        try:
            if self.consumer is None:
                self.consumer = self.kafka.KafkaConsumer(**self.options)
            consumer = self.consumer
            consumer.assign([])  # forget the last round's high watermarks: each answer is from this round
            consumer.assign(list(known))
            for tp, end in known.items():
                consumer.seek(tp, max(0, end - 1))
            found, deadline = {}, time.monotonic() + budget
            while len(found) < len(known) and time.monotonic() < deadline:
                consumer.poll(timeout_ms=max(1, int((deadline - time.monotonic()) * 1000)), max_records=1)
                found.update((tp, consumer.highwater(tp)) for tp in known if consumer.highwater(tp) is not None)
            return found
        except Exception:
            self.close()
            return {}

    def close(self):
        consumer, self.consumer = self.consumer, None
        if consumer is not None:
            try:
                consumer.close(autocommit=False, **_bounded(consumer.close, 2))
            except Exception:
                pass


class Kept:
    """What a waiting job keeps of its Kafka record, for its dead-letter copy: that copy never holds more than the
    producer's max_request_size, so neither does this (a waiting event held its whole record, up to the broker's
    own limit when it was rejected unread: 20 MB copies behind a running id took 657 MB)."""

    __slots__ = ("topic", "partition", "offset", "key", "key_size", "value", "headers", "origin", "size",
                 "headers_dropped", "held")

    def __init__(self, msg, limit):
        self.topic, self.partition, self.offset = msg.topic, msg.partition, msg.offset
        self.key = msg.key if msg.key is None or len(msg.key) <= ID_MAX_BYTES * 4 else msg.key[:ID_MAX_BYTES * 4]
        self.key_size = len(msg.key or b"")  #: the key's length as it came (a cut copy says it)
        self.origin = getattr(msg, "origin", None)
        headers = _plain_headers(msg.headers)
        headers_size = _headers_size(headers)
        #: a copy never carries more than a quarter of its room in headers (Watcher._dead_letter)
        self.headers, self.headers_dropped = (headers, 0) if headers_size <= limit // 4 else ([], len(headers))
        self.size = len(msg.value or b"")  #: the value's length as it came (a cut copy says it)
        self.held = self.size + headers_size + len(msg.key or b"")  #: what the record held when fetched
        self.value = msg.value if msg.value is None or self.size <= limit else msg.value[:limit]


def _asks_model(job):
    """Whether the job's run asks the model: not a rejection, nor a stored result to publish."""
    return job.rejection is None and job.stored is None


def _plain_headers(pairs):
    """A record's headers a copy can carry: a text name, and bytes or no value."""
    return [(k, v) for k, v in (pairs or []) if isinstance(k, str) and isinstance(v, (bytes, type(None)))]


def _message_bytes(job):
    msg = job.message
    held = 0 if msg is None else getattr(msg, "held", None) or len(msg.value or b"") + len(msg.key or b"")
    return held + job.decoded


def _text_bytes(value):
    """What a str holds: one byte a character when all are ASCII, else up to four (CPython stores every character
    as wide as its widest: one emoji made 7 MiB of ASCII take 28 MiB)."""
    return 0 if not isinstance(value, str) else len(value) if value.isascii() else 4 * len(value)


def _decoded_bytes(plan):
    """About the bytes a parsed plan takes in memory: its texts, and 64 more for each value (a '{}' of three bytes
    in JSON is a dict of 64 in Python: 90,000 of them in a 270 KB event held 6 MB, found by an attack round)."""
    if plan is None:
        return 0
    total, stack = 0, [plan.goal, plan.context, plan.instructions, plan.name, plan.version, plan.action]
    while stack:
        value = stack.pop()
        total += 64 + _text_bytes(value)
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return total


def _offsets_call(method, tps):
    """consumer.end_offsets / beginning_offsets, waiting at most 2 s (kafka-python 2 has no timeout_ms)."""
    try:
        return method(tps, timeout_ms=2000)
    except TypeError:
        return method(tps)


def _guess_id(msg):
    """The id of a message that was not (or could not be) read (message_id_hint)."""
    return message_id_hint(msg.key, msg.headers)


def _producer_limits(producer_class, publish_timeout):
    """A producer that answers for every record within 3 publish timeouts (30 s by default, not kafka-python's
    2 minutes): a request unanswered for one is retried, a record unsent after three fails. The watcher waits
    for that answer rather than send a record twice (a producer left stuck by a restarted broker answers so
    too, and is then replaced)."""
    opts = {"request_timeout_ms": int(publish_timeout * 1000)}
    if "delivery_timeout_ms" in getattr(producer_class, "DEFAULT_CONFIG", {}):
        opts["delivery_timeout_ms"] = 3 * opts["request_timeout_ms"]
    opts.update(_quiet_sensors(producer_class))
    return opts


def _bounded(method, seconds):
    """{"timeout_ms": …} for a client call that takes one (kafka-python >= 2.1's commit and close), else {}."""
    if seconds is None or not _takes_timeout(getattr(method, "__func__", method)):
        return {}
    return {"timeout_ms": int(seconds * 1000)}


@functools.lru_cache(maxsize=None)
def _takes_timeout(function):
    """Asked once per client function, not on every commit of the loop."""
    import inspect
    try:
        return "timeout_ms" in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


def crc_in_c():
    """Whether kafka-python checks CRC-32C with the C module `crc32c` (the kafka extra's), not in pure Python."""
    try:
        from kafka.record import util
    except ImportError:
        return False
    return getattr(util, "crc32c_c", None) is not None


def _quiet_sensors(client_class):
    """INFO: a client's own sensors (kafka-python >= 2.1) are read by nobody here (the watcher's gauges are its
    own), yet record several samples per request on the client's network thread: off where the option exists."""
    return {"metrics_enabled": False} if "metrics_enabled" in getattr(client_class, "DEFAULT_CONFIG", {}) else {}


def _close_by_force(producer):
    """Close a producer now, dropping what it has not delivered (its sends fail). INFO: kafka-python 3's
    close(timeout) flushes first and raises when that times out, leaving the producer running and delivering
    later; its sender's force_close is the only way to stop it at once."""
    sender = getattr(producer, "_sender", None)
    try:
        if sender is not None and hasattr(sender, "force_close"):
            sender.force_close()
            sender.join(5)
        producer.close(timeout=0)
    except Exception:
        pass


def _tps(tps):
    return ",".join("%s:%d" % (tp.topic, tp.partition) for tp in sorted(tps, key=lambda t: (t.topic, t.partition)))


def _headers_size(pairs):
    """Bytes of Kafka headers in a record. A name goes as UTF-8: counted in characters, names of 4-byte
    characters made a dead-letter copy larger than max_request_size, which the producer refused (issue 22)."""
    return sum(len(k.encode("utf-8", "replace")) + len(v or b"") + 8 for k, v in pairs)


def _finite(value):
    """A number JSON can carry: NaN and Infinity are not JSON (a model server's usage of NaN made a result
    strict consumers refuse), and an int of thousands of digits is not a count."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) < 10 ** 18 if isinstance(value, int) else math.isfinite(value)


def _encode(doc):
    return json.dumps(doc, ensure_ascii=False).encode("utf-8", "replace")  # a lone surrogate goes as '?'


def _one_line(exc, width=300):
    """An error as one line of the log: xzatoma_store.one_line (redacted before the cut), or its type's name."""
    from xzatoma_store import one_line
    return one_line(exc, width) or type(exc).__name__


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
    from xzatoma_plans import PlanError, detect_plan_format, json_ready, parse_plan
    try:
        plan = parse_plan(text, source=source)
    except PlanError as exc:
        raise WatchError("invalid plan: %s" % exc)
    fmt = detect_plan_format(text, source)
    if fmt == "json":
        return json_ready(json.loads(text)), plan
    if fmt == "yaml":
        import yaml
        return json_ready(yaml.safe_load(text)), plan
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


def publish(brokers, topic, event, key=None, security=None, timeout=30.0, max_bytes=None):
    """Send one event (structured mode) and wait for the broker's ack; returns the event id. WatchError, before
    anything is sent, when the event is over `max_bytes` (watcher.max_message_bytes): a watcher would reject it
    unread (the plan was measured, not the event made of it: 925 bytes of plan made events of 1,166 and 2,529)."""
    value = _encode(event)
    if max_bytes is not None and len(value) > max_bytes:
        raise WatchError("the event is %s bytes, over watcher.max_message_bytes (%s): a watcher would reject it "
                         "unread; give a smaller plan" % ("{:,}".format(len(value)), "{:,}".format(max_bytes)))
    kafka = require_kafka("publish")
    opts = client_options(brokers, security)
    if "bootstrap_timeout_ms" in getattr(kafka.KafkaProducer, "DEFAULT_CONFIG", {}):
        opts["bootstrap_timeout_ms"] = 10000
    try:
        producer = kafka.KafkaProducer(acks="all", **opts)
    except kafka.errors.KafkaError as exc:
        raise PublishError("cannot reach the Kafka brokers %s: %s" % (brokers, _one_line(exc)))
    try:
        producer.send(topic, key=(key or event["id"]).encode("utf-8"), value=value,
                      headers=RESULT_HEADERS).get(timeout=timeout)
    except Exception as exc:
        raise PublishError("cannot publish to %s: %s" % (topic, _one_line(exc)))
    finally:
        try:
            producer.close(timeout=5)
        except Exception:
            pass
    return event["id"]


class RecordFailed(Exception):
    """The store could not record a result before the run was cancelled (the grace period over, the partition
    gone, the claim lapsing): nothing is published (published without its record, a second group sharing the store
    ran the event again: two results, attack round 15b). `copy`: the dead-letter copy to make after the record."""

    def __init__(self, result, error, copy=None):
        super().__init__(str(error))
        self.result, self.error, self.copy = result, error, copy


class ClaimLost(Exception):
    """Another watcher sharing the store answered this event or holds its claim (this one was frozen past its
    lease, or could not claim it for a failing store): that one's result is the one published, never a second."""


class PublishError(Exception):
    """The broker did not take the event (exit 1: the task failed, not the usage)."""

    exit_code = 1
