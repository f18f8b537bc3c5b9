"""XZatoma skills: SKILL.md folders, their triggers, the catalog and activate_skill.

One section: Skill and SkillProblem; parse_skill, load_skill and discover_skills (every folder read through a
Jail, bounded in files and bytes); match_triggers (keywords, and /regexes/ matched in grep's worker process with
a time limit); skill_catalog (what the model is told); SkillState (which skills are active, and the tools they
leave) and the activate_skill tool.

It is part of the tools: it imports xzatoma_tools and xzatoma_store, never xzatoma. The program imports it
where a session or `xzatoma skills` needs it, never at start-up; `yaml` is imported where a front matter is
parsed. Where skills are looked for and which a session may use (trust) is the program's (xzatoma_core).
"""

import os
import re
import stat
import time

from xzatoma_store import fmt_size, json_type, one_line_path
from xzatoma_tools import (ALL_TOOLS, Jail, JailError, Tool, ToolError, ToolResult, _RegexWorker, display_path,
                           list_fd, open_if_regular, read_fd, walk_at, walk_files)


# ---- Skills: SKILL.md folders, their triggers, the catalog and activate_skill ----
# The open Agent Skills layout: a folder per skill holding SKILL.md (YAML front matter: name, description,
# optional allowed-tools; seed 004's `triggers`: keywords, or /regexes/) and the files it comes with. The model
# gets a catalog of names and descriptions; activate_skill loads a skill's instructions when the task fits (or a
# trigger matched the request first). Project skills come with a repository: the Session uses them only once a
# person has trusted them (their digest is in the store), and everything in them is bounded like other
# untrusted input: the file's size, the front matter (no YAML aliases), the triggers' length, and a regex
# trigger is matched in grep's worker process with a time limit.

SKILL_FILE = "SKILL.md"
PROJECT_SKILL_DIRS = (".xzatoma/skills", ".agents/skills")  #: in this order of precedence, before the user's
MAX_SKILL_BYTES = 256 << 10  #: one SKILL.md
MAX_FRONT_MATTER = 16 << 10
MAX_SKILLS_PER_DIR = 200
MAX_SKILL_FILES = 1000  #: files of one skill folder that its digest covers
MAX_SKILL_FOLDER_BYTES = 32 << 20
MAX_SKILL_DEPTH = 32  #: directory levels below a skill folder (with what its links lead to) that its digest covers
#: what one discovery reads of all the skill folders together: a repository cannot make every start hash gigabytes
MAX_SKILLS_FILES, MAX_SKILLS_BYTES = 5000, 64 << 20
#: entries the digests of one discovery's project skills cover in all (with dependency and cache directories)
MAX_SKILLS_ENTRIES = 20000
MAX_TRIGGERS, MAX_TRIGGER_LENGTH = 20, 200
TRIGGER_SECONDS = 2.0  #: how long one skill's regex triggers may take to match a request
SKILL_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*\Z")
SKILL_KEYS = {"name", "description", "license", "compatibility", "metadata", "allowed-tools", "triggers", "tags",
              "version"}
#: allowed-tools as other agents spell them (Claude Code's tool names), read as ours
TOOL_ALIASES = {"read": "read_file", "write": "write_file", "edit": "edit_file", "multiedit": "edit_file",
                "grep": "grep", "glob": "find_path", "ls": "list_directory", "bash": "terminal",
                "webfetch": "fetch", "task": "subagent"}
#: tools a skill's allowed-tools never takes away: they touch nothing but xzatoma's own state
BOOKKEEPING_TOOLS = ("activate_skill", "update_progress")


class SkillProblem(Exception):
    """A skill that cannot be used (level "error") or something its author should know ("warning")."""

    def __init__(self, path, reason, level="error"):
        super().__init__("%s: %s" % (path, reason))
        self.path, self.reason, self.level = path, reason, level
        self.shadowed = None  #: a skill left out for one of the same name before it (used if that one is not trusted)


class Skill:
    """One usable skill, as parsed from its SKILL.md."""

    def __init__(self, name, description, body, scope, directory, shown, triggers=(), allowed_tools=None,
                 digest=None, resources=(), warnings=(), front=None, untrustable=None):
        self.name = name
        self.description = description
        self.body = body  #: the instructions (the Markdown after the front matter)
        self.scope = scope  #: "project" (comes with the working directory: needs trust) or "user"
        self.directory = directory  #: the folder's real path
        self.shown = shown  #: SKILL.md as people see it (relative to the working directory, or ~/…)
        self.triggers = list(triggers)  #: as written: keywords, and /regexes/
        self.allowed_tools = allowed_tools  #: frozenset of tool names, or None (no narrowing)
        self.digest = digest  #: sha256 of the folder (every entry, what its links lead to): what trust is given to
        #: why a project skill has no digest, so cannot be trusted (a link out of the project, a folder over the
        #: bounds…), in one line; None when it can be
        self.untrustable = untrustable
        self.resources = list(resources)  #: the folder's other files, relative to it
        self.warnings = list(warnings)
        self.front = front or {}  #: the whole front matter

    def keywords(self):
        return [t for t in self.triggers if not _is_regex_trigger(t)]

    def patterns(self):
        return [t[1:-1] for t in self.triggers if _is_regex_trigger(t)]

    def instructions(self, why=None):
        """What the model gets when the skill is activated: where it is from, its files, the tools it leaves,
        and its body."""
        head = ['Skill "%s" is now active%s (from %s). Follow its instructions for this task.'
                % (self.name, " " + why if why else "", self.shown)]
        if self.resources:
            shown = self.resources[:50]
            head.append('Its files (read one with activate_skill name="%s" file="<file>"%s): %s%s' % (
                self.name, "; project skills also with read_file at %s" % os.path.dirname(self.shown)
                if self.scope == "project" else "", ", ".join(shown),
                " … (%d more)" % (len(self.resources) - 50) if len(self.resources) > 50 else ""))
        if self.allowed_tools is not None:
            head.append("While it is active you can use only these tools (its allowed-tools): %s." % (
                ", ".join(sorted(set(self.allowed_tools) | set(BOOKKEEPING_TOOLS)))))
        return "\n".join(head) + "\n\n" + (self.body or "(the skill has no instructions beyond its description)")


def _is_regex_trigger(trigger):
    return len(trigger) > 2 and trigger.startswith("/") and trigger.endswith("/")


_FRONT_MATTER_LOADER = None


def _front_matter_loader():
    """yaml's SafeLoader without aliases (`*name`): a front matter needs none, and nested aliases expand a few
    hundred bytes into gigabytes (the billion laughs). Made on first use: yaml is imported only then."""
    global _FRONT_MATTER_LOADER
    if _FRONT_MATTER_LOADER is None:
        import yaml

        class Loader(yaml.SafeLoader):
            def compose_node(self, parent, index):
                if self.check_event(yaml.AliasEvent):
                    raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed in a skill's "
                                                      "front matter", self.peek_event().start_mark)
                return super().compose_node(parent, index)
        _FRONT_MATTER_LOADER = Loader
    return _FRONT_MATTER_LOADER


def _known_tool_names():
    return {cls.name for cls in ALL_TOOLS} | {"subagent", "parallel_subagent"} | set(BOOKKEEPING_TOOLS)


def parse_skill(data, folder, shown):
    """(fields, warnings) from a SKILL.md's bytes, or SkillProblem naming `shown` and what is wrong. `folder`
    is the name of the folder it is in (the skill's name must be the same)."""
    import yaml
    if len(data) > MAX_SKILL_BYTES:
        raise SkillProblem(shown, "the file is %s, over the %s a SKILL.md may have" % (
            fmt_size(len(data)), fmt_size(MAX_SKILL_BYTES)))
    if b"\0" in data:
        raise SkillProblem(shown, "a binary file, not Markdown")
    text = data.decode("utf-8", "replace").lstrip("\ufeff").replace("\r\n", "\n")
    lines = text.split("\n")
    if lines[0].strip() != "---":
        raise SkillProblem(shown, "no YAML front matter: the file must start with a '---' line, then name and "
                                  "description, then '---'")
    end, size = None, 0
    for i, line in enumerate(lines[1:], 1):
        size += len(line) + 1
        if size > MAX_FRONT_MATTER:
            break
        if line.strip() in ("---", "..."):
            end = i
            break
    if end is None:
        raise SkillProblem(shown, "the front matter has no closing '---' line%s" % (
            " in its first %s" % fmt_size(MAX_FRONT_MATTER) if size > MAX_FRONT_MATTER else ""))
    try:
        front = yaml.load("\n".join(lines[1:end]), Loader=_front_matter_loader())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise SkillProblem(shown if mark is None else "%s:%d" % (shown, mark.line + 2), "invalid YAML in the front "
                           "matter: %s" % (getattr(exc, "problem", None) or str(exc).splitlines()[0]))
    except RecursionError:
        raise SkillProblem(shown, "the front matter is nested too deeply")
    if not isinstance(front, dict):
        raise SkillProblem(shown, "the front matter must be a mapping with name and description, got %s"
                           % json_type(front))
    warnings = []

    def where(key):
        for n, line in enumerate(lines[1:end], 2):
            if line.startswith(key + ":"):
                return "%s:%d" % (shown, n)
        return shown

    name = front.get("name")
    if not isinstance(name, str) or not name.strip():
        raise SkillProblem(where("name"), "missing 'name' (lowercase letters, digits and hyphens, as its folder)")
    name = name.strip()
    if len(name) > 64 or not SKILL_NAME.match(name):
        raise SkillProblem(where("name"), "name %r must be 1-64 lowercase letters, digits and single hyphens "
                                          "(not at either end)" % name[:80])
    if name != folder:
        raise SkillProblem(where("name"), "name %r differs from its folder's name %r (they must be the same)"
                           % (name, folder[:80]))
    description = front.get("description")
    if not isinstance(description, str) or not description.strip():
        raise SkillProblem(where("description"), "missing 'description': what the skill does and when to use it")
    description = " ".join(description.split())
    if len(description) > 1024:
        raise SkillProblem(where("description"), "the description is %d characters, over 1024" % len(description))
    triggers = front.get("triggers")
    if triggers is None:
        triggers = []
    elif isinstance(triggers, str):
        triggers = [triggers]
    if not isinstance(triggers, list) or not all(isinstance(t, str) and t.strip() for t in triggers):
        raise SkillProblem(where("triggers"), "'triggers' must be a list of keywords or /regexes/")
    if len(triggers) > MAX_TRIGGERS:
        raise SkillProblem(where("triggers"), "%d triggers, over the %d a skill may have" % (len(triggers),
                                                                                          MAX_TRIGGERS))
    triggers = [t.strip() for t in triggers]
    for n, trigger in enumerate(triggers, 1):
        if len(trigger) > MAX_TRIGGER_LENGTH:
            raise SkillProblem(where("triggers"), "trigger %d is %d characters, over %d" % (
                n, len(trigger), MAX_TRIGGER_LENGTH))
        if _is_regex_trigger(trigger):
            try:  # compiling a short pattern is quick; matching it is what may not be (see match_triggers)
                re.compile(trigger[1:-1])
            except (re.error, OverflowError, RecursionError, ValueError) as exc:
                raise SkillProblem(where("triggers"), "trigger %d %s is not a valid regular expression: %s"
                                   % (n, trigger, exc))
    allowed = _allowed_tools(front.get("allowed-tools"), where("allowed-tools"), warnings)
    for key in sorted(set(front) - SKILL_KEYS, key=str):
        warnings.append("unknown front matter key %r (ignored)" % str(key)[:60])
    body = "\n".join(lines[end + 1:]).strip()
    if not body:
        warnings.append("the body is empty: the model gets only the description")
    return {"name": name, "description": description, "body": body, "triggers": triggers,
            "allowed_tools": allowed, "front": front}, warnings


def _allowed_tools(value, shown, warnings):
    """allowed-tools: a space- or comma-separated text, or a list; None when absent. Names other agents use are
    read as ours (Read -> read_file); an entry that limits a tool's arguments (Bash(git:*)) cannot be enforced
    here, so that tool is not allowed at all (fail closed), and the warning says so."""
    if value is None:
        return None
    if isinstance(value, str):
        entries = [e for e in re.split(r"[\s,]+(?![^()]*\))", value) if e]
    elif isinstance(value, list) and all(isinstance(e, str) for e in value):
        entries = [e.strip() for e in value if e.strip()]
    else:
        raise SkillProblem(shown, "'allowed-tools' must be a list of tool names (or one text of names)")
    known, out = _known_tool_names(), set()
    for entry in entries[:100]:
        if "(" in entry:
            warnings.append("allowed-tools: %r limits the tool's arguments, which xzatoma cannot enforce, so the "
                            "tool is not allowed" % entry[:80])
            continue
        name = entry if entry in known else TOOL_ALIASES.get(entry.lower(), entry)
        if name not in known:
            warnings.append("allowed-tools: %r is not a tool of xzatoma (left out)" % entry[:80])
            continue
        out.add(name)
    return frozenset(out)


class _Budget:
    """Files and bytes left to read, shared by the folders of one discovery."""

    def __init__(self):
        self.files, self.size, self.entries = MAX_SKILLS_FILES, MAX_SKILLS_BYTES, MAX_SKILLS_ENTRIES

    def spend(self, files=0, size=0, entries=0):
        self.files -= files
        self.size -= size
        self.entries -= entries
        if self.files < 0 or self.size < 0:
            raise SkillProblem("", "the skill folders here hold more than %d files or %s in all; this one was not "
                                   "read" % (MAX_SKILLS_FILES, fmt_size(MAX_SKILLS_BYTES)))
        if self.entries < 0:
            raise SkillProblem("", "the project's skill folders hold more than %d entries in all; this one was not "
                                   "read" % MAX_SKILLS_ENTRIES)


def _skill_folder(jail, folder_rel, budget):
    """The resources of a skill folder (its files, as the model is told of them), walked through the jail
    (links are not followed out of it; VCS, cache and dependency directories are not listed) and bounded in
    files, its own and the discovery's `budget`. What trust is given to is _skill_digest's, not this list."""
    resources, count = [], 0
    with jail.resolve(folder_rel, must_exist=True) as start:
        prefix = display_path(start.real, jail.root)
        prefix = "" if prefix == "." else prefix + "/"
        for rel, dir_fd, name, kind in walk_files(jail, start, gitignore=False, include_dirs=True):
            count += 1
            budget.spend(files=1)
            if count > MAX_SKILL_FILES:
                raise SkillProblem(folder_rel, "the folder holds more than %d files" % MAX_SKILL_FILES)
            inner = rel[len(prefix):] if rel.startswith(prefix) else rel
            if inner != SKILL_FILE and kind != "dir":
                resources.append(inner)
    return sorted(resources)


class _Untrustable(Exception):
    """Why a project skill's folder has no digest, so it cannot be trusted (one line)."""


def _skill_digest(jail, folder_rel, skill_bytes, shown_dir, budget):
    """(digest, None) of a project skill's folder, or (None, why it cannot be trusted, in one line).

    The digest covers every entry below the folder, nothing skipped (node_modules/, __pycache__/, .venv/, .git/
    hold code a skill runs as much as a script beside SKILL.md does): its path, type, mode (the executable bit
    too) and content. A symbolic link counts as its target text and as what it resolves to inside the project:
    a file's content, or a directory's entries, walked the same way (a directory the walk already covers is
    named, not walked again: no loop). No digest, so no trust, for a link that leads outside the project (or
    into XZATOMA_HOME): what is there can change while nothing in the project does; nor for a link that cannot
    be resolved, an entry that cannot be read, or a folder over MAX_SKILL_FILES entries, MAX_SKILL_FOLDER_BYTES
    or MAX_SKILL_DEPTH levels (what its links lead to counted in). `budget`: the discovery's bytes and entries."""
    import hashlib
    digest = hashlib.sha256(b"xzatoma-skill-2\0")

    def put(*parts):
        for part in parts:
            data = part if isinstance(part, bytes) else str(part).encode("utf-8", "surrogateescape")
            digest.update(b"%d:" % len(data) + data)

    put(skill_bytes)
    walk = _DigestWalk(jail, put, shown_dir, budget)
    try:
        with jail.resolve(folder_rel, must_exist=True) as start:
            walk.directory(start, "", [start.real])
    except _Untrustable as exc:
        return None, str(exc)
    return digest.hexdigest(), None


class _DigestWalk:
    """One skill folder's digest walk (_skill_digest): the entries, bytes and depth it has taken so far."""

    def __init__(self, jail, put, shown_dir, budget):
        self.jail, self.put, self.shown_dir, self.budget = jail, put, shown_dir, budget
        self.entries = self.size = 0

    def shown(self, path):
        return os.path.join(self.shown_dir, path) if path else self.shown_dir

    def directory(self, target, label, covered):
        """Hash the entries below the directory `target` (label: its path in the skill folder, "" or ending in
        "/"; covered: the real paths of the directories whose every entry this walk hashes)."""
        real = target.real
        jail = self.jail

        def listing(fd, prefix):
            if (label + prefix).count("/") + 1 > MAX_SKILL_DEPTH:
                raise _Untrustable("%s is more than %d directories deep" % (
                    self.shown(label + prefix).rstrip("/"), MAX_SKILL_DEPTH))
            names = sorted(os.listdir(fd))
            if jail.hidden:
                for name in names:
                    if jail.hides(os.path.join(real, prefix + name)):
                        raise _Untrustable("%s holds XZATOMA_HOME (xzatoma's credentials and history)"
                                           % self.shown(label + prefix + name))
            return names

        walk = walk_at(target.dir_fd, target.name, listing=listing)
        try:
            for rel, dir_fd, name, st, _ in walk:
                if rel:
                    self.entry(label + rel, os.path.join(real, rel), dir_fd, name, st, covered)
        except OSError as exc:
            raise _Untrustable("%s cannot be read: %s" % (self.shown(label).rstrip("/"), exc.strerror or exc))
        finally:
            walk.close()

    def entry(self, path, real, dir_fd, name, st, covered):
        self.entries += 1
        self.budget.spend(entries=1)
        if self.entries > MAX_SKILL_FILES:
            raise _Untrustable("its folder holds more than %d entries (counting what its links lead to)"
                               % MAX_SKILL_FILES)
        mode = st.st_mode
        self.put(b"entry", path, "%o" % mode)
        if stat.S_ISREG(mode):
            fd = open_if_regular(name, dir_fd)
            if fd is None:
                raise _Untrustable("%s cannot be read" % self.shown(path))
            try:
                self.content(fd)
            finally:
                os.close(fd)
        elif stat.S_ISLNK(mode):
            text = os.readlink(name, dir_fd=dir_fd)
            self.put(text)
            self.link(path, real, text, covered)
        elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            self.put("%x" % st.st_rdev)  # never opened: the device it names is what it is

    def content(self, fd):
        import hashlib
        left = MAX_SKILL_FOLDER_BYTES - self.size
        data = read_fd(fd, max(0, min(left, self.budget.size)) + 1)
        self.size += len(data)
        self.budget.spend(size=len(data))
        if self.size > MAX_SKILL_FOLDER_BYTES:
            raise _Untrustable("its folder holds more than %s (counting what its links lead to)"
                               % fmt_size(MAX_SKILL_FOLDER_BYTES))
        self.put(hashlib.sha256(data).digest())

    def link(self, path, real, text, covered):
        """What the link at `path` resolves to, through the jail: it must stay inside the project."""
        jail = self.jail
        rel = display_path(real, jail.root)
        try:
            with jail.resolve(rel, follow=True) as target:
                st = target.lstat()
                if st is None:
                    self.put(b"nothing")  # a dangling link: what appears there later changes the digest
                    return
                self.put(b"to", display_path(target.real, jail.root), "%o" % st.st_mode)
                if stat.S_ISREG(st.st_mode):
                    fd = target.open_regular("not hashed")
                    try:
                        self.content(fd)
                    finally:
                        os.close(fd)
                elif stat.S_ISDIR(st.st_mode):
                    if any(_inside(target.real, c) for c in covered):
                        return  # every entry of it is hashed where the walk meets it
                    self.directory(target, path + "/", covered + [target.real])
        except JailError:
            raise _Untrustable("%s links outside the project (to %s): what is there can change while the project "
                               "does not" % (self.shown(path), one_line_path(text)[:200]))
        except ToolError as exc:  # a loop of links, XZATOMA_HOME
            said = one_line_path(str(exc))[:300]
            raise _Untrustable(said if said.startswith(self.shown(path)) else "%s: %s" % (self.shown(path), said))
        except OSError as exc:
            raise _Untrustable("%s cannot be read: %s" % (self.shown(path), exc.strerror or exc))


def _inside(real, root):
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def load_skill(jail, folder_rel, scope, shown_dir, want_digest=True, budget=None):
    """The Skill in `folder_rel` (relative to the jail), or SkillProblem. Read through the jail: a folder or
    SKILL.md that leads outside it is refused, and a FIFO or device is never opened."""
    folder = os.path.basename(folder_rel.rstrip("/"))
    shown = os.path.join(shown_dir, SKILL_FILE)
    try:
        with jail.resolve(os.path.join(folder_rel, SKILL_FILE), must_exist=True) as target:
            fd = target.open_regular("not read as a skill")
            try:
                data = read_fd(fd, MAX_SKILL_BYTES + 1)
            finally:
                os.close(fd)
        with jail.resolve(folder_rel, must_exist=True) as target:
            directory = target.real
    except JailError:
        raise SkillProblem(shown, "it leads outside %s" % jail.root)
    except ToolError as exc:
        message = str(exc)
        if "no such file" in message.lower() or "does not exist" in message.lower():
            raise SkillProblem(shown, "no %s in the folder (a skill is a folder holding %s)" % (SKILL_FILE, SKILL_FILE))
        raise SkillProblem(shown, message)
    except OSError as exc:
        raise SkillProblem(shown, exc.strerror or str(exc))
    budget = budget or _Budget()
    try:
        budget.spend(size=len(data))
    except SkillProblem as exc:
        raise SkillProblem(shown, exc.reason)
    fields, warnings = parse_skill(data, folder, shown)
    digest = untrustable = None
    try:
        resources = _skill_folder(jail, folder_rel, budget)
        if want_digest and scope == "project":
            digest, untrustable = _skill_digest(jail, folder_rel, data, shown_dir, budget)
    except SkillProblem as exc:
        raise SkillProblem(shown, exc.reason)
    except (ToolError, OSError) as exc:
        raise SkillProblem(shown, "its folder cannot be read: %s" % (getattr(exc, "strerror", None) or exc))
    return Skill(fields["name"], fields["description"], fields["body"], scope, directory, shown,
                 fields["triggers"], fields["allowed_tools"], digest, resources, warnings, fields["front"],
                 untrustable)


def discover_skills(places, hidden=()):
    """(skills, problems) of the skill directories in `places`: [(scope, base, rel, shown)], the first place
    winning where two hold a skill of the same name (the other is reported, as a warning). `base` is the jail
    (the working directory, or the user's skills directory), `rel` the skills directory in it, `shown` how
    people see that directory. Problems are SkillProblem: every folder that is not a usable skill is named,
    never silently skipped."""
    skills, problems, seen, budget = [], [], {}, _Budget()
    for scope, base, rel, shown_base in places:
        if not os.path.isdir(base):
            continue
        jail = Jail(base, hidden)
        try:
            with jail.resolve(rel) as target:
                st = target.lstat()
                if st is None:
                    continue
                if not stat.S_ISDIR(st.st_mode):
                    problems.append(SkillProblem(shown_base, "not a directory"))
                    continue
                fd = target.open_dir()
                try:
                    entries = list_fd(fd)
                finally:
                    os.close(fd)
        except JailError:
            problems.append(SkillProblem(shown_base, "it leads outside %s" % jail.root))
            continue
        except (ToolError, OSError) as exc:
            problems.append(SkillProblem(shown_base, getattr(exc, "strerror", None) or str(exc)))
            continue
        folders = [(name, kind) for name, kind in entries if kind in ("dir", "link") and not name.startswith(".")]
        for name, kind in entries:
            if kind == "file" and name.lower().endswith(".md") and name.lower() != "readme.md":
                problems.append(SkillProblem(os.path.join(shown_base, name), "a skill is a folder holding %s: "
                                             "move it to %s/%s" % (SKILL_FILE, name[:-3], SKILL_FILE)))
        if len(folders) > MAX_SKILLS_PER_DIR:
            problems.append(SkillProblem(shown_base, "%d skill folders; only the first %d are read" % (
                len(folders), MAX_SKILLS_PER_DIR), "warning"))
        for name, kind in folders[:MAX_SKILLS_PER_DIR]:
            shown_dir = os.path.join(shown_base, name)
            if kind == "link":
                why = _not_a_folder(jail, os.path.join(rel, name))
                if why:
                    problems.append(SkillProblem(shown_dir, why))
                    continue
            try:
                skill = load_skill(jail, os.path.join(rel, name), scope, shown_dir, budget=budget)
            except SkillProblem as exc:
                problems.append(exc)
                continue
            if skill.name in seen:
                problem = SkillProblem(skill.shown, "skill %r is already defined by %s, which is used"
                                       % (skill.name, seen[skill.name].shown), "warning")
                problem.shadowed = skill
                problems.append(problem)
                continue
            seen[skill.name] = skill
            skills.append(skill)
    return skills, problems


def _not_a_folder(jail, rel):
    """Why a link in a skills directory is not a skill folder, or None when it leads to one inside the jail."""
    try:
        with jail.resolve(rel) as target:
            st = target.lstat()
    except JailError:
        return "it leads outside %s" % jail.root
    except (ToolError, OSError) as exc:
        return getattr(exc, "strerror", None) or str(exc)
    if st is None:
        return "a link to nothing"
    return None if stat.S_ISDIR(st.st_mode) else "a link to a file, not a folder holding %s" % SKILL_FILE


def match_triggers(skills, text, seconds=TRIGGER_SECONDS, given_up=None):
    """([(skill, trigger)], [problem text]): the skills a request triggers. A keyword matches as a whole word,
    case-insensitively (a literal: linear); a skill's /regexes/ are tried together in grep's worker process,
    case-insensitively, and when they take longer than `seconds` they are given up on and reported. `given_up`:
    a set of skill names whose regexes are not tried (those given up on are added: a session pays once)."""
    matched, problems = [], []
    text = text or ""
    # INFO: `seconds` is for all the skills of one request together: given per skill, 15 skills with a trigger
    # that backtracks stalled a run for 30 s before its first model call (attack round 18d)
    deadline, skipped = time.monotonic() + seconds, []
    for skill in skills:
        hit = None
        for keyword in skill.keywords():
            if re.search(r"(?<!\w)%s(?!\w)" % re.escape(keyword), text, re.IGNORECASE):
                hit = keyword
                break
        patterns = skill.patterns()
        if hit is None and patterns and text and skill.name not in (given_up or ()):
            left = deadline - time.monotonic()
            if left <= 0:
                skipped.append(skill.name)
                continue
            try:
                if _bounded_search("|".join("(?:%s)" % p for p in patterns), text, re.IGNORECASE | re.MULTILINE,
                                   left):
                    hit = "/%s/" % patterns[0] if len(patterns) == 1 else "one of its regular expressions"
            except ToolError as exc:
                if given_up is not None:
                    given_up.add(skill.name)
                problems.append("skill %s: %s; its regular expressions are given up on%s" % (
                    skill.name, "a trigger took longer than %g s to match (it may backtrack catastrophically)"
                    % seconds if "longer than" in str(exc) else str(exc).split(";")[0],
                    "" if given_up is None else " for the rest of this session"))
        if hit is not None:
            matched.append((skill, hit))
    if skipped:
        problems.append("the regular expressions of skill%s %s were not tried for this request: the triggers took "
                        "%g s in all" % ("s" if len(skipped) > 1 else "", ", ".join(skipped[:10]) +
                                         (", …" if len(skipped) > 10 else ""), seconds))
    return matched, problems


def _bounded_search(pattern, text, flags, seconds):
    """Whether an untrusted `pattern` matches `text`, decided in grep's worker process within `seconds`
    (ToolError when it takes longer: catastrophic backtracking cannot stall the agent)."""
    worker = _RegexWorker(pattern, flags, None, seconds)
    try:
        answers = worker.feed([("request", text.encode("utf-8", "replace"))], 1) + worker.finish()
        return any(count for _, (count, _) in answers)
    finally:
        worker.close()


def skill_catalog(skills, max_tokens):
    """The catalog the model gets (names and descriptions), within about `max_tokens` (4 characters a token).
    When all of it does not fit, the first skills (by name) keep their descriptions while the names of the rest
    still fit after them; then names alone; then how many more there are. "" without skills."""
    skills = sorted(skills, key=lambda s: s.name)
    if not skills:
        return ""
    budget = max(int(max_tokens) * 4, 200)
    head = ("Skills (instructions for particular tasks, loaded on demand): when the task fits one's description, "
            "call activate_skill with its name before you start, then follow it.")
    entries = ["- %s: %s" % (s.name, s.description) for s in skills]
    if len(head) + sum(len(e) + 1 for e in entries) <= budget:
        return "\n".join([head] + entries)
    also = "- also (no room for their descriptions): "
    more = "- and %d more not listed (the catalog is capped at agent.skills.catalog_share of the context window)"
    lines, used, i = [head], len(head), 0
    names_left = len(also) + sum(len(s.name) + 2 for s in skills)
    while i < len(skills) and used + len(entries[i]) + 1 + names_left - len(skills[i].name) - 2 <= budget:
        lines.append(entries[i])
        used += len(entries[i]) + 1
        names_left -= len(skills[i].name) + 2
        i += 1
    room, shown = budget - used - len(also) - len(more) - 2, []
    for skill in skills[i:]:
        if len(skill.name) + 2 > room:
            break
        shown.append(skill.name)
        room -= len(skill.name) + 2
    if shown:
        lines.append(also + ", ".join(shown))
    if len(skills) - i - len(shown):
        lines.append(more % (len(skills) - i - len(shown)))
    return "\n".join(lines)


class SkillState:
    """A session's skills, and which are active in the current task (a run, or one chat turn). While skills with
    allowed-tools are active, the registry offers only the tools all of them allow (and the bookkeeping tools):
    activating another skill can narrow the tools further, never widen them."""

    def __init__(self, skills=()):
        import threading
        self.lock = threading.Lock()
        self.skills = {s.name: s for s in skills}  #: name -> Skill: the usable ones
        self.active = []  #: names, in the order they were activated
        self.slow = set()  #: skills whose regex triggers took too long once: not tried again (match_triggers)

    def __bool__(self):
        return bool(self.skills)

    def activate(self, name):
        """(skill, newly): the skill is active from now on (None when there is no such skill)."""
        with self.lock:
            skill = self.skills.get(name)
            if skill is None or name in self.active:
                return skill, False
            self.active.append(name)
            return skill, True

    def reset(self):
        with self.lock:
            self.active = []

    def allowed(self):
        """The tool names active skills leave, or None (no active skill narrows the tools)."""
        with self.lock:
            sets = [self.skills[n].allowed_tools for n in self.active if self.skills[n].allowed_tools is not None]
        if not sets:
            return None
        return frozenset.intersection(*sets) | frozenset(BOOKKEEPING_TOOLS)

    def why(self, name):
        """Why a tool is refused while skills narrow the tools."""
        with self.lock:
            narrowing = [n for n in self.active if self.skills[n].allowed_tools is not None]
        return "tool %s is not allowed while skill%s %s %s active (allowed now: %s)" % (
            name, "s" if len(narrowing) > 1 else "", ", ".join(narrowing), "are" if len(narrowing) > 1 else "is",
            ", ".join(sorted(self.allowed() or ())))


class ActivateSkill(Tool):
    """Loads a skill's instructions (and reads its files) for the model; the Session builds it over its
    SkillState."""

    name = "activate_skill"
    description = ("Load a skill from the Skills list of the environment message: returns its instructions "
                   "(follow them) and the files it comes with; with file, returns one of those files.")
    parameters = {"type": "object", "properties": {
        "name": {"type": "string", "description": "the skill's name"},
        "file": {"type": "string", "description": "a file of the skill, relative to its folder"}},
        "required": ["name"]}

    def __init__(self, state):
        self.state = state

    def preview_args(self, args):
        name = one_line_path(str(args.get("name", "")))[:60]
        return name + (" " + one_line_path(str(args["file"]))[:60] if args.get("file") else "")

    def run(self, args, ctx):
        state, name = self.state, args["name"].strip()
        skill = state.skills.get(name)
        if skill is None:
            if not state.skills:
                raise ToolError("there are no skills here (no usable SKILL.md in .agents/skills, .xzatoma/skills or "
                                "the user's skills directory)")
            raise ToolError("there is no skill %r; the skills are: %s" % (name[:80], ", ".join(sorted(state.skills))))
        if args.get("file"):
            return self._file(skill, args["file"], ctx)
        skill, newly = state.activate(name)
        text = skill.instructions()
        return ToolResult.ok(text if newly else "(already active)\n" + text, bookkeeping=True, skill=name)

    def _file(self, skill, path, ctx):
        """A file of the skill's folder, read through a jail rooted there (nothing outside it, never a FIFO)."""
        jail = Jail(skill.directory, hidden=[ctx.xzatoma_home] if ctx.xzatoma_home else ())
        try:
            with jail.resolve(path, must_exist=True) as target:
                st = target.lstat()
                if stat.S_ISDIR(st.st_mode):
                    raise ToolError("%s is a directory of skill %s; its files: %s" % (
                        path, skill.name, ", ".join(skill.resources[:50]) or "none"))
                fd = target.open_regular("not read as a skill's file")
                try:
                    data = read_fd(fd, ctx.limit("max_file_read_size", 10485760) + 1)
                finally:
                    os.close(fd)
        except JailError:
            raise ToolError("%s is not a file of skill %s (it leads outside its folder)" % (path, skill.name))
        if b"\0" in data[:8192]:
            raise ToolError("%s of skill %s is a binary file" % (path, skill.name))
        return ToolResult.ok(data.decode("utf-8", "replace"), bookkeeping=True, skill=skill.name)
