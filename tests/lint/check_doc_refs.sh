#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# References in the documentation that point nowhere. Scans README.md and
# docs/*.md for:
#  - repository paths (src/, tests/, include/, docs/, systemd/, python/,
#    cmake/, .ci/) anywhere in a line, code spans and code blocks included:
#    each must exist. `*`, `?` and `[...]` are globs; a placeholder in
#    angle brackets (`tests/corpus/<format>/`) or braces stands for one
#    path component (or part of one);
#  - markdown links and images to a local file: the file must exist, and a
#    `#anchor` (`file.md#anchor`, or `#anchor` in the same file) must be
#    the GitHub anchor of one of that file's headings (lowercase, spaces to
#    '-', punctuation dropped, a repeated heading's anchor suffixed -1, -2);
#  - a section named in quotes after a doc file (`docs/mount.md, "Preload"`,
#    `mount.md "Memory"`), or before "below" or "above" (`"Round two"
#    below`, that file): a heading of that file must begin with it, or a
#    bold lead-in (`**Memory.** ...`) must be it.
# Prints one line per broken reference (FILE:LINE: what) and exits 1 when
# there is any. Usage: check_doc_refs.sh [REPO_ROOT]
set -uo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$ROOT" || exit 2
command -v python3 >/dev/null || { echo "check_doc_refs: needs python3" >&2; exit 2; }

exec python3 - README.md docs/*.md <<'PY'
import glob, os, re, sys, unicodedata

PREFIXES = ("src", "tests", "include", "docs", "systemd", "python", "cmake", ".ci")
# A path token: a prefix at a word start (not inside a URL, a longer path
# or a name), then path characters. Trailing punctuation is trimmed.
PATH_RE = re.compile(r"(?<![\w./~$@-])(?:%s)/[\w./*?\[\]<>{}@+,=-]*" %
                     "|".join(re.escape(p) for p in PREFIXES))
LINK_RE = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
# docs/mount.md, "Preload"  |  mount.md "Memory"  |  docs/mount.md ("Memory")
SECTION_RE = re.compile(r"((?:docs/)?[\w-]+\.md)\)?,?\s*\(?\"([^\"]+)\"")
# "Round two" below  |  ("DeepSpeed ZeRO-3" above): a section of the same file
HERE_RE = re.compile(r"\"([^\"]+)\"\s+(?:below|above)\b")
FENCE_RE = re.compile(r"^\s*(```|~~~)")

def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = text.replace("`", "").strip().lower()
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in "-_" or cat[0] in "LN" or cat == "Mn":
            out.append(ch)
        elif ch == " ":
            out.append("-")
    return "".join(out)

def plain(heading):
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return re.sub(r"[`*]", "", text).strip().lower()

cache = {}
def headings(path):
    """(anchors, plain heading texts, bold lead-ins) of a markdown file."""
    if path in cache:
        return cache[path]
    anchors, texts, bold, seen, fence = set(), [], set(), {}, False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE_RE.match(line):
                fence = not fence
                continue
            if fence:
                continue
            b = re.match(r"^\s*(?:[-*]\s+)?\*\*([^*]+)\*\*", line)
            if b:  # a bold lead-in names a section too: **Memory.** ...
                bold.add(plain(b.group(1)).rstrip(".:;,"))
            m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            s = slug(m.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            anchors.add(s if n == 0 else "%s-%d" % (s, n))
            texts.append(plain(m.group(2)))
    cache[path] = (anchors, texts, bold)
    return cache[path]

def has_section(path, section):
    _, texts, bold = headings(path)
    return section in bold or any(t.startswith(section) for t in texts)

def path_exists(p):
    p = p.rstrip("/") or p
    if os.path.lexists(p):
        return True
    # placeholders: <name>, {a,b}, CAPS words are not guessed; <...> and {...} as globs
    pat = re.sub(r"<[^>/]*>|\{[^}/]*\}", "*", p)
    if pat != p or any(c in pat for c in "*?["):
        return bool(glob.glob(pat))
    return False

def trim(tok):
    # sentence punctuation and unbalanced closers after a path
    while tok and tok[-1] in ".,;:)]'\"":
        if tok[-1] == "]" and tok.count("[") >= tok.count("]"):
            break
        if tok[-1] == ")" and tok.count("(") >= tok.count(")"):
            break
        tok = tok[:-1]
    return tok

problems = []
def bad(f, n, what):
    line = "%s:%d: %s" % (f, n, what)
    if line not in problems:
        problems.append(line)

for f in sys.argv[1:]:
    base = os.path.dirname(f)
    fence = False
    with open(f, encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    for n, line in enumerate(lines, 1):
        if FENCE_RE.match(line):
            fence = not fence
        # links and images (not in code)
        if not fence:
            scan = re.sub(r"`[^`]*`", "", line)
            for m in LINK_RE.finditer(scan):
                target = m.group(1)
                if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue  # http:, https:, mailto: ...
                path, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(base, path)) if path else f
                if path and not os.path.lexists(dest):
                    bad(f, n, "%s: no such path" % dest)
                    continue
                if anchor and dest.endswith(".md"):
                    if anchor.lower() not in headings(dest)[0]:
                        bad(f, n, "link to %s: no heading with anchor #%s in %s" % (target, anchor, dest))
        # repository paths, anywhere
        for m in PATH_RE.finditer(line):
            tok = trim(m.group(0))
            if tok.endswith("/...") or "..." in tok:
                continue
            if not path_exists(tok):
                bad(f, n, "%s: no such path" % tok)
        # sections named in quotes after a doc file
        for m in SECTION_RE.finditer(line):
            name, section = m.group(1), m.group(2).strip().lower()
            dest = name if name.startswith("docs/") else os.path.join("docs", name)
            if name == "README.md":
                dest = name
            if not os.path.exists(dest):
                continue  # reported above when it is a path
            if not has_section(dest, section):
                bad(f, n, '%s, "%s": no such section' % (name, m.group(2)))
        for m in HERE_RE.finditer(line):
            if not has_section(f, m.group(1).strip().lower()):
                bad(f, n, '"%s": no such section in this file' % m.group(1))

for p in problems:
    print(p)
sys.stdout.flush()
if problems:
    print("check_doc_refs: %d broken reference(s)" % len(problems), file=sys.stderr)
    sys.exit(1)
PY
