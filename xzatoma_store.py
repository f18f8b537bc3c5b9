"""XZatoma persistence: every conversation, undo records and caches in one sqlite3 file.

Read top to bottom: identifiers and times, redaction, fetched HTML as text, untrusted text for
terminals, the schema and its migrations, and the Store. `sqlite3` is imported when a Store opens, so
`xzatoma --help` never pays for it. Each thread gets its own connection; WAL
and a busy timeout let parallel subagents and several xzatoma processes write
at once.
"""

import collections
import errno
import json
import os
import re
import stat
import threading
import time

# ---- Identifiers, times and this installation ----

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_ulid_lock = threading.Lock()
_ulid_last = [0, 0]  # last millisecond, last random part (monotonic within one ms)


def new_ulid(now=None):
    """A ULID: 48-bit millisecond time + 80 random bits, Crockford base32, 26 chars.

    Monotonic within a process: two ids made in the same millisecond still sort
    in creation order.
    """
    ms = int((time.time() if now is None else now) * 1000)
    with _ulid_lock:
        if ms <= _ulid_last[0]:
            ms = _ulid_last[0]
            rand = (_ulid_last[1] + 1) & ((1 << 80) - 1)
        else:
            rand = int.from_bytes(os.urandom(10), "big")
        _ulid_last[0], _ulid_last[1] = ms, rand
    value = (ms << 80) | rand
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def ulid_time(ulid):
    """The creation time (seconds since the epoch) encoded in a ULID."""
    value = 0
    for ch in ulid[:10].upper():
        value = value * 32 + _CROCKFORD.index(ch)
    return value / 1000.0


def rfc3339(ts=None, millis=False):
    """`ts` (seconds since the epoch; now unless given) in UTC as RFC 3339: 2025-01-15T10:30:45Z, with
    millis 2025-01-15T10:30:45.123Z (the watcher's log lines and events)."""
    ts = time.time() if ts is None else ts
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + (".%03dZ" % int(ts % 1 * 1000) if millis else "Z")


def install_hint(package, extra=None, prefix=None):
    """How to add `package` to this installation (`extra`: the xzatoma extra that brings it). pipx keeps xzatoma
    in a venv of its own, where a plain `pip install` cannot reach; pipx writes pipx_metadata.json at that
    venv's root (`prefix`, sys.prefix unless given), wherever PIPX_HOME puts it."""
    import sys
    if os.path.isfile(os.path.join(sys.prefix if prefix is None else prefix, "pipx_metadata.json")):
        return "pipx inject xzatoma %s" % package
    if extra:
        return "pip install 'xzatoma[%s]' (or pip install %s)" % (extra, package)
    return "pip install %s (or reinstall xzatoma)" % package


def parse_age(text):
    """'30d', '12h', '90m', '45s', '2w' -> seconds; ValueError otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text or "")
    if not m:
        raise ValueError("expected a duration like 30d, 12h, 90m or 2w, got %r" % text)
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]


# ---- Redaction: secrets never reach the store, a terminal or a log ----
# One implementation for the whole program: the store, the console (stderr), errors, the audit log, `config
# show`, `auth status`, --json and the final answer all call redact(). It removes common credential shapes
# whatever their source, and every credential this process knows: configuration and credential loading register
# them (register_secret) as they are read, environment variables by the families of their names and by what
# their values are (env_credential). A known secret is found as written, in the spellings registered with it, and in a decoded
# view of the text: every escape undone once (URL at any depth, the backslash escapes of C, JSON, JavaScript,
# Python and the shell, HTML character references), and whitespace, terminal escape sequences and markup tags
# looked through (_View), so that a key echoed double-URL-encoded, shell-quoted, as \uXXXX escapes of any
# character, base64 wrapped at any width, coloured by grep or split by tags is found without a list of such
# spellings: the grammar of escapes is the list. Its hex is looked for where a dump's separators, offsets and
# printable column are dropped too (xxd, od, hexdump, `0x71, 0x5a`). A stream holds back whatever the view could
# still join to a known value (partial_secret), so a terminal shows what the whole text would. One combined
# regex, rebuilt only when a secret is added, keeps an append to the store well under a millisecond.

class LazyRegex:
    """re.compile(pattern, flags), done at first use. INFO: the tools' patterns (the command policy's above
    all) took 7-10 ms of every start to compile, and a run that runs no command uses none of them; the
    redaction's views need theirs only where a known value may be (round 19d).
    Use it as the compiled pattern itself: `.match`, `.search`, … (not as an argument to re's functions)."""

    __slots__ = ("_args", "_compiled")

    def __init__(self, pattern, flags=0):
        self._args = (pattern, flags)
        self._compiled = None

    def __getattr__(self, name):
        if self._compiled is None:  # two threads may both compile it: the same pattern either way
            self._compiled = re.compile(*self._args)
        return getattr(self._compiled, name)


REDACTED = "[REDACTED]"
MIN_SECRET_LENGTH = 8  # shorter known values are not registered: they would redact ordinary words

_V = r"[A-Za-z0-9_\-]"  # the body of most token shapes
#: where a token shape starts (written `(?:_S_)` before it, or `(?:_B<n>_)` after its literal prefix of n
#: characters): not right after an ASCII letter, where its prefix is the end of a word (helpdesk-admin-..., laughs_,
#: benchmark_test_), unless that letter ends an escape (`\n`, `%3D`, `\x3d`, `\u003d`). It was `\b`, and a token
#: after a digit, an underscore or an escape went whole into results, dead-letter reasons and the log (`v1ghp_...`,
#: `token%3Dghp_...`, JSON's `\nsk-...`: attack rounds 17b, 17d)
_ESCAPE_ENDS = r"\\[nrtbfv]|%[0-9A-Fa-f]{2}|\\x[0-9A-Fa-f]{2}|\\u[0-9A-Fa-f]{4}"
_START = r"(?:(?<![A-Za-z])|%s)" % "|".join("(?<=%s)" % e for e in _ESCAPE_ENDS.split("|"))


def _began(width):
    """_START, checked after the `width` characters of a shape's prefix (written `(?:_B<width>_)` after it): a
    shape that begins with its literal prefix is searched for at C speed; one that begins with an assertion is
    tried at every place of the text (a third slower over source code)."""
    prefix = r"(?s:.){%d}" % width
    return r"(?:(?<![A-Za-z]%s)|%s)" % (prefix, "|".join("(?<=%s%s)" % (e, prefix) for e in _ESCAPE_ENDS.split("|")))


# (triggers, shape): a shape is tried only when one of its triggers occurs in the lower-cased text, so text
# without anything credential-like costs a few substring checks. A shape either replaces its whole match, or
# keeps the text of its one named group (a label such as 'Authorization: Bearer ', or a URL up to the
# password) and replaces the rest.
TOKEN_SHAPES = [
    # PEM private key blocks, whole (also JSON-escaped, and cut off before the END line)
    (("private key",), r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
                       # up to the END line, but never past the next key's header (each header's scan ran
                       # 16 KB: a page of headers took seconds)
                       r"(?s:(?:(?!-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY).){0,16384}?"
                       r"-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
                       r"|(?:[A-Za-z0-9+/=\s:,.-]|\\[nr])*)"),
    # PEM blocks in base64, as kubeconfig's client-key-data and Kubernetes secrets hold a private key ("-----BEGIN "
    # at each of the three alignments; certificates too, which costs nothing): stored whole before (round 18a)
    # and in base64 again (a Kubernetes Secret holding a kubeconfig: round 18e); wrapped lines may be indented (YAML)
    (("ls0tls1crudjti", "0tls0tqkvhsu4", "tls0tlujfr0lo", "tfmwdextmunsvwrk", "tmhrmuzfdulvk", "muzb0tfmxq1jvz"),
     r"(?:LS0tLS1CRUdJTi|0tLS0tQkVHSU4|tLS0tLUJFR0lO|TFMwdExTMUNSVWRK|TMHRMUzFDUlVk|MUzB0TFMxQ1JVZ)[A-Za-z0-9+/=]*"
     r"(?:(?:\r?\n|\\r\\n|\\n)[ \t]*[A-Za-z0-9+/]{40,}={0,2}(?![^\s\\\"',]))*"),
    # JWT. A start is tried only where a run of token characters begins (the prefix up to its first 'eyJ'
    # is kept): '-eyJ' repeated is one long run with a start after every '-', and trying each of them ran
    # the rest of the run again (a megabyte took minutes). The first start of a run is the only one that
    # can match, since any later one has a shorter first part and the same rest.
    (("eyj",), r"(?<!%s)(?P<jwt>(?:(?!\beyJ)%s)*)\beyJ%s{8,}\.eyJ%s{8,}\.%s*" % (_V, _V, _V, _V, _V)),
    (("akia", "asia", "abia", "acca", "a3t"),  # AWS key id
     r"(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])(?:_B4_)[A-Z0-9]{16}(?![A-Za-z0-9])"),
    (("secret",), r"(?P<aws>(?i:aws_?secret_?(?:access_?)?key|secret_?access_?key)[\"']?\s*[:=]\s*[\"']?)"
                  r"[A-Za-z0-9/+=]{40}(?![A-Za-z0-9/+=])"),  # AWS secret access key assignments
    (("sk_live_", "sk_test_", "rk_live_", "rk_test_"), r"(?:sk|rk)_(?:live|test)_(?:_B8_)[A-Za-z0-9]{10,}"),  # Stripe
    (("whsec_",), r"whsec_(?:_B6_)[A-Za-z0-9]{16,}"),
    (("xox", "xapp-"), r"xox[abposre]-(?:_B5_)[A-Za-z0-9-]{10,}|xapp-(?:_B5_)[A-Za-z0-9-]{10,}"),  # Slack
    (("hooks.slack.com",), r"hooks\.slack\.com/services/[A-Za-z0-9/]{16,}"),
    (("glpat-", "gldt-", "glrt-", "glptt-", "glcbt-", "glft-", "glimt-", "gloas-", "glsoat-", "glagent-"),
     r"(?:_S_)gl(?:pat|dt|rt|ptt|cbt|ft|imt|oas|soat|agent)-%s{20,}" % _V),  # GitLab
    (("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
     r"gh[pousr]_(?:_B4_)[A-Za-z0-9]{20,}|github_pat_(?:_B11_)[A-Za-z0-9_]{20,}"),  # GitHub
    (("hf_", "api_org_"), r"hf_(?:_B3_)[A-Za-z0-9]{20,}|api_org_(?:_B8_)[A-Za-z0-9]{20,}"),  # Hugging Face
    (("npm_",), r"npm_(?:_B4_)[A-Za-z0-9]{20,}"),
    (("pypi-age",), r"pypi-AgE(?:_B8_)%s{20,}" % _V),
    (("aiza", "ya29.", "gocspx-"),  # Google
     r"AIza(?:_B4_)%s{30,}|ya29\.(?:_B5_)%s{20,}|GOCSPX-(?:_B7_)%s{20,}" % (_V, _V, _V)),
    # OpenAI (sk-, sk-proj-, sk-svcacct-, sk-admin-), Anthropic (sk-ant-), DeepSeek, …
    (("sk-",), r"sk-(?:_B3_)%s{16,}" % _V),
    (("sg.",), r"SG\.(?:_B3_)%s{16,}\.%s{16,}" % (_V, _V)),  # SendGrid
    (("shpat_", "shpca_", "shppa_", "shpss_"), r"shp(?:at|ca|pa|ss)_(?:_B6_)[a-fA-F0-9]{32}"),  # Shopify
    (("_v1_",), r"do[opr]_v1_(?:_B7_)[a-f0-9]{64}"),  # DigitalOcean
    (("dapi",), r"dapi(?:_B4_)[a-f0-9]{32}"),  # Databricks
    (("hvs.", "hvb."), r"hv[sb]\.(?:_B4_)%s{20,}" % _V),  # Vault
    (("atatt3",), r"ATATT3(?:_B6_)[A-Za-z0-9_\-=]{50,}"),  # Atlassian
    (("age-secret-key-1",), r"AGE-SECRET-KEY-1(?:_B16_)[0-9A-Z]{50,}"),
    (("glc_",), r"glc_(?:_B4_)[A-Za-z0-9+/=]{30,}"),  # Grafana
    ((":aa",), r"(?:(?<=/bot)|(?:_S_))[0-9]{8,10}:AA[A-Za-z0-9_\-]{30,}"),  # Telegram bots
    (("dckr_pat_", "dckr_oat_"), r"dckr_[po]at_(?:_B9_)%s{20,}" % _V),  # Docker Hub
    (("lin_api_",), r"lin_api_(?:_B8_)[A-Za-z0-9]{32,}"),  # Linear
    (("ntn_", "secret_"), r"ntn_(?:_B4_)[A-Za-z0-9]{40,}|secret_(?:_B7_)[A-Za-z0-9]{43}\b"),  # Notion
    (("pmak-",), r"PMAK-(?:_B5_)[a-f0-9]{24}-[a-f0-9]{34}"),  # Postman
    (("sq0atp-", "sq0csp-", "eaaa"), r"sq0(?:atp|csp)-(?:_B7_)%s{22,}|EAAA(?:_B4_)[A-Za-z0-9_\-]{60}" % _V),  # Square
    (("gsk_", "xai-", "pplx-", "r8_", "pul-", "fw_"),  # Groq, xAI, Perplexity, Replicate, Pulumi, Fireworks
     r"(?:gsk_(?:_B4_)|xai-(?:_B4_)|pplx-(?:_B5_)|r8_(?:_B3_)|fw_(?:_B3_))[A-Za-z0-9]{20,}|pul-(?:_B4_)[a-f0-9]{40}"),
    (("dp.pt.", "dp.st.", "dp.sa.", "dp.ct."), r"dp\.(?:pt|st|sa|ct)\.(?:_B6_)[A-Za-z0-9_.\-]{20,}"),  # Doppler
    (("atlasv1",), r"(?:_S_)[A-Za-z0-9]{14}\.atlasv1\.[A-Za-z0-9_\-=]{40,}"),  # Terraform Cloud
    (("key-",), r"key-(?:_B4_)[0-9a-f]{32}\b"),  # Mailgun
    (("sk",), r"SK(?:_B2_)[0-9a-f]{32}\b"),  # Twilio API keys
    (("accountkey=", "sharedaccesskey="),  # Azure connection strings
     r"(?P<azure>(?i:AccountKey|SharedAccessKey)=)[A-Za-z0-9+/]{20,}={0,2}"),
    (("mfa.", ".g"),  # Discord
     r"mfa\.(?:_B4_)[A-Za-z0-9_\-]{60,}"
     r"|[MNO](?:_B1_)[A-Za-z0-9_\-]{23,25}\.[A-Za-z0-9_\-]{6}\.[A-Za-z0-9_\-]{27,38}\b"),
    (("tid=",), r"tid=(?:_B4_)[A-Za-z0-9;=:._\-]{16,}"),  # Copilot tokens
    # Authorization headers, in HTTP, curl -H, JSON or YAML spellings
    (("authorization",),
     r"(?P<auth>(?i:(?:proxy-)?authorization)[\"']?\s*[:=]\s*[\"']?)(?:(?i:bearer|basic|token|digest|negotiate)\s+)?"
     r"(?!\[REDACTED)[A-Za-z0-9._~+/=\-]{8,}"),
    (("bearer", "basic", "token"), r"(?P<bearer>\b(?i:bearer|basic|token)\s+)(?!\[REDACTED)[A-Za-z0-9._~+/=\-]{16,}"),
    # the password of URL userinfo: scheme://user:PASSWORD@host. A password may hold an unencoded '@' (urllib
    # and requests split the userinfo at the last one): everything up to the '@' before the host goes.
    (("://",), r"(?P<url>\b[A-Za-z][A-Za-z0-9+.\-]{0,30}://[^\s/?#@:\"'<>\\]*:)[^\s/?#\"'<>\\]{1,512}"
               r"(?=@[^\s/?#@\"'<>\\]{0,255}(?:[\s/?#\"'<>\\]|$))"),
    # userinfo that is one generated word (a token as the user name: https://TOKEN@github.com, a Sentry DSN)
    (("://",), r"(?P<urluser>\b[A-Za-z][A-Za-z0-9+.\-]{0,30}://)(?=[^\s/?#@:\"'<>\\]{0,256}[0-9])"
               r"[A-Za-z0-9_.~%+\-]{16,256}(?=@)"),
    # NAME_TOKEN=value, "api_key": "value", X-Api-Key: value, password: value, sig=… in a signed URL
    # (values that look generated: a digit, 12+)
    (("key", "secret", "password", "passwd", "passphrase", "token", "credential", "auth=", "auth:", "auth\"",
      "auth'", "auth =", "auth :", "sig=", "sig:", "signature"),
     r"(?P<assign>(?i:api[_-]?key|apikey|access[_-]?key|private[_-]?key|secret|password|passwd|passphrase|token"
     r"|credentials?|auth\b|sig(?:nature)?\b)[A-Za-z0-9_]{0,20}[\"']?"
     r"\s*[:=]\s*[\"']?)(?=[A-Za-z0-9_\-+/=~%]{0,200}[0-9])(?![0-9]+\b)[A-Za-z0-9_\-+/=~%]{12,}"),
    # session cookies by their well-known names (Cookie: sessionid=…, connect.sid, PHPSESSID, csrftoken)
    (("sessionid=", "sessid=", "session=", "sid=", "_session=", "csrftoken=", "xsrf-token=", "_csrf="),
     r"(?P<cookie>\b(?i:(?:php|j|asp\.net_)?sess(?:ion)?id|sessid|session|sid|connect\.sid|[A-Za-z0-9_]{0,30}_session"
     r"|csrftoken|xsrf-token|_csrf)=)(?=[A-Za-z0-9%_.+/=\-]{0,200}[0-9])[A-Za-z0-9%_.+/=\-]{16,}"),
    # passwords on command lines: curl -u user:PASS, --password PASS, sshpass -p PASS, mysql -pPASS
    (("curl",), r"(?P<curlu>\bcurl\b[^\n|;&]{0,200}?\s(?:-u|--user)(?:\s+|=)['\"]?[^\s:'\"@]{1,64}:)[^\s'\"]{4,}"),
    (("--pass", "--token", "--api-key", "--secret", "--auth"),
     r"(?P<flagpw>--(?:password|passwd|pass|token|api-key|secret|client-secret|auth-token)[ \t]+['\"]?)"
     r"(?=[^\s'\"]{0,200}[0-9])[^\s'\"\-][^\s'\"]{7,}"),
    (("sshpass",), r"(?P<sshpass>\bsshpass\s+-p\s*['\"]?)[^\s'\"]+"),
    (("mysql", "mariadb"), r"(?P<mysqlp>\b(?:mysql|mysqldump|mysqladmin|mariadb)\b[^\n|;&]{0,200}?\s-p)[^\s'\"-][^\s'\"]*"),
    # more token families: Grafana service accounts, Sentry, Meta, Alibaba Cloud, Discord webhooks
    (("glsa_",), r"glsa_(?:_B5_)[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}"),
    (("sntrys_", "sntryu_"), r"sntry[su]_(?:_B7_)[A-Za-z0-9_=+/\-]{30,}"),
    (("eaa",), r"EAA(?:_B3_)[A-Za-z0-9]{30,}"),
    (("ltai",), r"LTAI(?:_B4_)[A-Za-z0-9]{12,20}\b"),
    (("/api/webhooks/",), r"discord(?:app)?\.com/api/webhooks/[0-9]{17,20}/[A-Za-z0-9_\-]{30,}"),
]
TOKEN_SHAPES = [(triggers, re.sub(r"\(\?:_B(\d+)_\)", lambda m: _began(int(m.group(1))),
                                  shape.replace("(?:_S_)", _START))) for triggers, shape in TOKEN_SHAPES]

#: environment names that hold a credential: by their last word, by a part anywhere, and not these
SECRET_ENV_SUFFIXES = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASS", "PAT", "CREDENTIALS", "AUTH", "PWD",
                       "PASSPHRASE", "DSN", "CREDENTIAL")
#: a name holding one of these anywhere is a credential's: PGPASSWORD, SECRET_KEY_BASE, API_KEY_PROD, CLIENTSECRET,
#: a cookie, a JWT or a bearer token by any name
SECRET_ENV_PARTS = ("PASSWORD", "PASSWD", "SECRET", "TOKEN", "PASSPHRASE", "APIKEY", "API_KEY", "PRIVATE_KEY",
                    "ACCESS_KEY", "CREDENTIAL", "COOKIE", "JWT", "BEARER")
#: names that match the rules above but hold no credential (a path or a socket): never registered
NOT_SECRET_ENV = ("PWD", "OLDPWD", "SSH_AUTH_SOCK", "XAUTHORITY")


def is_credential_env(name, value=""):
    """Does the environment variable `name` (holding `value`) hold a credential? By the families of names:
    *_KEY, *_TOKEN, PGPASSWORD… and the session tokens of password-manager CLIs, named for what they open,
    not for being secret (BW_SESSION, OP_SESSION_<account>, any *_SESSION): those when the value looks
    generated, so that DESKTOP_SESSION=gnome and XDG_SESSION_PATH=/org/… stay ordinary words."""
    name = name.upper().replace("-", "_")
    if name in NOT_SECRET_ENV:
        return False
    words = name.split("_")
    if words[-1] in SECRET_ENV_SUFFIXES or name.endswith("APIKEY") or any(part in name for part in SECRET_ENV_PARTS):
        return True
    return "SESSION" in words and isinstance(value, str) and len(value) >= 16 and not value.startswith("/") \
        and re.fullmatch(r"[A-Za-z0-9+/=_.~-]+", value) is not None and re.search(r"[0-9]", value) is not None \
        and re.search(r"[A-Za-z]", value) is not None


#: names whose values are passwords (PGPASSWORD, MYSQL_PWD, DB_PASS): often words, registered whatever they look like
_PASSWORD_NAME = re.compile(r"PASSW(?:OR)?D|PASSPHRASE|(?:^|_)PASS$|PWD$")
#: a file's path: absolute, home- or dot-relative, or a Windows drive's
_PATH_VALUE = re.compile(r"(?:~|\.{1,2})?/[^\s\0]*|[A-Za-z]:[\\/][^\0]*")
#: a name (a header's, a cookie's, a setting's): letters in words joined by - _ . / (Authorization, csrftoken,
#: X-CSRF-Token, application/json), each word lower case, Capitalised or upper case
_NAME_VALUE = re.compile(r"[A-Za-z]+(?:[-_./][A-Za-z]+)*")
_HUMPS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+")
#: a run that looks generated: 12 or more characters mixing upper and lower case letters and digits
_GENERATED = re.compile(r"(?=[A-Za-z0-9_+=~-]{0,200}[0-9])(?=[A-Za-z0-9_+=~-]{0,200}[a-z])"
                        r"(?=[A-Za-z0-9_+=~-]{0,200}[A-Z])[A-Za-z0-9_+=~-]{12,}")


def env_credential(name, value):
    """Is `value`, held by the environment variable `name`, a credential to redact? Named like one
    (is_credential_env) and, by what it is, able to be one (round 19d: GOOGLE_APPLICATION_CREDENTIALS holds a
    path, CSRF_COOKIE_NAME=csrftoken a cookie's name, API_KEY_HEADER=Authorization a header's name; registered
    by name alone, the project's own settings reached the model as [REDACTED], and were written back so).
    Not one: a path to a file, a URL with no userinfo, query or generated-looking part, and a short name of a
    few words. A password-named variable's value is one whatever it looks like (passwords are words). What a
    project may reference (xzatoma_mcp.project_guard) still goes by the name alone."""
    if not is_credential_env(name, value) or not isinstance(value, str):
        return False
    value = value.strip()
    if len(value) < MIN_SECRET_LENGTH:
        return False  # not registered either way
    if _PATH_VALUE.fullmatch(value) and not _GENERATED.search(value):
        parts = [p for p in re.split(r"[\\/]", value) if p not in ("", "~", ".", "..")]
        if len(parts) > 1 or "." in value.rsplit("/", 1)[-1] or os.path.exists(os.path.expanduser(value)):
            return False
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]{0,30}://[^/?#@\s]*(?:[/#][^?@\s]*)?\Z", value) \
            and not _GENERATED.search(value):
        return False  # an endpoint: https://oauth2.googleapis.com/token (the password in a URL is registered apart)
    if _PASSWORD_NAME.search(name.upper().replace("-", "_")):
        return True
    # a few words are a header's, cookie's or setting's name only where the variable says it holds a name: a
    # secret of words (JWT_SECRET=mysupersecretkey, SESSION_SECRET=keyboard-cat-secret) is still one (19f)
    if len(value) <= 24 and _NAME_VALUE.fullmatch(value) and _NAMES_A_NAME.search(name.upper().replace("-", "_")):
        words = [_HUMPS.findall(word) for word in re.split(r"[-_./]", value)]  # X-CSRF-Token, csrfToken
        if sum(map(len, words)) <= 4 and all(len(w) == 1 or min(map(len, w)) > 1 for w in words):
            return False  # a header's, cookie's or setting's name; random letters change case more often
    return True


#: the end of a variable's name that says its value names something (CSRF_COOKIE_NAME, API_KEY_HEADER)
_NAMES_A_NAME = re.compile(r"_(NAME|HEADER|COOKIE|FIELD|PARAM|PARAMETER|PREFIX|ALGORITHM|ALG|TYPE|FORMAT|SCHEME|"
                           r"STRATEGY|BACKEND|PROVIDER|MODE|STYLE|ENV|REGION)$")


_secrets_lock = threading.Lock()
_known_secrets = ()  # every spelling of every registered secret, longest first
_view_needles = ()  # each secret and its base64 cores as the view reads them (_View.flat), longest first
_hex_needles = ()  # each secret's hex (and a hex secret itself), looked for in _View.hexflat
_prefixes = {}  # the needles -> (every beginning of every needle, the longest needle's length): partial_secret
_compiled = {}  # TOKEN_SHAPES index -> its regex, compiled the first time one of its triggers occurs
_any_trigger = []  # [regex of every trigger]: one C-speed look at a short text instead of a test per trigger
SHORT_TEXT = 256  #: up to this length the one look is faster; beyond, its alternation at each place is slower
QUICK_AFTER = 32  #: texts redacted before the one look is compiled (2 ms: a one-shot run redacts a few)
_redacted = [0]  # texts redacted so far (a count: threads may lose an increment, which costs nothing)


def register_secret(value):
    """Remember a credential this process knows, so redact() removes it wherever it appears."""
    global _known_secrets, _view_needles, _hex_needles
    if not isinstance(value, str):
        return
    value = value.strip()
    if len(value) < MIN_SECRET_LENGTH:
        return
    import html
    from urllib.parse import quote, quote_plus
    in_json = json.dumps(value)[1:-1]
    encoded = {quote(value, safe=""), quote(value), quote_plus(value, safe="")}  # a path, a query, a form
    spellings = {value, in_json, in_json.replace("/", "\\/"),  # as typed, in JSON, in JSON as PHP and Java write it
                 in_json.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"),  # as Go writes it
                 html.escape(value), html.escape(value, quote=False),  # quoted in an HTML error page
                 value.encode("utf-8", "surrogateescape").hex(), value.encode("utf-8", "surrogateescape").hex().upper()}
    spellings.update(encoded)
    spellings.update(re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), e) for e in encoded)  # %2f as well as %2F
    spellings.update(_base64_cores(value))
    # looked for in the view (_View), as it would read there: white space, escape sequences and tags dropped
    needles = {n for v in {value} | _base64_cores(value)
               for n in ("".join(v.split()), "".join(_MARKUP.sub("", v).split()))}
    # in the view of hex digits: its hex, as xxd, od and hexdump print it (round 19d: wrapped at 60 columns or
    # spaced, it went through), and a value that is hex itself, written with separators
    raw = value.encode("utf-8", "surrogateescape").hex()
    hexes = {raw, raw.upper()} | _swapped_words(value.encode("utf-8", "surrogateescape"))
    # a value that is hex itself, long and not a number (PGPASSWORD=20240101 redacted every 2024-01-01, 19f)
    if len(value) >= 16 and re.fullmatch(r"[0-9A-Fa-f]+", value) and not value.isdigit():
        hexes |= {value.lower(), value.upper()}
    with _secrets_lock:
        if not spellings <= set(_known_secrets):
            _known_secrets = tuple(sorted(spellings | set(_known_secrets), key=len, reverse=True))
        if not needles <= set(_view_needles) or not hexes <= set(_hex_needles):
            _view_needles = tuple(sorted(needles | set(_view_needles), key=len, reverse=True))
            _hex_needles = tuple(sorted(hexes | set(_hex_needles), key=len, reverse=True))


def _swapped_words(raw):
    """The hex of `raw` as `od -x` and `hexdump` print it: 16-bit words, each's two bytes swapped (little-endian),
    at both alignments, without the words at its edges that mix in other bytes (round 19f: all 16 words of a key
    went through)."""
    out = set()
    for k in (0, 1):
        data = b"\0" * k + raw + b"\0" * ((len(raw) + k) % 2)
        words = [data[i + 1:i + 2].hex() + data[i:i + 1].hex() for i in range(0, len(data), 2)]
        core = "".join(words[1:-1])
        if len(core) >= 16:
            out |= {core, core.upper()}
    return out


def _base64_cores(value):
    """The part of base64 that depends only on `value`, at each of the three alignments it can have
    inside a longer encoded text (`Basic base64(user:key)`, `base64("Bearer " + key)`, an echoed header),
    in the standard and the URL-safe alphabet: a server that echoes the credential encoded leaks it too."""
    import base64
    raw, out = value.encode("utf-8", "surrogateescape"), set()
    for k in range(3):
        enc = base64.b64encode(b"\0" * k + raw).decode("ascii").rstrip("=")
        start = 4 if k else 0  # the first group mixes the prefix's bytes with the value's
        end = len(enc) - (0 if (k + len(raw)) % 3 == 0 else 4)  # so may the last, with what follows
        core = enc[start:end]
        if len(core) >= MIN_SECRET_LENGTH + 4:  # long enough never to match ordinary text
            out.update((core, core.replace("+", "-").replace("/", "_")))
    return out


def _replace(match):
    keep = match.lastgroup
    return match.group(keep) + REDACTED if keep else REDACTED


def _compile():
    """The one look at a short text: a regex of every shape's trigger, compiled once (issue 22: most of what a
    long run or a watcher stores is short, and a test per trigger cost 36 us a text)."""
    if not _any_trigger:
        with _secrets_lock:
            if not _any_trigger:
                every = sorted({t for ts, _ in TOKEN_SHAPES for t in ts}, key=len, reverse=True)
                _any_trigger.append(re.compile("|".join(map(re.escape, every))))
    return _any_trigger[0]


def _shapes(lowered):
    """The compiled shapes whose triggers occur in `lowered`. Each is compiled when first needed: compiling
    all of them took 10-25 ms of a one-shot run, whose text wakes a few (start-up is a feature)."""
    for i, (triggers, shape) in enumerate(TOKEN_SHAPES):
        if any(trigger in lowered for trigger in triggers):
            pattern = _compiled.get(i)
            if pattern is None:  # two threads may both compile it: the same regex either way
                pattern = _compiled[i] = re.compile(shape)
            yield pattern


#: one escape, and the one character it stands for: URL (%41, and %2541 of encoding twice, at any depth),
#: backslash escapes (\u0041 of any character as JSON, JavaScript and Java write them, \\u0041 escaped again,
#: \U0001F600, \x41, \101, and a backslash before any character as printf %q and JSON's \/ write it; \n \r
#: \t \f \v stand for spaces), HTML character references (&#65; &#x41; &amp; … and &amp;amp; twice)
_ESCAPE = re.compile(r"%(?:25)*([0-9A-Fa-f]{2})|\\+(?:u\{?([0-9A-Fa-f]{4})\}?|U([0-9A-Fa-f]{8})|x([0-9A-Fa-f]{2})"
                     r"|([0-7]{3})|([nrtfv])|(.))|&(?:amp;)*(?:#[xX]([0-9A-Fa-f]{1,6});|#([0-9]{1,7});"
                     r"|(amp|lt|gt|quot|apos|shy|nbsp|zwj|zwnj|lrm|rlm);)", re.S)
_ENTITIES = {"amp": "&", "lt": "<", "gt": ">", "quot": '"', "apos": "'", "shy": "\u00ad", "nbsp": " ",
             "zwj": "\u200d", "zwnj": "\u200c", "lrm": "\u200e", "rlm": "\u200f"}


#: the commonest escapes, undone at C speed before the rest: JSON's and C's newlines, tabs, quotes and slashes
_PLAIN_ESCAPES = (("\\n", "  "), ("\\r", "  "), ("\\t", "  "), ('\\"', '"\x1f'), ("\\/", "/\x1f"))


def _unescape(match):
    """An escape as the character it stands for, padded to the escape's length with \\x1f (whitespace to
    str.split): the view keeps the text's indices, and the padding vanishes where whitespace is ignored."""
    escape = match.group()
    decoded = _unescaped.get(escape)
    if decoded is None:
        decoded = _decode(match)
        if len(_unescaped) < 4096:
            _unescaped[escape] = decoded
    return decoded


_unescaped = {}  # escape -> its padded character: texts repeat a few escapes many times (%20, \u0026)


def _decode(match):
    url, u4, u8, x2, octal, space, char, hexref, decref, named = match.groups()
    if char is not None or named is not None:  # \e and \E: ESC, as printf %q and bash write it (round 19f)
        decoded = ("\x1b" if char in "eE" else char) if char is not None else _ENTITIES[named]
    elif space is not None:
        decoded = " "
    else:
        number = url or u4 or u8 or x2 or hexref
        code = int(number, 16) if number else int(octal, 8) if octal else int(decref)
        decoded = chr(code) if code <= 0x10FFFF else "\ufffd"
    return (" " if decoded.isspace() else decoded).ljust(match.end() - match.start(), "\x1f")


#: what the view looks through between the characters of a known value (round 19d): white space (and the padding
#: of decoded escapes), terminal escape sequences (CSI as `grep --color=always` puts around a match inside a key,
#: OSC as a hyperlink wraps text, the other ESC sequences, 8-bit CSI) and markup tags (`<b>half</b><i>half</i>` of
#: an HTML error page). A tag is a name after '<', so `a < b` is not one; a tag written URL-encoded (`%3Cb%3E`, its
#: characters padded when decoded) is one (round 19f).
_MARKUP_PATTERN = (r"(?:\x1b\x1f*|\x9b)(?:\[[0-?\x1f]*[ -/]*[@-~]|[\]PX^_][^\x07\x1b\n]{0,512}\x07?|[ -/]*[0-~])|\x07"
                   r"|<\x1f*/?\x1f*[A-Za-z][A-Za-z0-9:-]{0,30}\x1f*(?:[ \t\r\n/][^<>]{0,512})?>")
#: and the characters that draw nothing: format characters (zero-width, bidi marks, the soft hyphen of &shy;)
#: and the controls a terminal ignores (NUL, SO, SI, DEL) put between a key's characters (round 19f)
_INVISIBLE = "[\x00\x0e\x0f\x7f\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]"
_DRAWS_NOTHING = re.compile(_INVISIBLE)
_LOOK_THROUGH = r"\s|%s|%s" % (_INVISIBLE, _MARKUP_PATTERN)
_IGNORED = LazyRegex("(?:%s)+" % _LOOK_THROUGH)
_MARKUP = re.compile(_MARKUP_PATTERN)  # alone, its literal beginnings are searched at C speed: half _IGNORED's time
#: and in the view of hex digits also the separators of hex dumps and byte lists (`71:5a`, `0x71, 0x5a`), a dump's
#: offsets (xxd, hexdump -C, od) and the printable column at the end of its lines, so one run of digits remains
# (a dump's offsets and printable column are tried first: \s would take their spaces one by one)
_HEX_IGNORED = LazyRegex(r"(?:(?m:^)[ \t]*[0-9A-Fa-f]{6,8}:?(?=[ \t])|(?<=[^ \t\n])[ \t]{2,}[^\n]{1,18}(?m:$)"
                          r"|%s|0[xX](?=[0-9A-Fa-f])|[:,;.'\"|-])+" % _LOOK_THROUGH)
#: what may follow a hex match on its line in a dump: the line's other bytes and its printable column (which
#: shows the value's last characters: redacted with it)
_DUMP_REST = LazyRegex(r"[0-9A-Fa-f \t:,]*[ \t]{2}[^\n]{1,18}")  # one class: no nested repetition
#: the end of a text that may be the beginning of an escape, an ESC sequence or a tag: a stream holds it
# (a run of backslashes is tried from its first only: from each, it was quadratic in a run, round 19f; a tag as
# long as the view looks through)
_OPEN_END = LazyRegex(r"(?:(?<!\\)\\+(?:[uUx]\{?[0-9A-Fa-f]{0,7})?|(?<!%25)%(?:25)*[0-9A-Fa-f]?"
                       r"|(?<!&amp;)&(?:amp;)*(?:#[xX]?[0-9A-Fa-f]{0,6}|[a-z]{0,4})|(?:\x1b|\x9b)[^\x07\n]{0,64}"
                       r"|</?[A-Za-z][^<>\n]{0,600})\Z")


class _View:
    """`text` as known values are searched in it (round 19d): every escape decoded once, padded to the escape's
    length (`view`, the text's own indices), then what _IGNORED looks through dropped (`flat`), and for hex
    needles also the separators of dumps (`hexflat`). Each of the two flat texts keeps a map back to the
    text: the runs it dropped, built only when something is found. One pass of C-speed substitution each, so
    the cost is linear in the text and bounded per needle by str.find."""

    def __init__(self, text):
        view = text
        if "\x1b\\" in view:  # the string terminator ESC \ as BEL: the backslash is no escape's beginning
            view = view.replace("\x1b\\", "\x07\x07")
        if "\\" in view:
            for escape, padded in _PLAIN_ESCAPES:
                view = view.replace(escape, padded)
        if "%" in view or "\\" in view or "&" in view:
            view = _ESCAPE.sub(_unescape, view)
        self.text, self.view, self._maps = text, view, {}
        self.marked = "\x1b" in view or "\x9b" in view or "<" in view or "\x07" in view
        # C speed where only white space is looked through (most text): str.split knows the same spaces as \s
        flat = _MARKUP.sub("", view) if self.marked else view
        if _DRAWS_NOTHING.search(flat):
            flat = _DRAWS_NOTHING.sub("", flat)
        self.flat = "".join(flat.split())  # what _IGNORED drops
        self._hexflat = None

    @property
    def hexflat(self):
        if self._hexflat is None:
            self._hexflat = _HEX_IGNORED.sub("", self.view)
        return self._hexflat

    def original(self, k, hexes=False):
        """The index in the text of the flat text's character k (or of the end, k == len(flat))."""
        import bisect
        gaps = self._maps.get(hexes)
        if gaps is None:
            gap_at, gap_removed, removed = [], [], 0  # where each dropped run was, and how much was dropped
            for m in (_HEX_IGNORED if hexes else _IGNORED).finditer(self.view):
                removed += m.end() - m.start()
                gap_at.append(m.end() - removed)
                gap_removed.append(removed)
            gaps = self._maps[hexes] = (gap_at, gap_removed)
        gap_at, gap_removed = gaps
        i = bisect.bisect_right(gap_at, k)
        return k + (gap_removed[i - 1] if i else 0)

    def span(self, a, b, hexes=False):
        """The text's (start, end) of the flat text's characters a..b."""
        start, end = self.original(a, hexes), self.original(b - 1, hexes) + 1
        text, view = self.text, self.view
        while end < len(text) and view[end] == "\x1f" != text[end]:
            end += 1  # the rest of the escape the last character came from
        if hexes:  # a dump's line goes on with the value's characters in its printable column
            line_end = text.find("\n", end)
            line_end = len(text) if line_end == -1 else line_end
            if line_end - end <= 80 and _DUMP_REST.fullmatch(text, end, line_end):
                end = line_end
        return start, end


def _hex_gate():
    """A regex of the first two bytes of every hex needle, and of its second and third (a dump's line may end
    between two of them), with a few separators between: the hex view costs 0.2 s a megabyte, this look 5 ms,
    so the view is made only where it can find something. One alternation of literal beginnings is searched
    at C speed; compiled when first needed after a secret is added."""
    needles = _hex_needles
    gate = _hex_gates.get(needles)
    if gate is None:
        pairs = {(n[i:i + 2], n[i + 2:i + 4]) for n in needles for i in (0, 2)}
        gate = re.compile("|".join(r"%s[^0-9A-Za-z]{0,6}(?:0[xX])?%s" % pair for pair in sorted(pairs)) or "(?!)")
        _hex_gates.clear()
        _hex_gates[needles] = gate
    return gate


_hex_gates = {}  # the hex needles -> their gate (the last one only)


def _decoded_spans(text):
    """Where in `text` a known value stands in the view (see _View): [(start, end)]."""
    if not _view_needles:
        return []
    seen = _View(text)
    spans = []
    for hexes, needles in ((False, _view_needles), (True, _hex_needles)):
        if hexes and not _hex_gate().search(seen.view):
            break  # no two of a value's first bytes in hex anywhere: its hex view would find nothing
        flat = seen.hexflat if hexes else seen.flat
        for needle in needles:
            at = flat.find(needle)
            while at != -1:
                spans.append(seen.span(at, at + len(needle), hexes))
                at = flat.find(needle, at + 1)
    return spans


def redact(text, shapes=True):
    """`text` with known secrets and (unless shapes=False) credential shapes replaced by [REDACTED]."""
    if not text or not isinstance(text, str):
        return text
    if len(text) <= SHORT_TEXT or len(text) > 65536 or not shapes:
        return _redact(text, shapes)
    # INFO: a watcher stores the same system prompt, environment and plan for every event, and their shapes'
    # triggers cost 1.3 ms an event; a long text redacted lately is answered from the last few, for the
    # secrets known now (a secret registered since makes a new key)
    key = (_known_secrets, text)
    done = _redact_memo.get(key)
    if done is None:
        done = _redact(text, shapes)
        if len(_redact_memo) >= 32:
            _redact_memo.clear()
        _redact_memo[key] = done
    return done


_redact_memo = {}  # (the known secrets, a long text) -> the text redacted, for the last few (cleared at 32)


def _redact(text, shapes):
    for secret in _known_secrets:  # longest first: no half-redacted secrets
        if secret in text:
            text = text.replace(secret, REDACTED)
    spans = sorted(_decoded_spans(text))
    if spans:
        merged = [list(spans[0])]
        for start, end in spans[1:]:
            if start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        for start, end in reversed(merged):
            text = text[:start] + REDACTED + text[end:]
    if not shapes:
        return text
    lowered = text.lower()
    _redacted[0] += 1
    if len(lowered) <= SHORT_TEXT and _redacted[0] > QUICK_AFTER and not _compile().search(lowered):
        return text  # no shape's trigger: nothing below would apply
    for pattern in _shapes(lowered):
        text = pattern.sub(_replace, text)
    return text


def redaction_spans(text):
    """(start, end) of what redact() would replace in `text` (for streams that must not cut a secret)."""
    spans = _decoded_spans(text)
    for secret in _known_secrets:
        start = text.find(secret)
        while start != -1:
            spans.append((start, start + len(secret)))
            start = text.find(secret, start + 1)
    for pattern in _shapes(text.lower()):
        spans.extend(m.span() for m in pattern.finditer(text))
    return spans


def _needle_prefixes():
    """Every beginning of every needle (a set, looked up once per tail length), and the longest needle's length:
    made when a stream first needs them after a secret is added, not at each registration (start-up)."""
    needles = _view_needles + _hex_needles
    made = _prefixes.get(needles)
    if made is None:
        made = (frozenset(n[:k] for n in needles for k in range(1, len(n))), max(map(len, needles), default=0))
        _prefixes.clear()
        _prefixes[needles] = made
    return made


def partial_secret(text):
    """Where the longest tail of `text` that may be the beginning of a known value starts, or None: a stream
    holds that tail until the rest arrives, so that it shows what the whole-text redactor would (round 19d:
    a key split by spaces into six pieces went out, as the stream held three words). The tail is taken in
    the view redact() searches (white space, escape sequences, tags and escapes looked through), and an
    escape, an ESC sequence or a tag cut off at the end is held too."""
    best = None
    opened = _OPEN_END.search(text, max(0, len(text) - 700))  # what it can match is shorter
    if opened is not None and opened.start() < len(text):
        best = opened.start()
    prefixes, longest = _needle_prefixes()
    if not prefixes or not text:
        return best
    # what comes before an open tag or escape, as the view will read it once that closes: the half of a key
    # before a long `<span title="…">` went out while the tag was still arriving (round 19f)
    seen = _View(text if best is None else text[:best])
    for hexes in (False, True):
        if hexes and not _hex_gate().search(seen.view):
            break  # no hex of a value's first bytes here: no hex view (it was built for every delta, round 19f)
        flat = seen.hexflat if hexes else seen.flat
        for k in range(min(longest - 1, len(flat)), 0, -1):
            if flat[-k:] in prefixes:
                start = seen.original(len(flat) - k, hexes)
                best = start if best is None else min(best, start)
                break
    return best


def redact_data(obj):
    """A copy of JSON-like data with every string redacted (keys too)."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {redact_data(k): redact_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [redact_data(v) for v in obj]
    return obj


class Redactor:
    """redact() as an object, registering the secrets it is given (kept for callers that hold one)."""

    def __init__(self, secrets=()):
        for secret in secrets or ():
            register_secret(secret)

    def __call__(self, text):
        return storable(redact(text))


def storable(text):
    """Text that UTF-8 files and sqlite accept: a lone surrogate (a byte of a file name that is not UTF-8,
    as os.listdir decodes it) is kept as its visible escape `\\udcff` instead of failing the whole write."""
    if isinstance(text, str):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


# ---- Fetched HTML as text (the fetch tool's pages) ----
# Round 19a: a hostile page must cost time and memory in proportion to its size, under the fetch's deadline.
# Every step here is linear: no regex that can rescan a run (re.sub(r"[ \t]+\n") over 300 KB of blanks in a
# <pre> took 80 s), no join of a growing tail per tag (unclosed <a>s, then as many </a>), no indentation
# that grows with nesting ("  " * depth made 13.5 KB of <ul> 4.5 MB of text). The parser is fed in pieces so
# a deadline between them cuts whatever is slow, and the text stops growing at the size it would be cut to.

LIST_INDENT_MAX = 8  #: deepest list shown by indentation; deeper ones are indented as this one
TITLE_MAX = 1000  #: characters of <title> kept
#: what may stand in <head>; any other start tag or text ends it, as HTML's parser does (round 19a: a page
#: that left out the optional </head> lost its whole body)
HEAD_CONTENT = frozenset(("meta", "link", "title", "style", "script", "noscript", "base", "template", "basefont",
                          "bgsound"))
_HTML_GUARDED = ("parse_starttag", "parse_endtag", "parse_comment", "parse_pi", "parse_html_declaration",
                 "parse_bogus_comment", "parse_marked_section", "parse_declaration")


def html_to_text(html, base_url="", limit=None, deadline=None):
    """Readable text from HTML: headings, paragraphs, lists, links as 'text (url)', pre kept; noise dropped.

    Linear in the page. `limit` (characters) stops the text at that size; `deadline` (time.monotonic())
    stops the conversion, keeping what was converted, with a note. A construct that cannot be read (a link
    urljoin refuses, a marked section html.parser asserts on) costs that construct only, never the page."""
    from html.parser import HTMLParser

    class Converter(HTMLParser):
        SKIP = {"script", "style", "nav", "noscript", "template", "svg", "iframe", "object", "canvas"}
        BLOCK = {"p", "div", "section", "article", "main", "header", "footer", "aside", "table", "tr", "ul", "ol",
                 "dl", "dt", "dd", "blockquote", "figure", "figcaption", "form", "hr", "address", "details",
                 "summary"}

        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.out, self.size, self.trail, self.full = [], 0, 0, False  # trail: newlines ending the text
            self.skip, self.pre, self.link, self.lists = 0, 0, None, []  # link: (href, index in out) or None
            self.title, self.title_size, self.in_title, self.in_head = [], 0, False, False

        def emit(self, s):
            if self.full or not s:
                return
            if limit is not None and self.size + len(s) >= limit:
                s, self.full = s[:limit - self.size], True
            self.out.append(s)
            self.size += len(s)
            bare = s.rstrip("\n")
            self.trail = self.trail + len(s) if not bare else len(s) - len(bare)

        def newline(self, n=1):
            if self.out and self.trail < n:
                self.emit("\n" * (n - self.trail))

        def close_link(self):
            from urllib.parse import urljoin
            href, start = self.link
            self.link = None
            if not href or href.startswith(("#", "javascript:", "mailto:")) or start > len(self.out):
                return
            text = "".join(self.out[start:]).strip()
            try:
                url = urljoin(base_url, href)
            except ValueError:  # round 19a: href="http://[[url]]" made the whole page an error
                url = href
            self.size -= sum(map(len, self.out[start:]))
            del self.out[start:]
            self.trail = 0
            self.full = False
            self.emit("%s (%s)" % (text, url) if text and text != url else url)

        # Each handler's failure costs its own construct (round 19a), never the page.
        def handle_starttag(self, tag, attrs):
            try:
                self.start(tag, attrs)
            except Exception:
                pass

        def handle_endtag(self, tag):
            try:
                self.end(tag)
            except Exception:
                pass

        def handle_data(self, data):
            try:
                self.data(data)
            except Exception:
                pass

        def start(self, tag, attrs):
            if tag == "title":
                self.in_title = True
            if tag == "head":
                self.in_head = True
                return
            if self.in_head and tag not in HEAD_CONTENT:
                self.in_head = False
            if tag in self.SKIP:
                self.skip += 1
                return
            if self.skip:
                return
            attrs = dict(attrs)
            if tag in ("h1", "h2", "h3", "h4", "h5", "h6"):
                self.newline(2)
                self.emit("#" * int(tag[1]) + " ")
            elif tag == "br":
                self.emit("\n")
            elif tag == "pre":
                self.newline(2)
                self.pre += 1
            elif tag in ("ul", "ol"):
                self.lists.append([tag, 0])
                self.newline()
            elif tag == "li":
                self.newline()
                indent = "  " * min(max(len(self.lists) - 1, 0), LIST_INDENT_MAX)
                if self.lists and self.lists[-1][0] == "ol":
                    self.lists[-1][1] += 1
                    self.emit(indent + "%d. " % self.lists[-1][1])
                else:
                    self.emit(indent + "- ")
            elif tag == "a":
                if self.link is not None:  # links do not nest: a new <a> ends the open one, as in HTML
                    self.close_link()
                self.link = (attrs.get("href") or "", len(self.out))
            elif tag in ("td", "th"):
                self.emit(" | ")
            elif tag == "img" and attrs.get("alt"):
                self.emit("[image: %s]" % attrs["alt"])
            elif tag in self.BLOCK:
                self.newline(2 if tag in ("p", "blockquote", "table") else 1)

        def end(self, tag):
            if tag == "title":
                self.in_title = False
            if tag in ("head", "body"):
                self.in_head = False
            if tag in self.SKIP:
                self.skip = max(0, self.skip - 1)
                return
            if self.skip:
                return
            if tag == "a":
                if self.link is not None:
                    self.close_link()
            elif tag == "pre":
                self.pre = max(0, self.pre - 1)
                self.newline(2)
            elif tag in ("ul", "ol"):
                if self.lists:
                    self.lists.pop()
                self.newline()
            elif tag in ("h1", "h2", "h3", "h4", "h5", "h6", "p", "blockquote", "table"):
                self.newline(2)
            elif tag in self.BLOCK or tag == "li":
                self.newline()

        def data(self, data):
            if self.in_title:
                if self.title_size < TITLE_MAX:
                    self.title.append(data[:TITLE_MAX - self.title_size])
                    self.title_size += len(self.title[-1])
                return
            if self.in_head:
                if not data.strip():
                    return
                self.in_head = False  # text ends the head
            if self.skip or self.full:
                return
            if self.pre:
                self.emit(data)
                return
            text = re.sub(r"\s+", " ", data)
            last = self.out[-1] if self.out else ""
            if text.strip() or (last and not last.endswith((" ", "\n"))):
                if last.endswith(("\n", " ", "- ", ". ")) and text.startswith(" "):
                    text = text.lstrip()
                self.emit(text)

    def guarded(name):
        method = getattr(HTMLParser, name, None)
        if method is None:
            return None

        def parse(self, i, *args, **kwargs):
            try:
                return method(self, i, *args, **kwargs)
            except Exception:  # round 19a: <![foo[ x ]]> raised AssertionError out of feed(); drop it alone
                end = self.rawdata.find(">", i + 1)
                return end + 1 if end >= 0 else -1  # -1: not complete yet (at the end: shown as text)
        return parse

    for name in _HTML_GUARDED:
        if (parse := guarded(name)) is not None:
            setattr(Converter, name, parse)

    # A '<' with no '>' after it can start no tag, and html.parser scans to the end of the page from each
    # one (before Python 3.11.13/3.12.11): '<a ' repeated made 200 KB take minutes. They become text.
    last = html.rfind(">")
    if "<" in html[last + 1:]:
        html = html[:last + 1] + html[last + 1:].replace("&", "&amp;").replace("<", "&lt;")
    html = _capped_charrefs(_unclosable_as_text(html))
    conv = Converter()
    piece = max(65536, len(html) // 16)  # 16 pieces or more: a construct left open is rescanned that often
    stopped = None
    done = 0
    try:
        while done < len(html) and not conv.full:
            if deadline is not None and time.monotonic() >= deadline:
                stopped = "[The rest of the page was not converted: the fetch's time limit was reached]"
                break
            conv.feed(html[done:done + piece])
            done += piece
        if stopped is None and not conv.full:
            if deadline is not None and time.monotonic() >= deadline:  # close() parses what feed() held back
                stopped = "[The rest of the page was not converted: the fetch's time limit was reached]"
            elif "<" in conv.rawdata[1:] and not conv.cdata_elem:  # markup after a construct that never
                rest, conv.rawdata = conv.rawdata, ""  # ended: close() would search the rest once per construct
                if not conv.skip:  # (round 19f2); as plain text it is linear
                    conv.newline(2)
                    conv.emit(_plain_text(rest))
            else:
                conv.close()
    except Exception:  # the parser cannot go on: the rest of the page as plain text, never an error
        conv.newline(2)
        conv.emit(_plain_text(html[_html_offset(html, *conv.getpos()):]))
    text = "".join(conv.out)
    text = "\n".join(line.rstrip(" \t") for line in text.split("\n"))
    text = re.sub(r"\n{3,}", "\n\n", text).strip()
    title = " ".join("".join(conv.title).split())
    if title and not text.startswith("# "):
        text = "# %s\n\n%s" % (title, text)
    if stopped:
        text += "\n\n" + stopped
    return text + "\n"


def _html_offset(html, lineno, offset):
    """The index in `html` of html.parser's getpos() (line from 1, column from 0)."""
    index = 0
    for _ in range(lineno - 1):
        index = html.find("\n", index) + 1
        if index == 0:
            return len(html)
    return min(index + offset, len(html))


def _plain_text(html):
    """Text of markup the parser gave up on: tags dropped, entities decoded, blanks collapsed (linear: a tag
    is matched up to the next '<', never rescanned to the end)."""
    from html import unescape
    return re.sub(r"\s+", " ", unescape(_capped_charrefs(re.sub(r"<[^<>]*>", " ", html)))).strip()


# Round 19f2: html.parser's close() turns each construct it could not finish into text up to the next '>' and
# parses on from there, searching the rest of the page for that construct's end again: '<!--x>' repeated (no
# '-->' anywhere after) made 1 MB take 250 s, past every time limit. A comment or marked section that opens
# after the last place it could close can never close: its '<' becomes text here, in one pass. A comment's
# end is the one the running html.parser looks for (3.11: '--\s*>', later ones '--!?>'), and a marked section
# needs the strictest end ']]>' (a '<![if x]>' after the last ']]>' is shown as text: escaping one opener too
# many only shows it, one too few is quadratic). What else stays unfinished is read as plain text, not by close().
_COMMENT, _MARKED, _MARKED_END = re.compile(r"<!--"), re.compile(r"<!\["), re.compile(r"\]\s*\]\s*>")


def _unclosable_as_text(html):
    from html import parser
    comment_end = getattr(parser, "commentclose", None) or re.compile(r"--\s*>")
    for opener, closer, skip in ((_COMMENT, comment_end, 4), (_MARKED, _MARKED_END, 3)):  # skip: where the
        end = -1  # parser starts looking for the end, from the opener
        for end in (m.start() for m in closer.finditer(html)):
            pass
        first = opener.search(html, max(0, end - skip + 1))  # the first whose end search starts past the last end
        if first:
            html = html[:first.start()] + opener.sub(lambda m: "&lt;" + m.group()[1:], html[first.start():])
    return html


# Round 19f2: html.unescape reads a numeric reference with int(), which refuses more than 4300 digits
# ('&#' + '0' * 5000 + '65;' made the whole page an error). Leading zeros go; a reference with more digits
# than any code point has becomes U+FFFD, as one past U+10FFFF does anyway. Linear: each run of digits once.
_CHARREF = re.compile(r"&#(?:([xX])0*([0-9a-fA-F]+)|0*([0-9]+))")


def _capped_charrefs(text):
    if "&#" not in text:
        return text

    def capped(m):
        if m.group(1):
            return "&#x" + m.group(2) if len(m.group(2)) <= 6 else "&#xFFFD"
        return "&#" + m.group(3) if len(m.group(3)) <= 7 else "&#65533"
    return _CHARREF.sub(capped, text)


# ---- Untrusted text for terminals ----
# Here, beside redaction, so that everything that shows stored text (history, replay) needs no tools.
# What a model, a file, a command or a server says reaches people only through render_untrusted: control
# characters, escape sequences and invisible formatting are shown as visible escapes (`\x1b`, `\u202e`),
# never emitted. Issue 12: `rm -r src #ESC[2K\r  $ ls -la` was displayed as `$ ls -la` and approved.
# Decided by the Unicode category, not by a list, so a character nobody thought of fails closed.

_RISKY_RUN = re.compile(r"[^\t\n\x20-\x7e]+")  # printable ASCII, tab and newline pass untouched (fast path)
_HIDDEN_IN_TEXT = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")  # controls, format (bidi, zero-width), unassigned
_JOINERS = ("\u200c", "\u200d")  # ZWNJ/ZWJ: Persian, Indic scripts and emoji sequences need them in prose
_visible_memo = {}


def _escape_char(ch):
    cp = ord(ch)
    if ch == "\r":
        return "\\r"
    return "\\x%02x" % cp if cp < 0x100 else "\\u%04x" % cp if cp < 0x10000 else "\\U%08x" % cp


def _visible_char(ch, exact):
    """`ch` as a terminal may show it: itself, or a visible escape."""
    key = (ch, exact)
    shown = _visible_memo.get(key)
    if shown is None:
        import unicodedata
        category = unicodedata.category(ch)
        hidden = category in _HIDDEN_IN_TEXT and not (category == "Co" and not exact)
        if hidden and not exact and ch in _JOINERS:
            hidden = False
        if exact and not hidden:  # a command or path: anything that could pass for something else is shown
            hidden = category in ("Zs", "Mn", "Me") or ch in _JOINERS
        shown = _escape_char(ch) if hidden else ch
        if len(_visible_memo) < 8192:
            _visible_memo[key] = shown
    return shown


def render_untrusted(text, exact=False):
    """Text from a model, file, command or server, safe to write to a terminal.

    Newline and tab stay; CRLF becomes a newline; everything else that is not printable ASCII is kept only
    when it is a visible character: C0/C1 controls (ESC, so every escape sequence, a lone CR, backspace),
    DEL, bidirectional overrides and isolates, zero-width and other format characters, line/paragraph
    separators, surrogates and unassigned code points are shown as `\\x1b`, `\\u202e`, `\\U000e0041`.
    exact=True (a command to approve, a path) also shows non-ASCII spaces, combining marks, joiners and
    private-use characters, so what is shown is exactly what will run.
    """
    if text is None:
        return ""
    if not isinstance(text, str):
        text = str(text)
    if "\r\n" in text:
        text = text.replace("\r\n", "\n")
    if _RISKY_RUN.search(text) is None:
        return text
    return _RISKY_RUN.sub(lambda m: "".join(_visible_char(ch, exact) for ch in m.group()), text)


def render_json(obj, **dumps_args):
    """JSON for stdout: secrets redacted in every string, and the characters render_untrusted would show
    written as \\u escapes (the same data for a parser, nothing a terminal acts on)."""
    text = json.dumps(redact_data(obj), ensure_ascii=False, **dumps_args)

    def escape(match):
        out = []
        for ch in match.group():
            if _visible_char(ch, False) == ch:
                out.append(ch)
            else:
                units = ch.encode("utf-16-be", "surrogatepass")
                out.extend("\\u%02x%02x" % (units[i], units[i + 1]) for i in range(0, len(units), 2))
        return "".join(out)
    return _RISKY_RUN.sub(escape, text)


class UntrustedStream:
    """Renders streamed text (the chat's answer) delta by delta, redacted and neutralised.

    A secret or a CRLF can be split across deltas: the last few words (and an open PEM block, and whatever
    may still become a known value in redact()'s view: partial_secret) wait for the next delta or for
    finish(), so redaction sees them whole and the terminal shows what a pipe and the store do.
    """

    HOLD_WORDS = 3  # 'Authorization: Bearer <token>' is three words
    MAX_HOLD = 8192
    #: held text longer than this is looked at again only when it has grown by half: a secret's shape that
    #: never ends (a key block's base64 streamed on and on) is held whole, and rescanning all of it for each
    #: delta was quadratic (80 KB took 30 seconds, a megabyte more than an hour)
    RESCAN_FROM = 1024

    def __init__(self):
        self.pending = ""
        self._next_scan = 0  # the held length at which to look again

    def feed(self, text):
        text = self.pending + (text or "")
        if len(text) < self._next_scan:
            self.pending = text
            return ""
        cut = self._cut(text)
        for start, end in redaction_spans(text):  # never emit half of a secret: hold it whole
            if start < cut < end:
                cut = start
        partial = partial_secret(text)  # what redact() could still join to a known value (round 19d)
        if partial is not None and partial < cut and len(text) - partial < self.MAX_HOLD:
            cut = partial
        self.pending = text[cut:]
        held = len(self.pending)
        self._next_scan = held + held // 2 if held > self.RESCAN_FROM else 0
        return self._render(text[:cut])

    def finish(self):
        text, self.pending, self._next_scan = self.pending, "", 0
        return self._render(text)

    def _cut(self, text):
        """Where the held tail starts: before the last few words, an open PEM block or a CR."""
        if len(text) > self.MAX_HOLD:
            return len(text) - self.MAX_HOLD // 2
        begin = text.rfind("-----BEGIN")
        if begin != -1 and text.find("-----END", begin) == -1:
            return begin
        cut = len(text)
        while cut > 0 and text[cut - 1].isspace():
            cut -= 1
        for _ in range(self.HOLD_WORDS):
            while cut > 0 and not text[cut - 1].isspace():
                cut -= 1
            if cut == 0:
                return 0
            if _ < self.HOLD_WORDS - 1:
                while cut > 0 and text[cut - 1].isspace():
                    cut -= 1
        while cut > 0 and text[cut - 1] == "\r":  # half of a CRLF waits for its LF
            cut -= 1
        return cut

    @staticmethod
    def _render(text):
        if not text:
            return ""
        return render_untrusted(redact(text))


def preview_arguments(args):
    """A short argument summary for progress lines: the path, pattern, command or URL when there is one.
    Redacted here, before any cut: the model's arguments can hold a credential, and the line is cut to its
    width further on (a key cut in two was shown as its first half)."""
    if isinstance(args, str):
        try:
            args = json.loads(args or "{}")
        except ValueError:
            return redact(args)[:80]
    if not isinstance(args, dict):
        return redact(json.dumps(args, ensure_ascii=False))[:80]
    for key in ("path", "glob", "pattern", "command", "url", "source_path", "label"):
        if isinstance(args.get(key), str):
            return redact(args[key]) if key == "command" else one_line_path(redact(args[key]))
    return redact(json.dumps(args, ensure_ascii=False))[:80]


def json_type(value):
    """The JSON name of a value's type, for errors: a tool's argument, a plan's field ("must be text, got array")."""
    return {dict: "object", list: "array", str: "string", bool: "boolean",
            int: "integer", float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def fmt_size(n):
    """A size in bytes for people: 512 B, 1.5 KB, 32.0 MB."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0


#: what str.split() takes for a space but a terminal would not show as one (form feed, vertical tab, the
#: separators U+001C-U+001F, NEL, U+2028/U+2029): shown as an escape, never collapsed into a blank
_SPLIT_CONTROLS = "\x0b\x0c\x1c\x1d\x1e\x1f\x85\u2028\u2029"

#: how much of a long text one_line reads: it shows a line, and redact() costs ~0.3 s per MB (`history show`
#: passed every stored tool result whole)
_ONE_LINE_SCAN = 65536


def one_line(text, width=100):
    """`text` (anything: an exception, a stored result) as one line of at most `width` characters for people:
    secrets redacted before the cut, runs of white space folded into one blank, cut with an ellipsis. The one
    version for the whole program (the watcher's log lines too)."""
    text = str(text)
    if len(text) > _ONE_LINE_SCAN:  # without the word the bound splits: it could be a credential's beginning
        text = text[:_ONE_LINE_SCAN]
        last = text.split()[-1:]  # the last word, where the bound falls inside one (unless it is all there is)
        if last and not text[-1].isspace() and len(last[0]) < len(text):
            text = text[:len(text) - len(last[0])]
    text = redact(text)  # before the cut: a secret cut in two is no longer one redact() knows
    if any(ch in text for ch in _SPLIT_CONTROLS):  # `a\x0cb.txt` was shown as `a b.txt`
        text = "".join(_escape_char(ch) if ch in _SPLIT_CONTROLS else ch for ch in text)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def bounded_text(text, limit):
    """(`text` cut to at most `limit` bytes of UTF-8 at a character's end, whether it was cut): the one way a
    text is held to a size in bytes (a tool's output, a subagent's summary, a result event's fields). Half a
    character (a lone surrogate: a byte of a file name that is not UTF-8, or from a model's escaped reply)
    counts as the '?' it is sent as, and never makes an encoding error."""
    text = text or ""
    if len(text) * 4 <= limit:  # no character takes more than four bytes
        return text, False
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text, False
    return data[:limit].decode("utf-8", "ignore"), True


def one_line_path(path):
    """A path for a line shown to people: a newline, tab or CR in a name is shown as `\\n`, never obeyed, so a
    name cannot forge a second line of progress or push a question's end out of sight."""
    if any(ch in path for ch in "\n\r\t"):
        path = path.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return path


# ---- Private files: XZATOMA_HOME 0700, the files in it 0600 ----
# The database, the audit log, the chat history and credentials hold what people typed, what files said and
# what commands printed: nobody else on the machine reads them (issue 12 found conversations.db 0644 in a
# 0755 directory).


def private_dir(path):
    """Create `path` (and missing parents) 0700, or take group/other access away from it."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    _tighten(path, 0o700)
    return path


def private_files_in(path):
    """Take group/other access away from every file directly in `path` (XZATOMA_HOME): what an older version
    or another tool left loose (a 0644 undo.key, chat_history, credentials.json, audit.log.1) is tightened at
    the next start, not only the files this run happens to create. Not credentials.json: a loose one is
    refused with the reason (the key may have been read already; a person must know), never quietly fixed."""
    import stat
    try:
        names = os.listdir(path)
    except OSError:
        return
    for name in names:
        full = os.path.join(path, name)
        try:
            st = os.lstat(full)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077 and name != "credentials.json":
            _tighten(full, 0o600)


class NotRegularFile(OSError):
    """A path meant for a private file names a directory, FIFO, socket or device."""


def private_file(path, follow=False):
    """Create `path` empty 0600 unless it exists, or tighten it to 0600: only ever a regular file, judged by fstat
    on an O_NOFOLLOW descriptor and changed through it (round 19d: a db_path naming a directory, a FIFO or
    /dev/null had it chmod-ed 0600). Anything else raises NotRegularFile, untouched. A symlink is left alone,
    unless `follow`: then its target is created (O_EXCL) or tightened (the database: sqlite follows the link, and
    gives its -wal and -shm the mode of the file it reaches; round 19d found one made through a link 0644)."""
    target = os.path.realpath(path) if follow else path
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(target, flags | os.O_CREAT | os.O_EXCL, 0o600)
        created = True
    except FileExistsError:
        st = os.lstat(target)
        if stat.S_ISLNK(st.st_mode):
            return path  # not ours to change (not followed, or put there since realpath looked)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, "is %s, not a file" % _file_kind(st.st_mode), path)
        fd = os.open(target, flags | getattr(os, "O_NONBLOCK", 0))  # swapped for a FIFO meanwhile: never blocks
        created = False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, "is %s, not a file" % _file_kind(st.st_mode), path)
        if created or (st.st_uid == os.getuid() and st.st_mode & 0o077):  # new: 0600 whatever the umask took
            os.fchmod(fd, 0o600 if created else stat.S_IMODE(st.st_mode) & 0o600)
    finally:
        os.close(fd)
    return path


def _file_kind(mode):
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return name
    return "not a regular file"


def write_private(path, text):
    """Write `path` whole, 0600: through `path`.tmp, created O_EXCL|O_NOFOLLOW (a leftover, or a link planted
    in its place, is removed, never written through), then renamed over it (readers see the old or the new)."""
    tmp = path + ".tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        os.fchmod(fd, 0o600)  # whatever the umask took away
        fh.write(text)
    os.replace(tmp, path)


def _tighten(path, mode):
    """Take group/other access away from `path`: a directory (mode 0700) or a regular file (0600), nothing else."""
    try:
        st = os.lstat(path)
        import stat
        if not (stat.S_ISDIR if mode & 0o100 else stat.S_ISREG)(st.st_mode) or st.st_uid != os.getuid():
            return  # not ours to change (a link, a device, a FIFO, or someone else's)
        if st.st_mode & 0o077:
            os.chmod(path, st.st_mode & mode & 0o7777)
    except (OSError, AttributeError):  # gone, or no getuid (not POSIX)
        pass


# ---- Diffs: a change shown in lines, bounded; what may be wrong with a change ----

PATCH_SUFFIXES = (".diff", ".patch")


WHITESPACE_ONLY = "the change to %s altered only whitespace"
LINES_GONE = "write_file replaced all of %s and %d of its earlier lines are gone (%s)"
EDIT_LINES_GONE = "edit_file removed %d line%s of %s (%s)"
APPENDED = "edit_file added new_text at the end of %s (an empty old_text appends)"
ESCAPED_BREAKS = "%s holds \\n written out (a backslash and an n) where a line break was meant"


def escaped_breaks(text):
    """Whether a text has no line break but `\\n` written out, outside any quotes: a small model's JSON escaped
    once too often ("## 1.0.0\\n- first release" became CHANGES.md's one line). In quotes it is code's own."""
    if "\\n" not in text or "\n" in text.rstrip("\n"):
        return False
    import re
    return "\\n" in re.sub(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', "", text)


def change_doubt(shown, old, new, whole=False, within=None):
    """Why a change may not be the one meant, for the loop to ask about before the run ends (None: no doubt):
    it altered only whitespace (a model "fixed" a line by rewriting the file as it was), or, for a whole
    rewrite, the file's earlier lines are gone (a model asked to add a line wrote only that line); for an edit
    of whole lines of the file `within`, lines it removed (asked to add a line, a model replaced one with it);
    or the new text writes its line breaks out as `\\n` (escaped_breaks). `old` is None for a new file."""
    if escaped_breaks(new):
        return ESCAPED_BREAKS % shown
    if old is None or old == new:
        return None
    if "".join(old.split()) == "".join(new.split()):
        return WHITESPACE_ONLY % shown
    if within is not None and old.strip() and _whole_lines(within, old):
        kept = set(line.strip() for line in new.splitlines())
        gone = [line.strip() for line in old.splitlines() if line.strip() and line.strip() not in kept]
        if gone:
            return EDIT_LINES_GONE % (len(gone), "" if len(gone) == 1 else "s", shown, "; ".join(gone[:3]) + (
                " …" if len(gone) > 3 else ""))
    if whole and old.strip():
        import difflib
        kept = set(line.strip() for line in new.splitlines())
        # a line changed in place (a rename: `cnt = 1` → `count = 1`) is not gone; one with no like of it is
        gone = [line.strip() for line in old.splitlines() if line.strip() and line.strip() not in kept
                and not difflib.get_close_matches(line.strip(), kept, n=1, cutoff=0.75)]
        if gone:
            return LINES_GONE % (
                shown, len(gone), "; ".join(one for one in gone[:3]) + (" …" if len(gone) > 3 else ""))
    return None


def _whole_lines(text, part):
    """Whether `part` stands in `text` as whole lines (from a line's start to a line's end)."""
    at = text.find(part)
    end = at + len(part)
    return at >= 0 and (at == 0 or text[at - 1] == "\n") and (part.endswith("\n") or end == len(text) or
                                                              text[end] == "\n")


#: the kinds of doubt about a change (change_doubt, and edit_file's append), by their templates: the loop
#: excuses some of them by the task's words (Agent.standing_doubts)
DOUBTS = (("spacing", WHITESPACE_ONLY), ("lines gone", LINES_GONE), ("edit lines gone", EDIT_LINES_GONE),
          ("appended", APPENDED), ("escaped breaks", ESCAPED_BREAKS))


def doubt_kind(doubt):
    """Which of DOUBTS a doubt's text was made from, or None."""
    for kind, template in DOUBTS:
        if re.fullmatch(".*".join(re.escape(part) for part in re.split("%[sd]", template)), doubt, re.S):
            return kind
    return None


def looks_like_diff(text):
    """A unified diff: a `--- ` line, then `+++ `, then a hunk header, at the start of the text."""
    head = text.lstrip("\n").split("\n", 3)
    return len(head) >= 3 and head[0].startswith("--- ") and head[1].startswith("+++ ") and head[2].startswith("@@")


def head_of(text, most):
    """A file's text for a tool's message, as read_file shows it: whole up to `most` characters, else its head
    and how many lines are left out."""
    text = text.rstrip("\n")
    if len(text) <= most:
        return text
    head = text[:most].rsplit("\n", 1)[0]
    return head + "\n[… %d more lines; read_file shows them]" % text[len(head):].count("\n")


def missing_text(path, text, old, new, small):
    """(message, whole): what an edit whose old_text is not in `text` tells the model to do next, and whether
    that shows the file whole: that the change is made already (a small model edited, overwrote, then made the
    same edit again), the file itself when it is `small` characters or fewer, or else the lines closest to
    old_text, numbered (as aider shows them)."""
    if new and new in text:
        return ("old_text is not in %s, but new_text already is (line %d): the change seems made already. Go on "
                "with the rest of the task, or answer" % (path, text.count("\n", 0, text.find(new)) + 1)), False
    if len(text) <= small:
        return ("old_text not found in %s. The file holds:\n%s\nCopy old_text from it exactly, spaces and line "
                "breaks too" % (path, head_of(text, small))), True
    import difflib
    want = next((line.strip() for line in old.splitlines() if line.strip()), old.strip())
    lines = text.splitlines()[:20000]
    close = difflib.get_close_matches(want, [line.strip() for line in lines], n=3, cutoff=0.5)
    near = ["%6d\t%s" % (i + 1, line) for i, line in enumerate(lines) if line.strip() in close][:5]
    if not near:
        return "old_text not found in %s; read the file and copy the text exactly" % path, False
    return ("old_text not found in %s; the closest lines are:\n%s\nread_file shows them in context; copy old_text "
            "exactly" % (path, "\n".join(near))), False


def _loose(text):
    """`text` as loose_replacement compares it: without quotes and white space, and where in `text` each
    character kept came from."""
    where = [i for i, ch in enumerate(text) if ch not in "\"'`" and not ch.isspace()]
    return "".join(text[i] for i in where), where


def _wordy(ch):
    return ch.isalnum() or ch == "_"


def loose_replacement(text, old, new):
    """(start, end, replacement) of `text` for an edit whose old_text differs from the file only in its quotes and
    spacing ('port: 8080' for `"port": 8080`, a 1.5B model's edit of a JSON file, repeated until the run
    failed), or None. The change is the one the model wrote, moved onto the file's text: what old_text and
    new_text do not share at their ends (8080 → 9090) must stand in the file exactly, inside the one place
    old_text matches loosely; anything less sure is not an edit."""
    if len(text) > 1 << 20 or not old.strip():
        return None
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    cut, put = old[head:len(old) - tail], new[head:len(new) - tail]
    if not cut.strip() or cut[0] in "\"'`" or cut[-1] in "\"'`":
        return None
    want, want_at = _loose(old)
    have, have_at = _loose(text)
    places, at = [], have.find(want)
    while at >= 0 and len(places) < 2:
        # whole words only, at both ends, judged on the file's own text ('port: 80' is not in "port": 8080)
        first, last = have_at[at], have_at[at + len(want) - 1]
        if not (_wordy(want[0]) and first and _wordy(text[first - 1])) and \
                not (_wordy(want[-1]) and last + 1 < len(text) and _wordy(text[last + 1])):
            places.append(at)
        at = have.find(want, at + 1)
    if len(places) != 1:
        return None  # not there, or not in one place only
    at = places[0]
    inside = [k for k, i in enumerate(want_at) if head <= i < len(old) - tail]
    if not inside:
        return None
    start, end = have_at[at + inside[0]], have_at[at + inside[-1]] + 1
    return (start, end, put) if text[start:end] == cut else None


def only_dropped(old, new):
    """The lines of `old` that `new` drops, when every line of `new` is one `old` has (a deletion written as a
    whole file); else []."""
    import collections
    kept = collections.Counter(line.strip() for line in new.splitlines() if line.strip())
    had = collections.Counter(line.strip() for line in old.splitlines() if line.strip())
    if not kept or kept - had:  # (counted: a line the file held twice, written once, is one dropped)
        return []
    return list((had - kept).elements())


def lost_credentials(path, old, new):
    """Why writing `new` over `old` (a file's text) is refused, or None: it puts [REDACTED] where `old` held a
    credential redaction replaces. The model only ever sees such a value as [REDACTED]; written back, the
    marker replaced the real key in app.env, and in settings.py the values it stood for (round 19d). Refused
    when the new text holds the marker and a value the model was shown as the marker (a tool result's
    redaction hides it in the old text) is gone from the new: a change that keeps every such value is written, and one that drops a
    value the model saw as it is (a hard-coded key moved to the environment) too. Not by counting markers: a
    comment holding the word [REDACTED] let the value go (round 19f)."""
    if old is None or REDACTED not in new:
        return None
    shown = redact(old, shapes=False)  # as a tool result shows it (ToolRegistry.execute)
    gone = [start for start, end in redaction_spans(old)
            if old[start:end] not in new and old[start:end] not in shown]
    if not gone:
        return None
    line = old.count("\n", 0, min(gone)) + 1
    return ("%s holds a credential you were shown as %s (line %d), and this text writes %s in its place: the "
            "real value would be lost. Nothing was written. Change the other lines with edit_file and leave the "
            "lines showing %s out of old_text and new_text; the file keeps its credential" % (
                path, REDACTED, line, REDACTED, REDACTED))


def same_words(old, new):
    """Whether two texts differ at most in their white space."""
    return old.split() == new.split()


def several_places(path, text, args):
    """What an edit whose old_text occurs more than once is told: where, each with the line above it, and the
    call that does each thing, written out (a small model renaming a function did not know what "set
    replace_all" meant, and stopped). A name is most likely renamed everywhere, a line changed in one place:
    told replace_all first, a 1.5B model asked to fix add() made sub() add too."""
    old, lines, where, pos = args["old_text"], text.split("\n"), [], text.find(args["old_text"])
    while pos != -1 and len(where) < 20:
        line = text.count("\n", 0, pos)
        where += [] if where and where[-1] == line else [line]
        pos = text.find(old, pos + 1)
    shown = []
    for i in where[:5]:
        shown += ["%6d\t%s" % (j + 1, lines[j]) for j in range(max(0, i - 1), i + 1)
                  if not shown or not shown[-1].startswith("%6d\t" % (j + 1))]
    every = 'replace_all: true (%s)' % edit_call(dict(args, replace_all=True))
    first = text.find(old)
    above = text.rfind("\n", 0, max(0, text.rfind("\n", 0, first)))
    wider = text[above + 1:first + len(old)]
    one = "give old_text with more of its lines: %s" % edit_call(dict(args, old_text=wider, new_text=(
        wider[:len(wider) - len(old)] + args["new_text"]))) if text.count(wider) == 1 else \
        "give more of its line as old_text"
    options = ["To replace every one, call again with %s." % every, "To replace only the first, %s" % one]
    if re.fullmatch(r"[\w.$-]+", old) is None:  # not a name: a line
        options.reverse()
    return "old_text occurs %d times in %s (lines %s):\n%s\n%s" % (
        text.count(old), path, ", ".join(str(i + 1) for i in where), "\n".join(shown), "\n".join(options))


def edit_call(args):
    """An edit_file call written out for the model to copy, at most 600 characters."""
    again = json.dumps({"name": "edit_file", "arguments": args}, ensure_ascii=False)
    return again if len(again) <= 600 else again[:600] + " …"


def changed_lines(old, new, context=2, most=40):
    """(first, last, text): the lines of `new` around where it differs from `old`, numbered from 1 like
    `cat -n`; past `most` lines, the start and the end of the change with a note of how many lie between."""
    a, b = old.splitlines(), new.splitlines()
    head, limit = 0, min(len(a), len(b))
    while head < limit and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < limit - head and a[len(a) - 1 - tail] == b[len(b) - 1 - tail]:
        tail += 1
    first, last = max(0, head - context), min(len(b), len(b) - tail + context)
    if first >= last:  # an empty file now
        return 0, 0, "(the file is empty)"
    numbered = ["%6d\t%s" % (i + 1, b[i]) for i in range(first, last)]
    if len(numbered) > most:
        half = most // 2
        numbered = numbered[:half] + ["   ... (%d lines)" % (len(numbered) - 2 * half)] + numbered[-half:]
    return first + 1, last, "\n".join(numbered)


def text_diff(old, new, name, whole=False):
    """whole=True: a diff shown for a person's approval, never a summary (see bounded_diff)."""
    return bounded_diff(old.splitlines(True), new.splitlines(True), "a/" + name, "b/" + name, whole=whole)


#: the most line pairs a diff compares (the lines that differ, after the common start and end are set
#: aside): difflib is quadratic on some inputs (lines repeated two and three times: 20,000 took 9 s), and
#: files and rewrites come from models and repositories; past it a diff is a summary of the change
MAX_DIFF_CELLS = 10_000_000
#: what str.splitlines() also ends a line at: such a line is followed by a newline, without the note
_LINE_ENDS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_HUNK = r"@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@"  # compiled at first use, by re's own cache


def bounded_diff(a, b, fromfile, tofile, n=3, whole=False):
    """difflib.unified_diff of the line lists a and b as one string, computed on what lies between their
    common first and last lines (an edit in a long file compares a few lines, not all of them), or a
    one-line summary when that middle is too large to compare. whole=True (a change a person approves:
    nothing is elided from what they say yes to) gives that middle as one hunk, every old line removed and
    every new line added, instead of the summary. Every line of the result ends with a newline: a last
    line without one would join the next (`-old` then `+new` read as one removed line)."""
    head = 0
    limit = min(len(a), len(b))
    while head < limit and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < limit - head and a[len(a) - 1 - tail] == b[len(b) - 1 - tail]:
        tail += 1
    if head == len(a) == len(b):
        return ""
    start, keep_tail = max(0, head - n), max(0, tail - n)
    mid_a, mid_b = a[start:len(a) - keep_tail], b[start:len(b) - keep_tail]
    changed_a, changed_b = len(a) - head - tail, len(b) - head - tail
    if changed_a * changed_b > MAX_DIFF_CELLS and not whole:
        return "--- %s\n+++ %s\n@@ lines %d-%d (%d lines) become %d lines: too many to compare line by line @@\n" % (
            fromfile, tofile, head + 1, head + changed_a, changed_a, changed_b)
    replaced = changed_a * changed_b > MAX_DIFF_CELLS
    if replaced:  # linear: the whole middle replaced, shown line by line with its real line numbers
        lines = ["--- %s\n" % fromfile, "+++ %s\n" % tofile, "@@ -%d,%d +%d,%d @@\n" % (
            start + 1, len(mid_a), start + 1, len(mid_b))]
        lines += [" " + x for x in a[start:head]] + ["-" + x for x in a[head:len(a) - tail]] + \
            ["+" + x for x in b[head:len(b) - tail]] + [" " + x for x in a[len(a) - tail:len(a) - keep_tail]]
    else:
        import difflib
        lines = difflib.unified_diff(mid_a, mid_b, fromfile, tofile, n=n)
    out = []
    for line in lines:
        if start and not replaced and line.startswith("@@"):
            m = re.match(_HUNK, line)
            line = "@@ -%d%s +%d%s @@%s" % (int(m.group(1)) + start, m.group(2) or "", int(m.group(3)) + start,
                                            m.group(4) or "", line[m.end():])
        if not line.endswith("\n"):
            line += "\n" if line[-1:] in _LINE_ENDS else "\n\\ No newline at end of file\n"
        out.append(line)
    return "".join(out)




# ---- Audit log: one line per terminal decision ----

class AuditLog:
    """One line per terminal decision; whole lines under a lock, rotated at a size, previous file kept.

    2025-01-15T10:30:45Z | /home/user/project | ls -la | exit:0 | 0.023s | allow
    """

    _lock = threading.Lock()

    def __init__(self, path, max_bytes=10485760, redact=None):
        self.path = path
        self.max_bytes = max_bytes
        self.redact = redact

    def record(self, cwd, command, outcome, duration, verdict):
        text = redact(command)  # secrets out first, then one line of visible text
        text = render_untrusted(text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r"), exact=True)
        line = "%s | %s | %s | %s | %.3fs | %s\n" % (rfc3339(time.time()), render_untrusted(cwd, exact=True), text,
                                                   outcome, duration, verdict)
        data = line.encode("utf-8", "replace")
        with self._lock:
            private_dir(os.path.dirname(os.path.abspath(self.path)))  # XZATOMA_HOME: 0700
            fd = _open_log(self.path)
            try:
                if os.fstat(fd).st_mode & 0o077:  # a log made by an older version: only its owner reads it
                    os.fchmod(fd, 0o600)
                _flock(fd)
                if self.max_bytes and os.fstat(fd).st_size + len(data) > self.max_bytes and \
                        os.path.exists(self.path) and os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    os.replace(self.path, self.path + ".1")
                    os.close(fd)
                    fd = _open_log(self.path)
                    _flock(fd)
                os.write(fd, data)
            finally:
                os.close(fd)


def _open_log(path):
    """The log for appending: never through a link (an audit.log linked to ~/.bashrc would have the agent
    append command lines to it), never a FIFO or device (opening one would hang or write elsewhere)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK |
                 getattr(os, "O_CLOEXEC", 0), 0o600)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return fd


def _flock(fd):
    try:
        import fcntl
        fcntl.flock(fd, fcntl.LOCK_EX)
    except (ImportError, OSError):
        pass


# ---- Schema and migrations ----

def _redact_stored(conn):
    """Secrets stored before the redactor knew their shapes are redacted in place (issue 12 found AWS,
    Stripe, Slack, … tokens and PEM keys stored verbatim). secure_delete zeroes the bytes they leave."""
    changed = False
    for row in conn.execute("SELECT rowid, content, tool_calls FROM messages").fetchall():
        content, calls = redact(row[1]), redact(row[2])
        if content != row[1] or calls != row[2]:
            conn.execute("UPDATE messages SET content = ?, tool_calls = ? WHERE rowid = ?", (content, calls, row[0]))
            changed = True
    for row in conn.execute("SELECT id, title, error, label, source FROM conversations").fetchall():
        clean = [redact(v) for v in row[1:]]
        if clean != list(row[1:]):
            conn.execute("UPDATE conversations SET title = ?, error = ?, label = ?, source = ? WHERE id = ?",
                         clean + [row[0]])
    for row in conn.execute("SELECT event_id, result, metadata FROM processed_events").fetchall():
        clean = [redact(v) for v in row[1:]]
        if clean != list(row[1:]):
            conn.execute("UPDATE processed_events SET result = ?, metadata = ? WHERE event_id = ?", clean + [row[0]])
    conn.execute("DELETE FROM fetch_cache")  # a cache: fetched again when needed, redacted this time
    if changed and conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (FTS_TABLE,)).fetchone():
        conn.execute("DELETE FROM %s" % FTS_TABLE)  # the index kept its own copy of the text
        conn.execute("INSERT INTO %s (conversation_id, content) SELECT conversation_id, coalesce(content, '') || "
                     "' ' || coalesce(tool_calls, '') FROM messages WHERE %s" % (FTS_TABLE, SEARCHED_ROWS))
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'search_backlog'").fetchone():
            conn.execute("DELETE FROM search_backlog")  # all of them are in the index now


def _trust_and_progress(conn):
    """Files of a project a person has trusted (skills, .mcp.json …) by real path, kind and content digest, so a
    change asks again; and the progress list of a conversation (plan instructions or the model's own steps), as
    JSON. Idempotent, whatever the version number says (it was 7 on its branch, beside issue 22's claims)."""
    conn.execute("CREATE TABLE IF NOT EXISTS trusted_files (path TEXT NOT NULL, kind TEXT NOT NULL, digest TEXT NOT "
                 "NULL, trusted_at TEXT NOT NULL, PRIMARY KEY (path, kind))")
    if "progress" not in [row[1] for row in conn.execute("PRAGMA table_info(conversations)")]:
        conn.execute("ALTER TABLE conversations ADD COLUMN progress TEXT")


def _add_review(conn):
    """conversations.review, unless it is there (a database rewound to re-run the migrations after it)."""
    if "review" not in [row[1] for row in conn.execute("PRAGMA table_info(conversations)")]:
        conn.execute("ALTER TABLE conversations ADD COLUMN review TEXT")


def _add_claim_start(conn):
    """event_claims.started, unless it is there (as _add_review)."""
    if "started" not in [row[1] for row in conn.execute("PRAGMA table_info(event_claims)")]:
        conn.execute("ALTER TABLE event_claims ADD COLUMN started INTEGER")


def _add_beats_and_spaces(conn):
    """event_claims.beat and .lease; conversations.space and .started (unless there, as _add_review)."""
    for table, column, kind in (("event_claims", "beat", "INTEGER NOT NULL DEFAULT 0"),
                                ("event_claims", "lease", "REAL"), ("conversations", "space", "TEXT"),
                                ("conversations", "started", "INTEGER")):
        if column not in [row[1] for row in conn.execute("PRAGMA table_info(%s)" % table)]:
            conn.execute("ALTER TABLE %s ADD COLUMN %s %s" % (table, column, kind))


def _seal_undo(conn, store):
    """Undo content an earlier version stored as it was (before sealing, or before its key) is sealed with
    undo.key as new records are (round 19d: a `.env`'s keys stayed readable in the database after the migration
    that redacted everything else: undo content must restore byte for byte, so it cannot be redacted)."""
    rows = conn.execute("SELECT id, content FROM undo WHERE content IS NOT NULL AND kind != 'moved'").fetchall()
    for row in rows:
        content = bytes(row[1])
        if not content.startswith(Store.SEAL):
            conn.execute("UPDATE undo SET content = ? WHERE id = ?", (store._seal(content), row[0]))


_seal_undo.needs_store = True

MIGRATIONS = [
    # 1: conversations and their messages
    """
    CREATE TABLE conversations (
        id TEXT PRIMARY KEY, parent_id TEXT, depth INTEGER NOT NULL DEFAULT 0, label TEXT, title TEXT,
        kind TEXT NOT NULL, provider TEXT, model TEXT, mode TEXT, working_dir TEXT,
        status TEXT NOT NULL, started_at TEXT NOT NULL, updated_at TEXT NOT NULL, completed_at TEXT,
        turns INTEGER NOT NULL DEFAULT 0, tool_calls INTEGER NOT NULL DEFAULT 0,
        prompt_tokens INTEGER NOT NULL DEFAULT 0, completion_tokens INTEGER NOT NULL DEFAULT 0,
        source TEXT, error TEXT);
    CREATE INDEX conversations_parent ON conversations(parent_id);
    CREATE TABLE messages (
        conversation_id TEXT NOT NULL, seq INTEGER NOT NULL, role TEXT NOT NULL, content TEXT,
        tool_calls TEXT, tool_call_id TEXT, name TEXT, tokens INTEGER, created_at TEXT NOT NULL,
        PRIMARY KEY (conversation_id, seq));
    """,
    # 2: liveness of running conversations, undo records, caches, processed events
    """
    ALTER TABLE conversations ADD COLUMN pid INTEGER;
    ALTER TABLE conversations ADD COLUMN host TEXT;
    CREATE INDEX conversations_kind ON conversations(kind);
    CREATE TABLE undo (
        id INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id TEXT, tool_call_id TEXT, tool TEXT,
        path TEXT NOT NULL, kind TEXT NOT NULL, content BLOB, mode INTEGER, after_hash TEXT,
        created_at TEXT NOT NULL, restored_at TEXT);
    CREATE INDEX undo_conversation ON undo(conversation_id);
    CREATE TABLE fetch_cache (
        url TEXT PRIMARY KEY, fetched_at REAL NOT NULL, status INTEGER, content_type TEXT,
        final_url TEXT, body TEXT);
    CREATE TABLE model_cache (provider TEXT NOT NULL, key TEXT NOT NULL, fetched_at REAL NOT NULL,
        data TEXT, PRIMARY KEY (provider, key));
    CREATE TABLE processed_events (event_id TEXT PRIMARY KEY, processed_at TEXT NOT NULL,
        conversation_id TEXT, status TEXT);
    """,
    # 3 (watcher): a processed event keeps its result until the result is published, and where it came from
    """
    ALTER TABLE processed_events ADD COLUMN result TEXT;
    ALTER TABLE processed_events ADD COLUMN published_at TEXT;
    ALTER TABLE processed_events ADD COLUMN metadata TEXT;
    """,
    # 4: sessions belong to a project: the safety a conversation ran with, and finding a directory's fast
    """
    ALTER TABLE conversations ADD COLUMN safety TEXT;
    CREATE INDEX conversations_working_dir ON conversations(working_dir);
    """,
    # 5: what earlier versions stored unredacted is redacted (a function, not SQL)
    _redact_stored,
    # 6: the caches were keyed by URLs as given: a base URL's password (the model list) and a fetched URL's
    # token sat in the keys; both are caches, filled again (keys with a credential now only as a digest)
    """
    DELETE FROM model_cache;
    DELETE FROM fetch_cache;
    """,
    # 7 (watcher, issue 22): events being run, so processes sharing a store never run one id at once (a claim
    # outlives its owner only until its lease ends, or at once when the owner was a process of this host that is
    # gone); and the offsets a consumer was reading, so a message that crashes the watcher is found and set aside
    """
    CREATE TABLE IF NOT EXISTS event_claims (event_id TEXT PRIMARY KEY, owner TEXT NOT NULL, host TEXT, pid INTEGER,
        claimed_at REAL NOT NULL, expires_at REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 1);
    CREATE INDEX IF NOT EXISTS event_claims_owner ON event_claims(owner);
    CREATE TABLE IF NOT EXISTS message_attempts (consumer TEXT PRIMARY KEY, first_offset INTEGER NOT NULL,
        last_offset INTEGER NOT NULL, owner TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 1,
        updated_at REAL NOT NULL);
    """,
    # 8 (issue 26): trusted project files and conversations' progress (_trust_and_progress)
    _trust_and_progress,
    # 9: the files that run later by design (Makefile, CI, conftest.py …) a run changed, one per line
    _add_review,
    # 10 (issue 22): messages stored but not yet in the search index (Store.index_backlog)
    "CREATE TABLE IF NOT EXISTS search_backlog (message_rowid INTEGER PRIMARY KEY)",
    # 11 (issue 22): a claim's process by its start (clock ticks since boot, Linux): with the pid it names one
    # process, whatever the wall clock does, so a live claimer is told from a newer process given its pid
    _add_claim_start,
    # 12 (issue 22): a published result's text is not kept (Store.event_published): up to 1 MB an event, for good
    "UPDATE processed_events SET result = NULL WHERE published_at IS NOT NULL",
    # 13 (issue 22): a claim's heartbeats, counted, and its lease, so another host judges it by its own clock
    # (Store._holds); a conversation's process by its pid namespace, machine and start (Store.reap)
    _add_beats_and_spaces,
    # 14: undo content stored unsealed by an earlier version is sealed (_seal_undo)
    _seal_undo,
]
SCHEMA_VERSION = len(MIGRATIONS)
#: claims of other hosts whose beats a Store remembers (Store._holds): the last looked at
MAX_SEEN_CLAIMS = 4096
FTS_TABLE = "messages_fts"
#: messages indexed for search together (Store.append_message). INFO: every commit that touches the full-text
#: index writes a new FTS5 segment and merges old ones; a trigram index paid 0.4 ms a commit for it, most of what
#: a watcher's event cost the store (issue 22). Indexed 64 at a time, a message costs a few microseconds there.
SEARCH_BATCH = 64


def _unindexed(message):
    """Messages the search index leaves out: XZatoma's own head of every conversation, the system prompt and the
    environment message (working directory, date, AGENTS.md, the skills' catalog). INFO: the same text in every
    conversation makes every one match its words, and it was most of what a short run indexed: the system
    prompt alone cost a watcher 1.8 ms an event in trigram terms (issue 22). They stay stored, and shown."""
    return message.get("role") == "system" or message.get("name") == "environment"


#: _unindexed in SQL: the message rows search looks through, by FTS or by LIKE (round 19d: the LIKE search of 1-2
#: characters went through every row, and "XZ" found every conversation by its system prompt)
SEARCHED_ROWS = "role != 'system' AND coalesce(name, '') != 'environment'"

CONVERSATION_FIELDS = ("id", "parent_id", "depth", "label", "title", "kind", "provider", "model", "mode",
                       "working_dir", "status", "started_at", "updated_at", "completed_at", "turns",
                       "tool_calls", "prompt_tokens", "completion_tokens", "source", "error", "pid", "host",
                       "safety", "progress", "review")


class StoreError(Exception):
    """The database cannot be used; the message says why and what to do."""


class NotFound(StoreError):
    pass


def describe_error(exc):
    """A store error in a person's words: "database is locked" is another process holding the database."""
    text = str(exc)
    if "database is locked" in text or "database table is locked" in text:
        return "the conversation database is locked by another process, such as a backup or a VACUUM"
    return text


class Busy(StoreError):
    """The conversation is being run by another live process (round 19d): continued or deleted under it, two runs
    interleaved their messages in one transcript, or one wrote rows no command could reach any more."""


# ---- The store ----


class Store:
    """One sqlite3 database; methods are named for what callers want."""

    def __init__(self, path, secrets=()):
        self.path = path
        self.redact = Redactor(secrets)
        self._local = threading.local()
        self._seq_lock = threading.Lock()  # the search backlog's count (a message's seq is the database's own)
        self._backlog = 0  #: messages this Store put in the search backlog since it was last indexed
        self.has_fts = False
        self._connections = []
        #: seconds a statement waits for another process's lock before "database is locked"
        self.busy_timeout = 30.0
        #: a run's time limit (time.monotonic()): a wait for a lock takes at most half the time left, so the run
        #: still has time to answer without its history (round 19d: a backup holding the database held
        #: `run --timeout 5` for 30 s at its first write, and it failed although the model answered at once)
        self.deadline = None
        #: the clock another host's claims are judged by: this process's own (Store._holds)
        self.clock = time.monotonic
        #: event id -> (another host's claim as last seen: owner, beat, expiry; when this process first saw it so),
        #: the last MAX_SEEN_CLAIMS seen (one forgotten and seen again waits a whole lease again: later, never sooner)
        self._seen_claims = collections.OrderedDict()
        self._seen_lock = threading.Lock()  # the watcher's threads look at once (a KeyError between two, 16d)

    # -- connections --
    def open(self):
        """Create or migrate the database; raises StoreError with a reason a person can act on."""
        import sqlite3
        directory = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            # sqlite gives the -wal, -shm and -journal files the mode of the database it reaches (through a link,
            # the link's target, beside which it makes them): that file is created 0600 first, whatever the umask
            private_file(self.path, follow=True)
            real = os.path.realpath(self.path)
            for path in (real + "-wal", real + "-shm", real + "-journal"):
                if os.path.lexists(path):
                    private_file(path)
        except NotRegularFile as exc:
            raise StoreError("the conversation database %s %s: conversation history needs a file path"
                             % (exc.filename, exc.strerror))
        except OSError as exc:
            raise StoreError("cannot create %s: %s" % (self.path, exc.strerror or exc))
        try:
            conn = self.conn()
            self._migrate(conn)
            self.has_fts = bool(conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (FTS_TABLE,)).fetchone())
        except sqlite3.DatabaseError as exc:
            self.close()
            raise StoreError("cannot use the conversation database %s: %s" % (self.path, exc))
        return self

    def conn(self):
        conn = getattr(self._local, "conn", None)
        if conn is None:
            import sqlite3
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None,
                                   check_same_thread=False)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA busy_timeout = %d" % int(self.busy_timeout * 1000))
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA secure_delete = ON")  # deleted or redacted text is zeroed, not left in free pages
            self._local.conn = conn
            self._local.wait_ms = int(self.busy_timeout * 1000)
            self._connections.append(conn)
        if self.deadline is not None:
            self._wait(conn, getattr(self._local, "patience", None))
        return conn

    def _wait(self, conn, seconds=None):
        """This thread's busy timeout: `seconds` (its patience) or busy_timeout, at most half the time to the
        deadline."""
        seconds = self.busy_timeout if seconds is None else seconds
        if self.deadline is not None:
            seconds = min(seconds, max(0.0, self.deadline - time.monotonic()) / 2)
        ms, now = int(seconds * 1000), getattr(self._local, "wait_ms", None)
        if now is None or ms > now or now - ms >= 100:  # set again as the deadline nears, a tenth of a second a step
            conn.execute("PRAGMA busy_timeout = %d" % ms)
            self._local.wait_ms = ms

    def patience(self, seconds):
        """`with store.patience(1):` this thread's statements wait at most `seconds` for another process's lock,
        not the 30 s they wait otherwise: for a thread that must not stall behind one (the watcher's consumer
        loop: a backup holding the lock for minutes froze its lag report, and a stop, for 60 s a batch)."""
        import contextlib

        @contextlib.contextmanager
        def waiting():
            conn = self.conn()
            self._local.patience = seconds
            self._wait(conn, seconds)
            try:
                yield
            finally:
                self._local.patience = None
                self._wait(conn)
        return waiting()

    def close(self):
        """Close this thread's connection and forget the others: each closes when its thread lets go of it.

        Closing a connection another thread is writing through crashes the interpreter (SIGSEGV): Ctrl-C
        ends a run while parallel subagents still record their last messages."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass
        self._connections = []
        self._local = threading.local()

    def _migrate(self, conn):
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:  # checked before anything is written: a newer file stays untouched
            raise StoreError("the conversation database %s was written by a newer xzatoma (schema %d; this "
                             "version understands up to %d): upgrade xzatoma or point agent.persistence.db_path "
                             "elsewhere" % (self.path, version, SCHEMA_VERSION))
        conn.execute("PRAGMA journal_mode = WAL")  # persistent in the file; lets readers and a writer overlap
        if version == SCHEMA_VERSION:
            return
        conn.execute("BEGIN IMMEDIATE")
        with conn:  # commits, or rolls back on any exception
            version = conn.execute("PRAGMA user_version").fetchone()[0]  # another process may have won
            for number in range(version, SCHEMA_VERSION):
                if callable(MIGRATIONS[number]):
                    MIGRATIONS[number](*((conn, self) if getattr(MIGRATIONS[number], "needs_store", False)
                                         else (conn,)))
                    continue
                for statement in MIGRATIONS[number].split(";"):
                    if statement.strip():
                        conn.execute(statement)
            if version < 2:
                self._create_fts(conn)
            conn.execute("PRAGMA user_version = %d" % SCHEMA_VERSION)
        # what the migrations redacted or sealed leaves the database file now, not at some later checkpoint (a
        # process killed before then left it there); secure_delete zeroed the pages it was in
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    @staticmethod
    def _create_fts(conn):
        import sqlite3
        for tokenizer in ("trigram", "unicode61"):
            try:
                conn.execute("CREATE VIRTUAL TABLE %s USING fts5(conversation_id UNINDEXED, content, "
                             "tokenize = '%s')" % (FTS_TABLE, tokenizer))
                conn.execute("INSERT INTO %s (conversation_id, content) SELECT conversation_id, "
                             "coalesce(content, '') || ' ' || coalesce(tool_calls, '') FROM messages WHERE %s"
                             % (FTS_TABLE, SEARCHED_ROWS))
                return
            except sqlite3.OperationalError:
                continue  # no FTS5 in this interpreter's sqlite: search falls back to LIKE

    # -- conversations --
    def start_conversation(self, id, kind, title="", provider=None, model=None, mode=None, working_dir=None,
                           parent_id=None, depth=0, label=None, source=None, safety=None):
        now = rfc3339()
        self.conn().execute(
            "INSERT INTO conversations (id, parent_id, depth, label, title, kind, provider, model, mode, "
            "working_dir, status, started_at, updated_at, source, pid, host, safety, space, started) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?)",
            (id, parent_id, depth, self.redact(label), one_line(self.redact(title) or "", 120), kind, provider, model, mode,
             working_dir, now, now, self.redact(source), os.getpid(), _hostname(), safety, _process_space(),
             _process_start(os.getpid())))
        return id

    def resume_conversation(self, id, mode=None, model=None, provider=None, safety=None):
        """Mark a stored conversation as running again in this process (with what it runs with now). Busy when
        another live process runs it: judged and taken in one transaction, so of two resuming at once one is
        refused (round 19d: both ran, and one transcript interleaved two tasks)."""
        with self.batch() as conn:
            self._refuse_running(conn, [id], "continue it")
            conn.execute(
                "UPDATE conversations SET status = 'running', completed_at = NULL, error = NULL, updated_at = ?, "
                "pid = ?, host = ?, space = ?, started = ?, mode = coalesce(?, mode), model = coalesce(?, model), "
                "provider = coalesce(?, provider), safety = coalesce(?, safety) WHERE id = ?",
                (rfc3339(), os.getpid(), _hostname(), _process_space(), _process_start(os.getpid()), mode, model,
                 provider, safety, id))

    def append_message(self, conversation_id, message, tokens=None):
        """Append one message as it happens (never rewrites earlier rows). Its seq is taken inside the write's
        transaction, from the database: a count this process kept went stale when another process wrote to the
        conversation, and the row collided (round 19d). A conversation deleted meanwhile is NotFound, not rows
        no command can reach."""
        content = self.redact(message.get("content"))
        calls = message.get("tool_calls")
        calls_json = self.redact(json.dumps(calls, ensure_ascii=False)) if calls else None
        with self.batch() as conn:  # the row and its place in the search backlog together
            if conn.execute("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)).fetchone() is None:
                raise NotFound("conversation %s is no longer stored (deleted meanwhile)" % conversation_id)
            seq = conn.execute("SELECT coalesce(max(seq) + 1, 0) FROM messages WHERE conversation_id = ?",
                               (conversation_id,)).fetchone()[0]
            row = conn.execute("INSERT INTO messages (conversation_id, seq, role, content, tool_calls, tool_call_id, "
                               "name, tokens, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                               (conversation_id, seq, message["role"], content, calls_json,
                                message.get("tool_call_id"), message.get("name"), tokens, rfc3339())).lastrowid
            if self.has_fts and not _unindexed(message):
                conn.execute("INSERT OR IGNORE INTO search_backlog (message_rowid) VALUES (?)", (row,))
                with self._seq_lock:
                    self._backlog += 1
                    full = self._backlog >= SEARCH_BATCH
                if full:
                    self._index_backlog(conn)
        return seq

    def index_backlog(self):
        """Put the messages waiting in the search backlog into the full-text index (search does, first)."""
        if self.has_fts:
            with self.batch() as conn:
                self._index_backlog(conn)

    def _index_backlog(self, conn):
        # the text indexed is what append_message stored: the redacted content, a space, the calls' JSON
        conn.execute("INSERT INTO %s (conversation_id, content) SELECT m.conversation_id, coalesce(m.content, '') || "
                     "coalesce(' ' || m.tool_calls, '') FROM search_backlog b JOIN messages m ON m.rowid = "
                     "b.message_rowid ORDER BY b.message_rowid" % FTS_TABLE)
        conn.execute("DELETE FROM search_backlog")
        with self._seq_lock:
            self._backlog = 0

    def update_conversation(self, id, **fields):
        fields["updated_at"] = rfc3339()
        for key in ("error", "title", "label", "source", "progress"):  # text that may quote a secret
            if fields.get(key):
                fields[key] = self.redact(fields[key])
        cols = ", ".join("%s = ?" % k for k in fields if k in CONVERSATION_FIELDS)
        values = [v for k, v in fields.items() if k in CONVERSATION_FIELDS]
        self.conn().execute("UPDATE conversations SET %s WHERE id = ?" % cols, values + [id])

    def finish_conversation(self, id, status, **fields):
        fields.update(status=status, completed_at=rfc3339())
        self.update_conversation(id, **fields)

    def reap(self):
        """Conversations left 'running' by a process that is gone become 'interrupted'. Only this process space's
        (host, machine and pid namespace: another's pids are not ours to judge; a `history list` in a container
        sharing the store marked a live watcher's run interrupted, attack round 16a), known by pid and start."""
        rows = self.conn().execute("SELECT id, pid, host, space, started FROM conversations WHERE status = 'running' "
                                   "AND host = ?", (_hostname(),)).fetchall()
        for row in rows:
            if row["pid"] and _runner_alive(row) is False:
                self.conn().execute("UPDATE conversations SET status = 'interrupted', error = ?, updated_at = ? "
                                    "WHERE id = ? AND status = 'running'",
                                    ("the process ended without finishing (killed or crashed)", rfc3339(), row["id"]))
        return len(rows)

    def _refuse_running(self, conn, ids, what):
        """Busy when another process that lives (or may: one of another host or container, whose pids are not ours
        to judge) runs one of conversations `ids`, as reap judges it. This process's own are its to continue."""
        for cid in ids:
            row = conn.execute("SELECT id, status, pid, host, space, started FROM conversations WHERE id = ?",
                               (cid,)).fetchone()
            if row is None or row["status"] != "running" or not row["pid"]:
                continue
            if row["pid"] == os.getpid() and row["host"] == _hostname() and row["space"] in (None, _process_space()):
                continue
            alive = _runner_alive(row)
            if alive is not False:
                where = "" if row["host"] == _hostname() else " on %s" % row["host"]
                raise Busy("conversation %s is running in process %d%s: let it finish or stop it first, then %s%s"
                           % (row["id"], row["pid"], where, what, "" if alive or what != "delete it" else
                              " (that process cannot be checked from here: if it is gone, delete it with --force)"))

    def refuse_running(self, id, what="continue it"):
        """Busy when another live process runs conversation `id` (a look only: resume_conversation decides)."""
        self._refuse_running(self.conn(), [id], what)

    def resolve(self, prefix):
        """A conversation id from a unique prefix (case-insensitive)."""
        prefix = (prefix or "").strip().upper()
        if not prefix:
            raise NotFound("give a conversation id (see 'xzatoma history list')")
        rows = self.conn().execute("SELECT id FROM conversations WHERE id LIKE ? ORDER BY id DESC LIMIT 6",
                                   (prefix.replace("%", "").replace("_", "") + "%",)).fetchall()
        if not rows:
            raise NotFound("no conversation matches '%s' (see 'xzatoma history list')" % prefix)
        if len(rows) > 1:
            raise NotFound("'%s' matches several conversations (%s…); give more characters"
                           % (prefix, ", ".join(r["id"][:12] for r in rows[:5])))
        return rows[0]["id"]

    def latest(self, kinds=None, working_dir=None):
        """The newest top-level conversation (of these kinds, in this working directory)."""
        sql = "SELECT id FROM conversations WHERE parent_id IS NULL"
        args = []
        if kinds:
            sql += " AND kind IN (%s)" % ",".join("?" * len(kinds))
            args = list(kinds)
        if working_dir:
            sql += " AND working_dir = ?"
            args.append(working_dir)
        row = self.conn().execute(sql + " ORDER BY id DESC LIMIT 1", args).fetchone()
        if row is None:
            raise NotFound("there is no stored conversation to resume %s" % (
                "in %s yet (--all-projects looks everywhere)" % working_dir if working_dir else "yet"))
        return row["id"]

    def conversation(self, id):
        row = self.conn().execute("SELECT * FROM conversations WHERE id = ?", (id,)).fetchone()
        if row is None:
            raise NotFound("no conversation %s" % id)
        return _conversation_row(row)

    def _select(self, table, conditions, order, limit=None):
        """Rows as dicts; `conditions` maps SQL fragments to a value (None: leave out, ...: no parameter)."""
        clauses, args = [], []
        for clause, value in conditions.items():
            if value is None or value is False:
                continue
            clauses.append(clause)
            if value is not Ellipsis:
                args.append(value)
        sql = "SELECT * FROM %s%s ORDER BY %s" % (table, " WHERE " + " AND ".join(clauses) if clauses else "", order)
        if limit:
            sql += " LIMIT %d" % int(limit)
        return [dict(r) for r in self.conn().execute(sql, args)]

    def list_conversations(self, limit=20, kind=None, parent_id=None, top_level=False, working_dir=None):
        rows = self._select("conversations", {"kind = ?": kind or None, "parent_id = ?": parent_id or None,
                                              "parent_id IS NULL": Ellipsis if top_level else None,
                                              "working_dir = ?": working_dir or None},
                            "id DESC", limit)
        return [_conversation_row(row) for row in rows]

    def messages(self, conversation_id):
        """The stored messages in order. A row that is not what this version writes (a hand-edited or damaged
        database) comes back as text with `damaged` saying what is wrong, and without its tool calls; one row
        never fails history, replay, search or a resume (round 19d: unguarded json.loads, "internal error")."""
        out = []
        for row in self.conn().execute("SELECT * FROM messages WHERE conversation_id = ? ORDER BY seq",
                                       (conversation_id,)):
            msg = {"role": _text(row["role"]), "content": _text(row["content"]) or ""}
            damage = []
            if not isinstance(row["content"], (str, type(None))):
                damage.append("its content is not text")
            if row["tool_calls"]:
                try:
                    calls = json.loads(row["tool_calls"])
                except (TypeError, ValueError):
                    calls = None
                if isinstance(calls, list) and all(isinstance(c, dict) and isinstance(c.get("name"), str)
                                                   and isinstance(c.get("id"), str) for c in calls):
                    msg["tool_calls"] = calls
                else:
                    damage.append("its tool calls are not a list of calls")
            for key in ("tool_call_id", "name"):
                if row[key] is not None:
                    msg[key] = _text(row[key])
            msg["created_at"] = _text(row["created_at"])
            if damage:
                msg["damaged"] = "; ".join(damage)
            out.append(msg)
        return out

    def search(self, text, limit=20):
        """Conversations whose messages contain text, newest first, with one matching snippet each."""
        conn = self.conn()
        if self.has_fts and len(text) >= 3:
            self.index_backlog()  # every stored message is found, indexed or still waiting
            phrase = '"%s"' % text.replace('"', '""')
            rows = conn.execute("SELECT DISTINCT conversation_id FROM %s WHERE %s MATCH ? ORDER BY conversation_id "
                                "DESC LIMIT ?" % (FTS_TABLE, FTS_TABLE), (phrase, limit)).fetchall()
            ids = [r[0] for r in rows]
        else:
            like = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            rows = conn.execute("SELECT DISTINCT conversation_id FROM messages WHERE (content LIKE ? ESCAPE '\\' "
                                "OR tool_calls LIKE ? ESCAPE '\\') AND %s ORDER BY conversation_id DESC LIMIT ?"
                                % SEARCHED_ROWS, (like, like, limit)).fetchall()
            ids = [r[0] for r in rows]
        out = []
        for cid in ids:
            try:
                conv = self.conversation(cid)
            except NotFound:
                continue
            snippet = ""
            for msg in sorted(self.messages(cid), key=_unindexed):  # what was said first, the head last
                blob = msg["content"] + (json.dumps(msg["tool_calls"]) if msg.get("tool_calls") else "")
                pos = blob.lower().find(text.lower())
                if pos >= 0:
                    snippet = blob[max(0, pos - 40): pos + len(text) + 40].replace("\n", " ")
                    break
            conv["snippet"] = snippet
            out.append(conv)
        return out

    def descendants(self, id):
        """[(conversation, depth_below)] of the subagent tree under id, depth first."""
        out = []

        def walk(parent, level):
            for child in sorted(self.list_conversations(limit=0, parent_id=parent), key=lambda c: c["id"]):
                out.append((child, level))
                walk(child["id"], level + 1)
        walk(id, 1)
        return out

    def delete_conversation(self, id, force=False):
        """Remove a conversation, its subagent tree, messages and undo records. Returns how many. Busy while a live
        process runs one of them (round 19d: deleted under a run, it went on writing rows nothing could reach),
        unless `force`: a row left `running` by a container that is gone cannot be judged from here (16c)."""
        ids = [id] + [c["id"] for c, _ in self.descendants(id)]
        conn = self.conn()
        conn.execute("BEGIN IMMEDIATE")
        with conn:
            if not force:
                self._refuse_running(conn, ids, "delete it")
            for cid in ids:
                conn.execute("DELETE FROM search_backlog WHERE message_rowid IN (SELECT rowid FROM messages WHERE "
                             "conversation_id = ?)", (cid,))  # a rowid used again is not indexed for them
                for table in ("messages", "undo"):
                    conn.execute("DELETE FROM %s WHERE conversation_id = ?" % table, (cid,))
                if self.has_fts:
                    conn.execute("DELETE FROM %s WHERE conversation_id = ?" % FTS_TABLE, (cid,))
                conn.execute("DELETE FROM conversations WHERE id = ?", (cid,))
        return len(ids)

    def older_than(self, seconds):
        """Ids of finished top-level conversations last updated more than `seconds` ago."""
        cutoff = rfc3339(time.time() - seconds)
        rows = self.conn().execute("SELECT id FROM conversations WHERE parent_id IS NULL AND updated_at <= ? "
                                   "AND status != 'running'", (cutoff,)).fetchall()
        return [r["id"] for r in rows]

    def prune_older_than(self, seconds):
        removed = 0
        for cid in self.older_than(seconds):
            try:
                removed += self.delete_conversation(cid)
            except Busy:  # a subagent of it still runs: left for a later prune
                continue
        return removed

    # -- undo records (issue: file tools) --
    # What a file held before the agent changed it must be kept as it was (undo restores it byte for byte),
    # so it cannot be redacted: a `.env` the agent edited would leave its keys in the database's bytes. The
    # content is sealed instead, with a key kept beside the database (undo.key, 0600): a stream from SHAKE-256
    # of the key and a per-record nonce, and an HMAC-SHA-256 tag so a missing or changed key is an error,
    # never garbage restored. Records an earlier version wrote unsealed are sealed by migration 14 (_seal_undo).
    SEAL = b"XZU1"

    def make_undo_key(self):
        """Create the undo key now rather than at the first undo record (a sandbox started before then could
        not hide it from commands). True when there is a usable key."""
        try:
            return self._undo_key(True) is not None
        except OSError:  # a read-only place: undo records will say so when they are made
            return False

    def _undo_key(self, create):
        key = getattr(self, "_key", None)
        if key is not None:
            return key
        path = os.path.join(os.path.dirname(os.path.abspath(self.path)), "undo.key")
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            if not create:
                return None
            # written whole under a name of its own, then linked into place: a parallel subagent's first undo
            # record made it at the same moment, and O_EXCL on the key itself failed one write ("file exists")
            # or let it read a key not written yet
            tmp = "%s.%s.tmp" % (path, os.urandom(8).hex())
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            try:
                try:  # a NUL first: the file tools take it for binary and never show it as text
                    os.write(fd, b"\0" + os.urandom(32))
                finally:
                    os.close(fd)
                os.link(tmp, path)
            except FileExistsError:
                pass  # theirs is the key
            finally:
                os.unlink(tmp)
            return self._undo_key(False)
        try:
            key = os.read(fd, 64)
        finally:
            os.close(fd)
        if len(key) != 33 or key[:1] != b"\0":
            return None
        self._key = key[1:]
        return self._key

    def _seal(self, content):
        import hashlib
        import hmac
        key = self._undo_key(True)
        nonce = os.urandom(16)
        sealed = _xor(content, hashlib.shake_256(b"xzatoma-undo\0" + key + nonce).digest(len(content)))
        return self.SEAL + nonce + hmac.new(key, nonce + sealed, "sha256").digest()[:16] + sealed

    def _unseal(self, content):
        """The content as recorded, or None when it cannot be read back (the key is gone or another)."""
        import hashlib
        import hmac
        if not isinstance(content, bytes) or not content.startswith(self.SEAL):
            return content
        key = self._undo_key(False)
        nonce, tag, sealed = content[4:20], content[20:36], content[36:]
        if key is None or not hmac.compare_digest(tag, hmac.new(key, nonce + sealed, "sha256").digest()[:16]):
            return None
        return _xor(sealed, hashlib.shake_256(b"xzatoma-undo\0" + key + nonce).digest(len(sealed)))

    def record_undo(self, conversation_id, tool_call_id, tool, path, kind, content=None, mode=None,
                    after_hash=None):
        if content is not None and kind != "moved":  # moved: the destination path, shown by `undo --list`
            content = self._seal(bytes(content))
        cur = self.conn().execute(
            "INSERT INTO undo (conversation_id, tool_call_id, tool, path, kind, content, mode, after_hash, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (conversation_id, tool_call_id, tool, path, kind, content, mode, after_hash, rfc3339()))
        return cur.lastrowid

    def set_undo_after(self, undo_id, after_hash):
        self.conn().execute("UPDATE undo SET after_hash = ? WHERE id = ?", (after_hash, undo_id))

    def undo_records(self, conversation_id=None, pending=True, limit=None, working_dir=None):
        """Undo records, newest first: of one conversation, or of the conversations run in `working_dir`.
        A record whose sealed content cannot be read back has content None and `unreadable` True."""
        rows = self._select("undo", {"conversation_id = ?": conversation_id or None,
                                     "restored_at IS NULL": Ellipsis if pending else None,
                                     "conversation_id IN (SELECT id FROM conversations WHERE working_dir = ?)":
                                         working_dir or None}, "id DESC", limit)
        for row in rows:
            if row["kind"] != "moved" and row["content"] is not None:
                row["content"] = self._unseal(bytes(row["content"]))
                row["unreadable"] = row["content"] is None
        return rows

    def mark_restored(self, undo_id):
        self.conn().execute("UPDATE undo SET restored_at = ? WHERE id = ?", (rfc3339(), undo_id))

    # -- caches --
    def cache_get(self, url, ttl):
        row = self.conn().execute("SELECT * FROM fetch_cache WHERE url = ?", (url,)).fetchone()
        if row is None or time.time() - row["fetched_at"] > ttl:
            return None
        return dict(row)

    def cache_put(self, url, status, content_type, final_url, body):
        if any(u and self.redact(u) != u for u in (url, final_url)):
            return  # the URL is the key and must be kept as is: one carrying a credential is not cached at all
        self.conn().execute("INSERT OR REPLACE INTO fetch_cache (url, fetched_at, status, content_type, final_url, "
                            "body) VALUES (?, ?, ?, ?, ?, ?)",
                            (url, time.time(), status, content_type, final_url, self.redact(body)))

    def _cache_key(self, key):
        """A cache key as stored: one holding a credential (a base URL's password) only as its digest."""
        if isinstance(key, str) and self.redact(key) != key:
            import hashlib
            return "sha256:" + hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()
        return key

    def model_cache_get(self, provider, key, ttl):
        row = self.conn().execute("SELECT * FROM model_cache WHERE provider = ? AND key = ?",
                                  (provider, self._cache_key(key))).fetchone()
        if row is None or time.time() - row["fetched_at"] > ttl:
            return None
        return json.loads(row["data"])

    def model_cache_put(self, provider, key, data):
        self.conn().execute("INSERT OR REPLACE INTO model_cache (provider, key, fetched_at, data) VALUES (?, ?, ?, ?)",
                            (provider, self._cache_key(key), time.time(), self.redact(json.dumps(data))))

    # -- trusted project files --
    # A file that comes with a project and would instruct the model or start programs (a skill, an .mcp.json) is
    # used only once a person has trusted it. The record is generic: the file's (or folder's) real path, a kind
    # naming who asks ("skill", "mcp"), and the digest of its content when trusted; any change, a digest that no
    # longer matches, needs a person's yes again.
    def trust_file(self, path, kind, digest):
        self.conn().execute("INSERT OR REPLACE INTO trusted_files (path, kind, digest, trusted_at) VALUES (?, ?, ?, ?)",
                            (path, kind, digest, rfc3339()))

    def untrust_file(self, path, kind):
        """Forget a trust; True when there was one."""
        return self.conn().execute("DELETE FROM trusted_files WHERE path = ? AND kind = ?", (path, kind)).rowcount > 0

    def trust_state(self, path, kind, digest):
        """'trusted' (this very content), 'changed' (trusted once, different now) or 'untrusted'."""
        row = self.conn().execute("SELECT digest FROM trusted_files WHERE path = ? AND kind = ?",
                                  (path, kind)).fetchone()
        if row is None:
            return "untrusted"
        import hmac
        return "trusted" if hmac.compare_digest(row[0], digest) else "changed"

    def trusted_files(self, kind=None):
        return self._select("trusted_files", {"kind = ?": kind or None}, "path")

    def event_seen(self, event_id):
        return self.conn().execute("SELECT 1 FROM processed_events WHERE event_id = ?", (event_id,)).fetchone() \
            is not None

    def event_record(self, event_id):
        """The watcher's record of an event id (status, conversation_id, result, published_at), or None."""
        row = self.conn().execute("SELECT * FROM processed_events WHERE event_id = ?", (event_id,)).fetchone()
        return dict(row) if row is not None else None

    def record_event(self, event_id, conversation_id, status, result=None, metadata=None, owner=None, lease=None):
        """An event finished: recorded before its result is published, so a crash in between republishes it.
        With `owner`, only while no other owner claims it and its result is not out (the fence): else False, and
        nothing written; the result must not be published (another one was, or will be). With `lease`, the
        owner's claim is renewed in the same transaction: the result has a whole lease to go out in (recorded
        after a wait on a locked store, past the claim's end, a watcher on another host took the claim over and
        published the stored result too: two results, attack round 15d)."""
        with self._transaction() as conn:
            if owner is not None:
                claim = conn.execute("SELECT owner, attempts FROM event_claims WHERE event_id = ?",
                                     (event_id,)).fetchone()
                out = conn.execute("SELECT 1 FROM processed_events WHERE event_id = ? AND published_at IS NOT NULL",
                                   (event_id,)).fetchone()
                if out is not None or (claim is not None and claim["owner"] != owner):
                    return False
                if lease is not None:  # renewed, or taken again when none holds it (its taker since released it)
                    _put_claim(conn, event_id, owner, _process_space(), time.time(), lease,
                               claim["attempts"] if claim is not None else 1)
            conn.execute("INSERT OR REPLACE INTO processed_events (event_id, processed_at, conversation_id, status, "
                         "result, published_at, metadata) VALUES (?, ?, ?, ?, ?, NULL, ?)",
                         (event_id, rfc3339(), conversation_id, status, self.redact(result), self.redact(metadata)))
        return True

    def event_published(self, event_id, owner=None):
        """The event's result is out; `owner`'s claim on it ends in the same transaction. The result's text goes:
        it was kept to be published again after a crash, and up to 1 MB an event, kept for good, the database
        grew without a bound (its id, status and conversation stay, for the dedupe)."""
        with self._transaction() as conn:
            conn.execute("UPDATE processed_events SET published_at = ?, result = NULL WHERE event_id = ?",
                         (rfc3339(), event_id))
            if owner is not None:
                conn.execute("DELETE FROM event_claims WHERE event_id = ? AND owner = ?", (event_id, owner))

    # -- claims: an event id being run, by one owner (a watcher process) at a time --
    def claimed_elsewhere(self, event_ids, owner, lease=None):
        """Of `event_ids`, those another owner's claim holds now (read only: nothing is claimed or renewed)."""
        host, held = _process_space(), set()
        for event_id in event_ids:
            row = self.conn().execute("SELECT * FROM event_claims WHERE event_id = ?", (event_id,)).fetchone()
            if row is not None and row["owner"] != owner and self._holds(row, host, lease):
                held.add(event_id)
        return held

    def _holds(self, claim, host, lease=None):
        """Whether an event_claims row holds. Of this process space (host, machine, pid namespace): while its
        process lives, known by its pid and its start (without /proc, by its pid alone); a row written before
        schema 11 (no start), as then: until its lease ends, while its pid lives. Of another: while it beats. A
        claim that has not changed (its beat, its expiry) for its lease by this process's clock is taken over.
        INFO: not by its expiry against our clock: a host whose clock ran 600 s ahead took over a live claim, and
        the event ran twice (attack round 16a); a claim never seen beating waits one lease from when it was seen."""
        if claim["host"] == host and claim["pid"]:
            if claim["started"] is None and _process_start(os.getpid()) is not None:
                return claim["expires_at"] > time.time() and _pid_alive(claim["pid"])
            return _pid_alive(claim["pid"]) and claim["started"] in (None, _process_start(claim["pid"]))
        now, event_id = self.clock(), claim["event_id"]
        beat = (claim["owner"], claim["beat"], claim["expires_at"])  # an older version's renewals move the expiry
        with self._seen_lock:
            seen = self._seen_claims.get(event_id)
            if seen is None or seen[0] != beat:
                seen = self._seen_claims[event_id] = (beat, now)
            # the last looked at are kept: evicted while it was still asked about, a dead claim waited a whole lease
            # again at every look, for good where more than 4,096 others were seen within a lease (round 16c)
            self._seen_claims.move_to_end(event_id)
            while len(self._seen_claims) > MAX_SEEN_CLAIMS:
                self._seen_claims.popitem(last=False)
        if seen[1] == now:
            return True
        # its owner's lease; a row of a version before schema 13 has none: what it spans from its claim, at least
        # the owner's lease (both by the owner's clock), or a taker of a shorter lease took a live claim (16b)
        owners = claim["lease"] or max(lease or 0, claim["expires_at"] - claim["claimed_at"])
        return now - seen[1] < owners

    def claim_event(self, event_id, owner, lease):
        """Claim `event_id` for `owner` for `lease` seconds, unless it is finished or another owner holds it.

        Returns (claimed, attempts, record): record is the processed_events row (a finished event is never
        claimed); attempts counts the owners that claimed it without finishing, this one included (a claim
        taken over from a process that died mid-run adds one; that is how a run that kills the watcher is found).
        Another owner's claim holds as _holds says: on this host for exactly as long as its process lives
        (a watcher frozen past its lease, a stopped process or a swapped-out VM, still runs the event when it
        wakes; its claim is what keeps a second run from starting beside it), across hosts until it has not beaten
        for its lease, which is why a result is recorded only behind record_event's fence."""
        now, host = time.time(), _process_space()
        with self._transaction() as conn:
            row = conn.execute("SELECT * FROM processed_events WHERE event_id = ?", (event_id,)).fetchone()
            record = dict(row) if row is not None else None
            if record is not None and record.get("published_at"):
                return False, 0, record
            claim = conn.execute("SELECT * FROM event_claims WHERE event_id = ?", (event_id,)).fetchone()
            if claim is not None and claim["owner"] != owner:
                if self._holds(claim, host, lease):
                    return False, claim["attempts"], record
                attempts = claim["attempts"] + 1
            else:
                attempts = claim["attempts"] if claim is not None else 1
            _put_claim(conn, event_id, owner, host, now, lease, attempts)
            with self._seen_lock:
                self._seen_claims.pop(event_id, None)
            return True, attempts, record

    def stopping_claims(self, owner):
        """`owner` stops, as asked (a signal): its runs now end by that stop, not by a crash. A supervisor that kills
        it before they finish (Kubernetes after 30 s, `docker stop` after 10) must not have them counted toward
        watcher.max_attempts: two such restarts set a valid event aside as `failed` (attack round 17c)."""
        self.conn().execute("UPDATE event_claims SET attempts = attempts - 1 WHERE owner = ? AND attempts > 0",
                            (owner,))

    def release_claim(self, event_id, owner):
        self.conn().execute("DELETE FROM event_claims WHERE event_id = ? AND owner = ?", (event_id, owner))

    def renew_claims(self, owner, lease):
        """Extend every claim `owner` holds by `lease` seconds from now (the watcher's heartbeat: a beat more)."""
        self.conn().execute("UPDATE event_claims SET expires_at = ?, lease = ?, beat = beat + 1 WHERE owner = ?",
                            (time.time() + lease, lease, owner))

    # -- message attempts: the offsets a consumer is handling, left behind by a crash --
    def begin_attempt(self, consumer, first, last, owner):
        """`owner` is handling offsets first..last of `consumer` (group/topic/partition). Returns (left, attempts):
        left is (first, last) of a mark another owner left there (it stopped while handling one of them; a mark
        overlapping a range of several offsets is kept, not replaced); attempts counts how often the single offset
        `first` == `last` has been begun in a row."""
        with self._transaction() as conn:
            row = conn.execute("SELECT * FROM message_attempts WHERE consumer = ?", (consumer,)).fetchone()
            left = (row["first_offset"], row["last_offset"]) if row is not None and row["owner"] != owner else None
            if left is not None and first != last and left[0] <= last and first <= left[1]:
                return left, row["attempts"]  # its mark stays: the offsets are now begun one at a time, counted
            same = row is not None and row["first_offset"] == row["last_offset"] == first == last
            attempts = row["attempts"] + 1 if same else 1
            conn.execute("INSERT OR REPLACE INTO message_attempts (consumer, first_offset, last_offset, owner, "
                         "attempts, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                         (consumer, first, last, owner, attempts, time.time()))
        return left, attempts

    def end_attempt(self, consumer, owner):
        self.conn().execute("DELETE FROM message_attempts WHERE consumer = ? AND owner = ?", (consumer, owner))

    def _transaction(self):
        """BEGIN IMMEDIATE … COMMIT (ROLLBACK on an exception): a read and the write it decides, at once."""
        return _Immediate(self.conn())

    def batch(self):
        """`with store.batch() as conn:` makes this thread's writes inside it one transaction (BEGIN IMMEDIATE …
        COMMIT, ROLLBACK on an exception); a batch inside a batch joins it. INFO: each commit also flushes the
        full-text index (a new FTS5 segment), which costs more than the rows: a run's messages written between
        two waits (Recorder.held) take one commit, not one each. Never hold one across a wait: it holds the
        database's write lock."""
        return _Batch(self)


class _Immediate:
    def __init__(self, conn):
        self.conn = conn

    def __enter__(self):
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, kind, exc, tb):
        self.conn.execute("COMMIT" if kind is None else "ROLLBACK")
        return False


class _Batch:
    def __init__(self, store):
        self.store = store
        self.conn = self.local = None

    def __enter__(self):
        self.local = local = self.store._local  # this thread's: its connection, and how deep its batches go
        self.conn = self.store.conn()
        depth = getattr(local, "batch", 0)
        if not depth:
            self.conn.execute("BEGIN IMMEDIATE")
        local.batch = depth + 1
        return self.conn

    def __exit__(self, kind, exc, tb):
        self.local.batch -= 1
        if not self.local.batch:
            self.conn.execute("COMMIT" if kind is None else "ROLLBACK")
        return False


def _conversation_row(row):
    """A conversation as callers want it: its progress list decoded (stored as JSON text); bytes a damaged row
    holds where text belongs, as text."""
    out = {key: _text(value) if isinstance(value, bytes) else value for key, value in dict(row).items()}
    if out.get("progress"):
        try:
            out["progress"] = json.loads(out["progress"])
        except (TypeError, ValueError):
            out["progress"] = None
    return out


def _text(value):
    """A stored value as text (None stays None): bytes decoded, replacing what is not UTF-8; numbers spelt."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _xor(data, stream):
    return (int.from_bytes(data, "big") ^ int.from_bytes(stream, "big")).to_bytes(len(data), "big")


# ---- Undo records in memory: where the database cannot be used ----


class MemoryUndo:
    """Undo records kept in this process's memory where the database cannot be used (it cannot be opened, or this
    Python has no sqlite3): the file tools still record what they change, so chat's /undo works within the
    session; `xzatoma undo` after the process cannot (round 19d: changes were made with no record at all, and
    only "no conversation history" was said). At most MAX_MEMORY_UNDO_BYTES of content: the oldest go first."""

    def __init__(self):
        self._records = []
        self._lock = threading.Lock()
        self._next = 1

    def record_undo(self, conversation_id, tool_call_id, tool, path, kind, content=None, mode=None, after_hash=None):
        record = {"conversation_id": conversation_id, "tool_call_id": tool_call_id, "tool": tool, "path": path,
                  "kind": kind, "content": bytes(content) if content is not None else None, "mode": mode,
                  "after_hash": after_hash, "created_at": rfc3339(), "restored_at": None}
        with self._lock:
            record["id"] = self._next
            self._next += 1
            self._records.append(record)
            total = sum(len(r["content"] or b"") for r in self._records)
            while total > MAX_MEMORY_UNDO_BYTES and len(self._records) > 1:
                total -= len(self._records.pop(0)["content"] or b"")
        return record["id"]

    def _record(self, undo_id):
        return next((r for r in self._records if r["id"] == undo_id), {})

    def set_undo_after(self, undo_id, after_hash):
        with self._lock:
            self._record(undo_id)["after_hash"] = after_hash

    def mark_restored(self, undo_id):
        with self._lock:
            self._record(undo_id)["restored_at"] = rfc3339()

    def undo_records(self, conversation_id=None, pending=True, limit=None, working_dir=None):
        with self._lock:
            rows = [dict(r) for r in reversed(self._records) if (conversation_id is None or
                    r["conversation_id"] == conversation_id) and not (pending and r["restored_at"])]
        return rows[:limit] if limit else rows

    def conversation(self, id):
        raise NotFound("no conversation %s (history is unavailable)" % id)

    def cache_get(self, url, ttl):
        return None

    def cache_put(self, *args):
        pass


#: what MemoryUndo keeps at most, in bytes of saved content
MAX_MEMORY_UNDO_BYTES = 256 << 20
_memory_undo = []


def memory_undo():
    """This process's MemoryUndo (one: a chat's conversations and subagents share it)."""
    if not _memory_undo:
        _memory_undo.append(MemoryUndo())
    return _memory_undo[0]


# ---- Processes: who runs a conversation, who holds a claim ----


def _hostname():
    try:
        return os.uname().nodename
    except AttributeError:  # not POSIX
        import platform
        return platform.node()


def _process_space():
    """Where a pid means one process: this host name and, on Linux, this pid namespace (two containers sharing
    a host name and a store must not judge each other's pids: each sees only its own) of this machine's boot (an
    init namespace reads the same on every machine: two named alike took each other's live claims, round 16a)."""
    try:
        return "%s %s %s" % (_hostname(), os.readlink("/proc/self/ns/pid"), _boot_id())
    except OSError:
        return _hostname()


def _boot_of(then, now):
    """Process space `then` as seen from `now`: "this" boot of this machine, an "earlier" one, or None (another pid
    namespace or machine). The same host name and pid namespace, and machine id where both know one (a machine
    without one, or a row written before machine ids were, is taken for this one: a reboot is likelier than a
    machine of the same name; a row of that format from this boot is judged by its pid, round 16e)."""
    then, now = then.split(" "), now.split(" ")
    if len(then) != 3 or len(now) != 3 or then[:2] != now[:2]:
        return None
    (machine, _, boot), (machine_now, _, boot_now) = then[2].rpartition("/"), now[2].rpartition("/")
    if machine != machine_now and "-" not in (machine or "-", machine_now or "-"):
        return None
    return "this" if boot == boot_now else "earlier"


def _boot_id():
    """This machine and its boot: machine-id (systemd's, stable across boots) and the kernel's random boot id,
    as `machine/boot`; read once."""
    if not _boot:
        ids = []
        for paths in (("/etc/machine-id", "/var/lib/dbus/machine-id"), ("/proc/sys/kernel/random/boot_id",)):
            for path in paths:
                try:
                    with open(path) as fh:
                        found = fh.read().strip().replace(" ", "").replace("/", "")
                except OSError:
                    continue
                if found and found != "uninitialized":  # systemd's word for one not made yet (machine-id(5))
                    ids.append(found)
                    break
            else:
                ids.append("-")
        _boot.append("/".join(ids))
    return _boot[0]


_boot = []


def _runner_alive(row):
    """Whether the process a 'running' conversation row names (pid, host, space, started) lives: True, False (it is
    gone), or None (another host, pid namespace or machine: not ours to judge)."""
    if row["host"] != _hostname():
        return None
    space = _process_space()
    boot = _boot_of(row["space"], space) if row["space"] not in (None, space) else "this"
    if boot == "earlier":
        # an earlier boot of this machine (its name, pid namespace and machine id; another boot): that process is
        # gone; left running, a run cut off by a reboot was never reaped, nor pruned (round 16b). Not another
        # machine of the same name: its live run was marked interrupted, then pruned (16c)
        return False
    if boot is None:
        return None
    return bool(row["pid"] and _pid_alive(row["pid"]) and row["started"] in (None, _process_start(row["pid"])))


def _pid_alive(pid):
    """Whether process `pid` lives: it exists, and has not died unreaped (a zombie, whose parent has not waited for
    it: a supervisor or a PID 1 that never reaps keeps one for good, and its claims with it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    except OSError:
        return False
    stat = _proc_stat(pid)
    return stat is None or stat[0] not in (b"Z", b"X", b"x")


def _put_claim(conn, event_id, owner, host, now, lease, attempts):
    """`owner`'s claim on `event_id` until now + lease, as this process (its pid and start time) of `host`; a
    claim taken again (a record's renewal) beats once more."""
    conn.execute("INSERT OR REPLACE INTO event_claims (event_id, owner, host, pid, claimed_at, expires_at, attempts, "
                 "started, lease, beat) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, coalesce((SELECT beat + 1 FROM event_claims "
                 "WHERE event_id = ?), 0))",
                 (event_id, owner, host, os.getpid(), now, now + lease, attempts, _process_start(os.getpid()), lease,
                  event_id))


def _process_start(pid):
    """When process `pid` started, in clock ticks since boot (field 22 of /proc/<pid>/stat, proc(5)), or None
    where there is no /proc. Not a wall-clock time: a clock stepped (a VM resumed, NTP) does not change it."""
    stat = _proc_stat(pid)
    try:
        return int(stat[19]) if stat is not None else None
    except (ValueError, IndexError):
        return None


def _proc_stat(pid):
    """The fields of /proc/<pid>/stat after the command's name (the first is the state), or None without it."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
