"""Python 3.9 compatibility and import hygiene (start-up is a feature).

The suite itself also runs on 3.9 in CI, and scripts/build_pyz.py compiles every module with every
interpreter it finds; this is the cheap check that catches newer syntax on any interpreter.
"""

import ast
import glob
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

PROJECT_FILES = sorted(set(glob.glob(os.path.join(ROOT, "*.py")) + glob.glob(os.path.join(ROOT, "*", "*.py"))))

#: what `import xzatoma` must never load: each is imported inside the function that needs it
HEAVY = ("sqlite3", "concurrent.futures", "http.client", "ssl", "requests", "urllib3", "yaml", "keyring",
         "prometheus_client", "kafka")


@pytest.mark.parametrize("path", PROJECT_FILES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_file_parses_as_python_3_9(path):
    with open(path, encoding="utf-8") as fh:
        ast.parse(fh.read(), path, feature_version=(3, 9))


def test_importing_xzatoma_loads_nothing_heavy_and_no_third_party_module():
    """In a clean interpreter: what `import xzatoma` adds to what the interpreter loaded by itself."""
    code = ("import sys, json\nbefore = set(sys.modules)\nsys.path.insert(0, %r)\nimport xzatoma\n"
            "print(json.dumps({m: getattr(sys.modules[m], '__file__', None) for m in set(sys.modules) - before}))"
            % ROOT)
    r = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    added = json.loads(r.stdout)
    assert "xzatoma" in added
    heavy = [m for m in added if m in HEAVY or m.startswith(tuple(h + "." for h in HEAVY))]
    assert not heavy, "import xzatoma loaded %s: import them inside the functions that need them" % heavy
    import sysconfig
    stdlib = tuple(os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib"))
    third_party = [m for m, f in added.items()
                   if f and m not in ("xzatoma", "xzatoma_core") and not os.path.realpath(f).startswith(stdlib)]
    assert not third_party, third_party


def test_the_main_objects_take_a_few_cohesive_values():
    """Session, ToolContext and Agent get what they need through their constructor, at most ten values each
    (issue 27: 22, 18 and 16 had grown into them); more is a sign of a value object waiting to be named."""
    import inspect
    import xzatoma
    import xzatoma_tools
    for cls in (xzatoma.Session, xzatoma_tools.ToolContext, xzatoma.Agent, xzatoma.RunParts, xzatoma.SubagentLink):
        params = list(inspect.signature(cls.__init__).parameters)[1:]
        assert len(params) <= 10, (cls.__name__, params)


def test_the_readme_starts_with_an_install_and_a_test_command_that_go_together():
    """Its first two commands: pipx's isolated virtualenv has no pytest, so the test command must run the
    interpreter the install command gave the test extra to."""
    import os
    from conftest import ROOT
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as fh:
        install, test = [line.split("#")[0].strip() for line in fh.read().split("\n")[2:4]]
    assert install == 'python3 -m venv .venv && .venv/bin/pip install ".[test]"'
    assert test == ".venv/bin/python -m pytest"
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as fh:
        extra = re.search(r"^test = \[(.*)\]$", fh.read(), re.M).group(1)
    assert '"pytest' in extra


@pytest.mark.parametrize("missing", ["_ctypes", "_sqlite3"])
def test_a_python_without_an_optional_extension_still_runs(cli, fake, tmp_path, missing):
    """A Python built without libffi has no _ctypes, one without libsqlite3 no _sqlite3: a run works without
    them, with at most one warning (round 19d: no _ctypes ended every run with "internal error")."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / (missing + ".py")).write_text("raise ModuleNotFoundError(\"No module named '%s'\", name=%r)\n"
                                            % (missing, missing))
    (cli.workdir / "notes.txt").write_text("hello\n")
    cli.use(fake)
    fake.add({"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]}, {"content": "fine"})
    r = cli.run("run", "--prompt", "x", env={"PYTHONPATH": str(shadow)})
    assert r.returncode == 0 and r.stdout == "fine\n", r.stderr
    assert "internal error" not in r.stderr and r.stderr.count("warning:") <= 1
    if missing == "_sqlite3":  # no history, and the person is told the run's changes cannot be undone (#13)
        assert "file changes this run makes cannot be undone afterwards" in r.stderr
