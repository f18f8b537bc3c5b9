"""Real work with a real model: small checkable tasks run through `xzatoma run`, the way a person would.

    python bench/tasks.py --base-url http://127.0.0.1:8000/v1 --model qwen2.5-coder-1.5b
    python bench/tasks.py --provider ollama --base-url http://127.0.0.1:11434 --model qwen2.5-coder:1.5b
    python bench/tasks.py ... --only create_file,bump_json --repeat 3 -- --temperature 0.2

Each task gets a fresh working directory with its files, runs `xzatoma run --json …` as a subprocess (its own
HOME, XZATOMA_HOME and config, so nothing of the person's is read or written) and is then checked: the files
for a change, the answer for a fact. Printed per task: done or not, the run's status and exit code, turns,
tool calls, tokens and seconds; then the pass rate, and the "false completions": runs that reported
`completed` (exit 0) while the check failed — the number an agent must keep at zero.

--record DIR puts a recording proxy between xzatoma and the server: every request and the server's reply
bytes go to DIR/<task>.jsonl, the material of the replayed fixtures in tests/replies/.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "xzatoma.py")


# ---- The tasks: (files, prompt or plan, check) ----

def _read(work, name):
    try:
        with open(os.path.join(work, name), encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return None


def _python(work, *args):
    r = subprocess.run([sys.executable] + list(args), cwd=work, capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


class Task:
    def __init__(self, name, files, prompt, check, plan=None, flags=()):
        self.name = name
        self.files = files  #: relative path -> content
        self.prompt = prompt
        self.check = check  #: check(work, answer) -> None when done, else why not
        self.plan = plan  #: a plan file's text (run --plan), instead of the prompt
        self.flags = list(flags)


def check_create(work, answer):
    text = _read(work, "greeting.txt")
    return None if text is not None and "Hello, world" in text else "greeting.txt: %r" % text


def check_port(work, answer):
    return None if "8123" in answer else "answer lacks 8123"


def check_rename(work, answer):
    utils, main = _read(work, "utils.py") or "", _read(work, "main.py") or ""
    if "calc_total" in utils + main or "def compute_total" not in utils or "compute_total(" not in main:
        return "not renamed everywhere"
    code, out = _python(work, "main.py")
    return None if code == 0 and "60" in out else "main.py fails: %s" % out[-200:]


def check_count(work, answer):
    import re
    return None if re.search(r"\b7\b", answer) or "seven" in answer.lower() else "answer lacks 7"


def check_fix_test(work, answer):
    code, out = _python(work, "test_prices.py")
    text = _read(work, "prices.py") or ""
    if "return round(price * (1 - rate), 2)" not in text:
        return "prices.py changed: the test was the bug"
    return None if code == 0 else "test still fails: %s" % out[-200:]


def check_plan(work, answer):
    text = _read(work, "CHANGES.md") or ""
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    return None if lines[:2] == ["## 1.0.0", "- first release"] else "CHANGES.md: %r" % text


def check_append(work, answer):
    text = _read(work, "todo.txt") or ""
    lines = [l for l in text.splitlines() if l.strip()]
    return None if lines == ["write report", "call Sam", "buy milk"] else "todo.txt: %r" % text


def check_definition(work, answer):
    return None if "tokenizer.py" in answer else "answer lacks tokenizer.py"


def check_bump(work, answer):
    try:
        data = json.loads(_read(work, "package.json") or "")
    except ValueError:
        return "package.json is not JSON"
    return None if data.get("version") == "2.4.1" and data.get("name") == "demo" else "package.json: %r" % data


def check_script(work, answer):
    return None if "5050" in answer else "answer lacks 5050"


def check_replace(work, answer):
    text = _read(work, "app.cfg") or ""
    return None if "debug = false" in text and "debug = true" not in text and "name = demo" in text \
        else "app.cfg: %r" % text


def check_lines(work, answer):
    import re
    return None if re.search(r"\b12\b", answer) or "twelve" in answer.lower() else "answer lacks 12"


TASKS = [
    Task("create_file", {}, "Create a file named greeting.txt that contains the text: Hello, world", check_create),
    Task("config_value", {"settings.ini": "[database]\nport = 5432\n\n[server]\nhost = 0.0.0.0\nport = 8123\n"},
         "Which port does the server section of settings.ini use? Answer with the number.", check_port),
    Task("rename_function", {
        "utils.py": "def calc_total(prices):\n    return sum(prices)\n",
        "main.py": "from utils import calc_total\n\nprint(calc_total([10, 20, 30]))\n"},
        "Rename the function calc_total to compute_total in utils.py and update main.py to use the new name.",
        check_rename),
    Task("count_files", dict({"docs/%s.md" % n: "# %s\n" % n for n in ("intro", "setup", "usage", "api", "faq",
                                                                      "changelog", "license")},
                             **{"docs/logo.png": "png", "docs/notes.txt": "n", "README.md": "# r\n"}),
         "How many .md files are in the docs directory?", check_count),
    Task("fix_assert", {
        "prices.py": "def discounted(price, rate):\n    return round(price * (1 - rate), 2)\n",
        "test_prices.py": "from prices import discounted\n\nassert discounted(100, 0.25) == 70.0\nprint('ok')\n"},
        "test_prices.py fails because its expected value is wrong: discounted(100, 0.25) is 75.0. "
        "Fix the assert in test_prices.py.", check_fix_test),
    Task("two_step_plan", {}, None, check_plan, plan=(
        "goal: Start a changelog\ninstructions:\n  - Create CHANGES.md containing the line '## 1.0.0'\n"
        "  - Add the line '- first release' at the end of CHANGES.md\n")),
    Task("append_line", {"todo.txt": "write report\ncall Sam\n"},
         "Add a line 'buy milk' at the end of todo.txt.", check_append),
    Task("find_definition", {"src/lexer.py": "import re\n\nTOKEN = re.compile(r'\\w+')\n",
                             "src/tokenizer.py": "class Tokenizer:\n    def split(self, text):\n"
                                                 "        return text.split()\n",
                             "src/main.py": "from tokenizer import Tokenizer\n\nprint(Tokenizer().split('a b'))\n"},
         "Which file defines the class Tokenizer?", check_definition),
    Task("bump_version", {"package.json": '{\n  "name": "demo",\n  "version": "2.4.0",\n  "private": true\n}\n'},
         "Bump the version in package.json from 2.4.0 to 2.4.1.", check_bump),
    Task("run_script", {"sum.py": "print(sum(range(1, 101)))\n"},
         "Run sum.py with python3 and tell me the number it prints.", check_script, flags=["--allow-dangerous"]),
    Task("replace_value", {"app.cfg": "name = demo\ndebug = true\nworkers = 4\n"},
         "In app.cfg, change debug from true to false.", check_replace),
    Task("count_lines", {"data.csv": "".join("row%d,%d\n" % (i, i * i) for i in range(12))},
         "How many lines does data.csv have?", check_lines),
]



# A second set, written after the loop's changes were made against TASKS and never used to tune them: the
# same kinds of work in other words and files (issue 21 judges on a held-out set). --set heldout.

def check_json_created(work, answer):
    try:
        data = json.loads(_read(work, "config.json") or "")
    except ValueError:
        return "config.json is not JSON: %r" % _read(work, "config.json")
    return None if data == {"debug": False} else "config.json: %r" % data


def check_yaml_value(work, answer):
    return None if "45" in answer else "answer lacks 45"


def check_rename_variable(work, answer):
    text = _read(work, "stats.py") or ""
    if "cnt" in text or "count" not in text:
        return "stats.py: %r" % text
    code, out = _python(work, "stats.py")
    return None if code == 0 and "3" in out else "stats.py fails: %s" % out[-200:]


def check_count_py(work, answer):
    import re
    return None if re.search(r"\b4\b", answer) or "four" in answer.lower() else "answer lacks 4"


def check_fix_add(work, answer):
    code, out = _python(work, "-c", "from calc import add; assert add(2, 3) == 5; print('ok')")
    return None if code == 0 else "add is still wrong: %s" % out[-200:]


def check_notes_plan(work, answer):
    lines = [l.strip() for l in (_read(work, "notes.md") or "").splitlines() if l.strip()]
    return None if lines == ["# Notes", "- item one"] else "notes.md: %r" % _read(work, "notes.md")


def check_insert_top(work, answer):
    lines = [l for l in (_read(work, "shopping.txt") or "").splitlines() if l.strip()]
    return None if lines == ["# Shopping", "eggs", "bread"] else "shopping.txt: %r" % _read(work, "shopping.txt")


def check_find_function(work, answer):
    return None if "cli.py" in answer else "answer lacks cli.py"


def check_port_set(work, answer):
    try:
        data = json.loads(_read(work, "server.json") or "")
    except ValueError:
        return "server.json is not JSON"
    return None if data == {"host": "localhost", "port": 9090} else "server.json: %r" % data


def check_run_count(work, answer):
    return None if "42" in answer else "answer lacks 42"


HELDOUT = [
    Task("make_json", {}, 'Create a file config.json containing the JSON object {"debug": false}.', check_json_created),
    Task("yaml_value", {"app.yaml": "name: shop\nhttp:\n  timeout: 45\n  retries: 3\n"},
         "What is the http timeout in app.yaml?", check_yaml_value),
    Task("rename_variable", {"stats.py": "values = [1, 2, 3]\ncnt = len(values)\nprint(cnt)\n"},
         "In stats.py, rename the variable cnt to count.", check_rename_variable),
    Task("count_py", dict({"src/%s.py" % n: "x = 1\n" for n in ("app", "db", "models", "views")},
                          **{"src/README.txt": "r", "src/data.json": "{}", "setup.cfg": "[x]\n"}),
         "How many Python files are there in src?", check_count_py),
    Task("fix_add", {"calc.py": "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"},
         "add() in calc.py subtracts instead of adding. Fix it.", check_fix_add),
    Task("notes_plan", {}, None, check_notes_plan, plan=(
        "goal: Start a notes file\ninstructions:\n  - Create notes.md with the heading '# Notes'\n"
        "  - Append the line '- item one' to notes.md\n")),
    Task("insert_top", {"shopping.txt": "eggs\nbread\n"},
         "Add the line '# Shopping' at the top of shopping.txt.", check_insert_top),
    Task("find_function", {"app/cli.py": "import sys\n\n\ndef parse_args(argv):\n    return argv[1:]\n",
                           "app/core.py": "def run(args):\n    return len(args)\n",
                           "app/__init__.py": ""},
         "Which file defines the function parse_args?", check_find_function),
    Task("set_port", {"server.json": '{\n  "host": "localhost",\n  "port": 8080\n}\n'},
         "Change the port in server.json to 9090.", check_port_set),
    Task("run_count", {"count.py": "print(6 * 7)\n"},
         "Run count.py with python3 and tell me what it prints.", check_run_count, flags=["--allow-dangerous"]),
]


# A third set, written after the loop's changes of the held-out round (what a task names read first, loose
# edits, …) and run once for the record before anything was drawn from it: the same kinds of work in other
# words and files. --set fresh.

def check_yaml_created(work, answer):
    import yaml
    try:
        data = yaml.safe_load(_read(work, "settings.yaml") or "")
    except yaml.YAMLError:
        return "settings.yaml is not YAML"
    return None if data == {"mode": "fast"} else "settings.yaml: %r" % data


def check_ini_port(work, answer):
    return None if "6543" in answer and "11211" not in answer else "answer lacks 6543 (or names 11211)"


def check_rename_fetch(work, answer):
    text = _read(work, "util.py") or ""
    if "fetch" in text or "def load(" not in text:
        return "util.py: %r" % text
    code, out = _python(work, "util.py")
    return None if code == 0 and out.strip() == "3" else "util.py fails: %s" % out[-200:]


def check_count_markdown(work, answer):
    import re
    return None if re.search(r"\b3\b", answer) or "three" in answer.lower() else "answer lacks 3"


def check_fix_double(work, answer):
    code, out = _python(work, "-c", "from mathx import double, half; assert double(5) == 10 and half(8) == 4")
    return None if code == 0 else "double is still wrong: %s" % out[-200:]


def check_todo_plan(work, answer):
    lines = [l.strip() for l in (_read(work, "todo.md") or "").splitlines() if l.strip()]
    return None if lines == ["# Todo", "- call Ann"] else "todo.md: %r" % _read(work, "todo.md")


def check_append_end(work, answer):
    lines = [l for l in (_read(work, "groceries.txt") or "").splitlines() if l.strip()]
    return None if lines == ["eggs", "bread", "milk"] else "groceries.txt: %r" % _read(work, "groceries.txt")


def check_find_class(work, answer):
    return None if "parse.py" in answer else "answer lacks parse.py"


def check_set_version(work, answer):
    try:
        data = json.loads(_read(work, "package.json") or "")
    except ValueError:
        return "package.json is not JSON"
    return None if data == {"name": "tool", "version": "3.1.0"} else "package.json: %r" % data


def check_run_hello(work, answer):
    return None if "hi hi" in answer else "answer lacks 'hi hi'"


FRESH = [
    Task("make_yaml", {}, "Create settings.yaml with the key mode set to fast.", check_yaml_created),
    Task("ini_port", {"db.ini": "[database]\nhost = db\nport = 6543\n\n[cache]\nport = 11211\n"},
         "What port does the database section of db.ini use?", check_ini_port),
    Task("rename_fetch", {"util.py": "def fetch(x):\n    return x\n\n\nprint(fetch(3))\n"},
         "In util.py, rename the function fetch to load.", check_rename_fetch),
    Task("count_markdown", {"docs/a.md": "# a\n", "docs/b.md": "# b\n", "docs/c.md": "# c\n",
                            "docs/img.png": "png", "docs/notes.txt": "n"},
         "How many Markdown files are in the docs folder?", check_count_markdown),
    Task("fix_double", {"mathx.py": "def double(n):\n    return n + 2\n\n\ndef half(n):\n    return n / 2\n"},
         "double() in mathx.py returns its input plus two instead of twice its input. Fix it.", check_fix_double),
    Task("todo_plan", {}, None, check_todo_plan, plan=(
        "goal: Start a todo list\ninstructions:\n  - Create todo.md with the heading '# Todo'\n"
        "  - Append the line '- call Ann' to todo.md\n")),
    Task("append_end", {"groceries.txt": "eggs\nbread\n"},
         "Add the line 'milk' at the end of groceries.txt.", check_append_end),
    Task("find_class", {"lib/parse.py": "class Parser:\n    pass\n", "lib/io.py": "class Reader:\n    pass\n",
                        "lib/__init__.py": ""},
         "Which file defines the class Parser?", check_find_class),
    Task("set_version", {"package.json": '{\n  "name": "tool",\n  "version": "3.0.9"\n}\n'},
         "Set the version in package.json to 3.1.0.", check_set_version),
    Task("run_hello", {"hello.py": "print('hi ' * 2)\n"},
         "Run hello.py with python3 and report its output.", check_run_hello, flags=["--allow-dangerous"]),
]
SETS = {"tasks": TASKS, "heldout": HELDOUT, "fresh": FRESH}

# ---- A recording proxy: what the server really sends, for the replayed fixtures ----

def start_recorder(upstream, out_path):
    """A proxy on 127.0.0.1 that forwards to `upstream` and appends each exchange to `out_path` (JSON lines:
    method, path, request body, status, content type, response body). Returns (base url, stop)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import urlsplit
    import http.client
    target = urlsplit(upstream)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _forward(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            conn = http.client.HTTPConnection(target.hostname, target.port or 80, timeout=3600)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
            path = target.path.rstrip("/") + self.path[len(prefix):] if self.path.startswith(prefix) else self.path
            conn.request(self.command, path, body=body or None, headers=headers)
            resp = conn.getresponse()
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                    self.send_header(k, v)
            self.send_header("Connection", "close")  # the body streams through as it comes, ended by the close
            self.end_headers()
            data = []
            try:
                while True:
                    chunk = resp.read1(65536)
                    if not chunk:
                        break
                    data.append(chunk)
                    self.wfile.write(chunk)
                    self.wfile.flush()
            except (OSError, http.client.HTTPException):
                pass  # the client went away (xzatoma cut a looping reply, or timed out): so does the server
            finally:
                conn.close()
                self.close_connection = True
            with lock, open(out_path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"method": self.command, "path": self.path,
                                     "request": json.loads(body) if body else None, "status": resp.status,
                                     "content_type": resp.getheader("Content-Type"),
                                     "response": b"".join(data).decode("utf-8", "replace")}) + "\n")

        do_GET = do_POST = _forward

    prefix = target.path.rstrip("/")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return "http://127.0.0.1:%d%s" % (server.server_address[1], prefix), server.shutdown


# ---- Running one task ----

def run_task(task, args, extra, record_dir=None):
    base = tempfile.mkdtemp(prefix="xz-task-")
    try:
        work, home = os.path.join(base, "work"), os.path.join(base, "home")
        for d in (work, home, os.path.join(base, "config", "xzatoma")):
            os.makedirs(d, exist_ok=True)
        for rel, content in task.files.items():
            path = os.path.join(work, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(content)
        url, stop = args.base_url, None
        if record_dir:
            url, stop = start_recorder(args.base_url, os.path.join(record_dir, task.name + ".jsonl"))
        section = {"ollama": {"host": url, "model": args.model},
                   "openai": {"base_url": url, "model": args.model, "api": args.api}}[args.provider]
        with open(os.path.join(base, "config", "xzatoma", "config.yaml"), "w") as fh:
            json.dump({"provider": {"type": args.provider, args.provider: section}}, fh)  # JSON is YAML
        env = {k: v for k, v in os.environ.items() if not k.startswith(("XZATOMA_", "OPENAI_", "OLLAMA_"))}
        env.update(HOME=home, XZATOMA_HOME=os.path.join(base, "xzhome"), XDG_CONFIG_HOME=os.path.join(base, "config"),
                   NO_COLOR="1", OPENAI_API_KEY=args.api_key)
        cmd = [sys.executable, SCRIPT, "run", "--json", "--timeout", str(args.timeout)] + task.flags + extra
        if task.plan:
            with open(os.path.join(work, "task.yaml"), "w") as fh:
                fh.write(task.plan)
            cmd += ["--plan", "task.yaml"]
        else:
            cmd += ["--", task.prompt]
        started = time.monotonic()
        r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=args.timeout + 60)
        seconds = time.monotonic() - started
        if stop:
            stop()
        try:
            data = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            data = {"status": "no-json", "answer": "", "error": r.stderr.strip().splitlines()[-1:] or ""}
        why = task.check(work, data.get("answer") or "")
        usage = data.get("usage") or {}
        return {"task": task.name, "done": why is None, "why": why, "status": data.get("status"),
                "exit": r.returncode, "turns": data.get("turns", 0), "tool_calls": data.get("tool_calls", 0),
                "tokens": usage.get("total_tokens", 0), "seconds": round(seconds, 1),
                "error": data.get("error"), "warnings": data.get("warnings") or []}
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="arguments after -- go to every `xzatoma run` (e.g. -- --temperature 0.2)")
    p.add_argument("--provider", choices=("openai", "ollama"), default="openai")
    p.add_argument("--base-url", required=True, help="the server (OpenAI-compatible: .../v1; Ollama: its host)")
    p.add_argument("--model", required=True)
    p.add_argument("--api", choices=("chat", "responses"), default="chat")
    p.add_argument("--api-key", default="none", help="sent as OPENAI_API_KEY (local servers ignore it)")
    p.add_argument("--set", choices=sorted(SETS), default="tasks",
                   help="the task set: tasks (the loop was tuned on it), heldout (written after it; later "
                        "tuned on too), fresh (written after that, run once for the record)")
    p.add_argument("--only", help="comma-separated task names")
    p.add_argument("--repeat", type=int, default=1, help="runs of each task")
    p.add_argument("--timeout", type=int, default=600, help="seconds per run (xzatoma --timeout)")
    p.add_argument("--record", metavar="DIR", help="record every server exchange to DIR/<task>.jsonl")
    p.add_argument("--keep", action="store_true", help="keep the working directories (printed)")
    p.add_argument("--json", action="store_true", help="one JSON object per run instead of the table")
    args = p.parse_args(argv)
    tasks = [t for t in SETS[args.set] if not args.only or t.name in args.only.split(",")]
    if args.record:
        os.makedirs(args.record, exist_ok=True)
    rows = []
    print("%-16s %-5s %-11s %4s %5s %5s %8s %7s  %s" % ("task", "done", "status", "exit", "turns", "tools",
                                                        "tokens", "seconds", "why not"), flush=True)
    for _ in range(args.repeat):
        for task in tasks:
            row = run_task(task, args, extra, args.record)
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print("%-16s %-5s %-11s %4d %5d %5d %8d %7.1f  %s" % (
                    row["task"], "yes" if row["done"] else "no", row["status"], row["exit"], row["turns"],
                    row["tool_calls"], row["tokens"], row["seconds"],
                    (row["why"] or "") + (" [%s]" % row["error"] if row["error"] and not row["done"] else "")),
                    flush=True)
    done = sum(r["done"] for r in rows)
    false = [r["task"] for r in rows if not r["done"] and r["status"] == "completed"]
    print("\npassed %d of %d (%.0f%%) · false completions %d%s · turns %.1f, tool calls %.1f, tokens %d, "
          "%.0f s per run" % (done, len(rows), 100.0 * done / max(1, len(rows)), len(false),
                              " (%s)" % ", ".join(false) if false else "", sum(r["turns"] for r in rows) / len(rows),
                              sum(r["tool_calls"] for r in rows) / len(rows), sum(r["tokens"] for r in rows) / len(rows),
                              sum(r["seconds"] for r in rows) / len(rows)))


if __name__ == "__main__":
    main()
