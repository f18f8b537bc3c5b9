#!/usr/bin/env python3
"""Build dist/xzatoma.pyz: XZatoma in one file for servers that have a bare Python 3.9+ and nothing else.

    python3 scripts/build_pyz.py [-o dist/xzatoma.pyz] [--python PATH ...] [--wheels dist/wheels]

The archive is a zipapp (`#!/usr/bin/env python3`) holding the project's modules and the pure-Python
parts of its runtime dependencies at the versions pinned below, fetched by pip from the package registry
at build time into dist/wheels/ (ignored by git, never committed; reused by later builds, which then need
no network), each checked against its pinned sha256 at every build.
`keyring` is left out (credentials use the 0600 file), so are the optional extras (metrics, kafka).

Start-up: zipimport never writes bytecode, and it only uses a `.pyc` that sits beside its `.py` and
carries the running interpreter's magic number. So the archive holds one tree per interpreter version,
and a few-line `__main__.py` puts the tree that matches the running interpreter on sys.path. The
oldest version's tree is the archive's root and holds the sources beside its bytecode (for tracebacks,
and for interpreters without a tree of their own); the others, `cpython-3N/`, hold bytecode and data
files only, which keeps the archive's directory (parsed at every start) and its size small. The oldest
is the root because Python 3.9's zipimport cannot read a data file below a subdirectory of the
archive; later versions can. Bytecode is compiled by
every supported interpreter found at build time (python3.9 … on PATH and under pyenv), or by the ones
named with --python; an interpreter without a tree of its own still runs the archive, compiling the
sources in memory at each start (slower).
"""

# ---- Pins ----

import argparse
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXIT_NO_WHEELS = 3  #: pip could not fetch the pinned wheels (the test suite skips rather than fails on it)
OLDEST = (3, 9)  #: pyproject's requires-python: the oldest interpreter the archive must run on

#: (distribution, version, wheel file name, sha256, top-level packages taken from it). The newest
#: releases that still support Python 3.9. PyYAML publishes no pure-Python wheel: its .py files are
#: taken from a CPython 3.9 wheel and its C extension (`_yaml`) is left out, so yaml falls back to its
#: pure-Python loader (`yaml.__with_libyaml__` is False). HTTP is the standard library's (http.client,
#: ssl with the system's CA certificates): requests and its four dependencies are no longer needed.
PINS = [
    ("pyyaml", "6.0.3", "pyyaml-6.0.3-cp39-cp39-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl",
     "0150219816b6a1fa26fb4699fb7daa9caf09eb1999f3b70fb6e786805e80375a", ["yaml"]),
]
#: how pip is asked for each kind of wheel: the pure ones, and PyYAML's CPython 3.9 one
PURE_WHEEL = ["--implementation", "py", "--abi", "none", "--platform", "any"]
PYYAML_WHEEL = ["--implementation", "cp", "--abi", "cp39", "--platform", "manylinux2014_x86_64"]

#: never bundled: compiled code and type stubs
SKIP_SUFFIXES = (".so", ".pyd", ".dylib", ".pyi", ".js", "py.typed")
SKIP_PREFIXES = ()

#: the archive's entry point. Python 2 and 3.0–3.8 must still be able to read it, to say why they
#: cannot run XZatoma: no f-strings. `{tags}` is filled in by the build.
MAIN = '''\
# XZatoma in one file, built by scripts/build_pyz.py: put the bytecode tree for this interpreter on sys.path.
import os
import sys

if sys.version_info < {oldest}:
    sys.stderr.write("xzatoma: error: needs Python {oldest_text} or newer; this is Python %d.%d: "
                     "run it with a newer python3\\n" % sys.version_info[:2])
    sys.exit(2)
TAGS = {tags}  # trees with bytecode; the first is the archive's root, which also serves any other interpreter
tag = getattr(sys.implementation, "cache_tag", None)
here = os.path.abspath(os.path.dirname(__file__))  # absolute: imports done later still find the archive
sys.path.insert(0, os.path.join(here, tag) if tag in TAGS[1:] else here)
import xzatoma_core  # noqa: E402

sys.exit(xzatoma_core.main())
'''

# ---- Fetching the pinned wheels ----


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 16), b""):
            h.update(block)
    return h.hexdigest()


def fetch_wheels(cache):
    """The pinned wheels, each checked against its sha256: those already in `cache` are used as they
    are, the others are downloaded into it by pip (so only a machine's first build needs the registry)."""
    os.makedirs(cache, exist_ok=True)
    for _, _, filename, digest, _ in PINS:
        path = os.path.join(cache, filename)
        if os.path.isfile(path) and sha256(path) != digest:
            os.remove(path)  # a damaged or foreign file: fetch it again
    missing = [p for p in PINS if not os.path.isfile(os.path.join(cache, p[2]))]
    if missing:
        import importlib.util
        if importlib.util.find_spec("pip") is None:
            sys.stderr.write("build_pyz: %s has no pip to fetch the pinned wheels: run this script with a python "
                             "that has pip, or put these files in %s: %s\n"
                             % (sys.executable, cache, ", ".join(p[2] for p in missing)))
            raise SystemExit(EXIT_NO_WHEELS)
        for platform in (PURE_WHEEL, PYYAML_WHEEL):
            pins = [p for p in missing if (p[0] == "pyyaml") == (platform is PYYAML_WHEEL)]
            if not pins:
                continue
            with tempfile.NamedTemporaryFile("w", suffix=".txt") as requirements:
                requirements.writelines("%s==%s --hash=sha256:%s\n" % (n, v, digest) for n, v, _, digest, _ in pins)
                requirements.flush()
                cmd = [sys.executable, "-m", "pip", "download", "-qq", "--disable-pip-version-check", "--no-deps",
                       "--only-binary=:all:", "--require-hashes", "--python-version", "%d.%d" % OLDEST, "--dest", cache,
                       "-r", requirements.name] + platform
                if subprocess.call(cmd) != 0:
                    sys.stderr.write("build_pyz: pip could not download the pinned wheels (is the package registry "
                                     "reachable? or put these files in %s: %s)\n" % (cache, ", ".join(p[2] for p in pins)))
                    raise SystemExit(EXIT_NO_WHEELS)
    paths = []
    for name, version, filename, digest, _ in PINS:
        path = os.path.join(cache, filename)
        if not os.path.isfile(path) or sha256(path) != digest:
            raise SystemExit("build_pyz: %s is missing or does not match its pinned sha256; refusing to bundle it" % path)
        paths.append(path)
    return paths


# ---- Staging the sources ----


def bundled(member, packages):
    """Whether a wheel member is part of what the archive carries."""
    top = member.split("/", 1)[0]
    return (top in packages and not member.endswith("/") and not member.endswith(SKIP_SUFFIXES)
            and not member.startswith(SKIP_PREFIXES))


def stage(wheels, src, licenses):
    """Unpack the bundled parts of each wheel and the project's modules into `src`; licences aside."""
    for (name, version, _, _, packages), path in zip(PINS, wheels):
        with zipfile.ZipFile(path) as whl:
            for member in whl.namelist():
                if bundled(member, packages):
                    whl.extract(member, src)
                elif ".dist-info/" in member and os.path.basename(member).upper().startswith(("LICENSE", "COPYING", "NOTICE")):
                    with open(os.path.join(licenses, "%s-%s.%s" % (name, version, os.path.basename(member))), "wb") as out:
                        out.write(whl.read(member))
    # every module of the project: xzatoma, _core, _tools, _skills, _plans, _store and the optional ones (_watch,
    # _metrics, _mcp: the MCP client is the standard library's alone, so MCP servers work from the one file too)
    modules = sorted(glob.glob(os.path.join(ROOT, "xzatoma*.py")))
    for module in modules:
        shutil.copy(module, src)
    return [os.path.basename(m) for m in modules]


# ---- Compiling bytecode for each interpreter ----

#: run by each target interpreter: compile every staged .py into a .pyc beside it in that
#: interpreter's tree. Unchecked hash-based pycs: zipimport then neither stats nor rehashes the source.
COMPILE = r'''
import os, py_compile, shutil, sys
src, trees = sys.argv[1], sys.argv[2]
tag = sys.implementation.cache_tag
out = os.path.join(trees, tag)
shutil.copytree(src, out)
for dirpath, _, files in os.walk(out):
    for name in sorted(files):
        if name.endswith(".py"):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, out).replace(os.sep, "/")
            py_compile.compile(path, cfile=path + "c", dfile="xzatoma.pyz/" + rel, doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
print(tag)
'''

PROBE = ("import sys, importlib.util as u; print(sys.implementation.cache_tag, sys.version_info[0], sys.version_info[1],"
         " int(not any(map(u.find_spec, ('yaml', 'keyring')))), sys.executable)")


def find_interpreters(prefer_bare=False):
    """Every interpreter here that XZatoma supports, one per version (cache tag); with `prefer_bare`,
    one without yaml and keyring where there is one (the tests want a restricted server's)."""
    candidates = [sys.executable]
    for minor in range(OLDEST[1], 30):
        name = "python3.%d" % minor
        candidates.append(shutil.which(name) or "")
        for base in (os.environ.get("PYENV_ROOT"), os.path.expanduser("~/.pyenv")):
            if base:
                candidates.extend(sorted(glob.glob(os.path.join(base, "versions", "3.%d.*" % minor, "bin", name))))
    found, bare = {}, set()
    for exe in candidates:
        tag = probe(exe)
        if tag and tag[1] >= OLDEST and (tag[0] not in found or prefer_bare and tag[3] and tag[0] not in bare):
            found[tag[0]] = tag[2]
            if tag[3]:
                bare.add(tag[0])
    return found


def probe(exe):
    """(cache tag, (major, minor), real executable (not a pyenv shim), whether it lacks all of
    XZatoma's dependencies) of an interpreter, or None when it does not run."""
    if not exe or not os.access(exe, os.X_OK):
        return None
    try:
        out = subprocess.run([exe, "-I", "-c", PROBE], capture_output=True, text=True, timeout=30).stdout.split(None, 4)
    except (OSError, subprocess.SubprocessError):
        return None
    if len(out) != 5 or out[0] == "None":
        return None
    return out[0], (int(out[1]), int(out[2])), out[4].strip() or exe, out[3] == "1"


def compile_trees(src, trees, interpreters):
    """One tree per interpreter, compiled in parallel; returns the tags built, oldest first."""
    procs = [(exe, subprocess.Popen([exe, "-I", "-W", "ignore", "-c", COMPILE, src, trees],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
             for exe in interpreters]
    tags = []
    for exe, proc in procs:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit("build_pyz: %s could not compile the sources:\n%s" % (exe, err.strip()))
        tags.append(out.strip())
    return sorted(tags, key=lambda t: int(t.rpartition("-")[2]))


# ---- Writing the archive ----

EPOCH = (2020, 1, 1, 0, 0, 0)  #: every entry's timestamp: the same inputs give the same archive
#: what every start reads, stored uncompressed: `--version` and `--help` then neither inflate ~160 KB
#: nor import zlib (about 1 ms, 3-5% of a bare interpreter's start)
EVERY_START = ("__main__.py", "xzatoma_core.pyc")


def write_archive(output, trees, tags, licenses):
    main = MAIN.format(oldest=OLDEST, oldest_text="%d.%d" % OLDEST, tags=repr(tuple(tags)))
    entries = [("__main__.py", main.encode())]
    for tag in tags:
        base, prefix = os.path.join(trees, tag), ("" if tag == tags[0] else tag + "/")
        for dirpath, dirs, files in os.walk(base):
            dirs.sort()
            for name in sorted(files):
                if prefix and name.endswith(".py"):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, "rb") as fh:
                    entries.append((prefix + os.path.relpath(path, base).replace(os.sep, "/"), fh.read()))
    for name in sorted(os.listdir(licenses)):
        with open(os.path.join(licenses, name), "rb") as fh:
            entries.append(("licenses/" + name, fh.read()))
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    tmp = output + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(b"#!/usr/bin/env python3\n")
        with zipfile.ZipFile(fh, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
            for name, data in entries:
                info = zipfile.ZipInfo(name, EPOCH)
                info.compress_type = zipfile.ZIP_STORED if name.endswith(EVERY_START) else zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                zf.writestr(info, data)
    os.chmod(tmp, 0o755)
    os.replace(tmp, output)


# ---- Command line ----


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", default=os.path.join(ROOT, "dist", "xzatoma.pyz"))
    parser.add_argument("--python", action="append", default=[], metavar="PATH",
                        help="compile bytecode with this interpreter (repeatable; default: every python3.9+ found)")
    parser.add_argument("--wheels", metavar="DIR", default=os.path.join(ROOT, "dist", "wheels"),
                        help="where the pinned wheels are kept (default: dist/wheels; missing ones are downloaded)")
    args = parser.parse_args(argv)
    if args.python:
        interpreters = {}
        for exe in args.python:
            tag = probe(shutil.which(exe) or exe)
            if not tag or tag[1] < OLDEST:
                raise SystemExit("build_pyz: %s is not a Python %d.%d+ interpreter that runs here" % ((exe,) + OLDEST))
            interpreters.setdefault(tag[0], tag[2])
    else:
        interpreters = find_interpreters()
    if not interpreters:
        raise SystemExit("build_pyz: no Python %d.%d+ interpreter found to compile with" % OLDEST)
    with tempfile.TemporaryDirectory(prefix="xzatoma-pyz-") as work:
        src, trees, licenses = (os.path.join(work, d) for d in ("src", "trees", "licenses"))
        for d in (src, trees, licenses):
            os.mkdir(d)
        wheels = fetch_wheels(args.wheels)
        modules = stage(wheels, src, licenses)
        tags = compile_trees(src, trees, list(interpreters.values()))
        write_archive(args.output, trees, tags, licenses)
    size = os.path.getsize(args.output)
    print("built %s (%.1f MB): %s; %s; bytecode for %s" % (
        args.output, size / 1e6, ", ".join(m[:-3] for m in modules),
        ", ".join("%s %s" % (p[0], p[1]) for p in PINS), ", ".join(tags)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
