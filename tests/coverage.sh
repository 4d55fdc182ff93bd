#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Line and branch coverage of src/, per module, from the unit and mount
# tests: builds into build-coverage (-DCKFS_COVERAGE=ON: gcc --coverage,
# -O0 -g), runs `ctest -L 'unit|mount'` there, then reads every object's
# counts with gcov (part of gcc: no gcovr or lcov) and prints a table.
# A test that fails is reported, and the table is still printed from what
# ran; the exit status is ctest's.
#
#   tests/coverage.sh [BUILD_DIR]      (default build-coverage; JOBS=2)
#
# Branches are gcov's: each outcome of each condition at -O0, "taken"
# when it happened at least once. Lines and branches of a header
# compiled into several objects count once, hit when any object hit them.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(realpath -m "${1:-$ROOT/build-coverage}")
JOBS=${JOBS:-2}

command -v gcov >/dev/null || { echo "coverage: no gcov (part of gcc)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "coverage: no python3" >&2; exit 1; }
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Debug -DCKFS_COVERAGE=ON -DCKFS_WERROR=ON \
	>/dev/null || exit 1
cmake --build "$BUILD" -j"$JOBS" >/dev/null || exit 1
find "$BUILD" -name '*.gcda' -delete # counts of this run only
(cd "$BUILD" && ctest -j"$JOBS" -L 'unit|mount' --output-on-failure)
status=$?

# gcov's JSON of every object of the library and the binary, one document
# a line (gcov -t), in a scratch folder (gcov writes nothing there with -t,
# but says where it looked).
out=$(mktemp -d /tmp/ckfs-coverage.XXXXXX)
trap 'rm -rf "$out"' EXIT
find "$BUILD/CMakeFiles/ckfs_core.dir/src" "$BUILD/CMakeFiles/ckfs.dir/src" -name '*.gcno' |
	sort >"$out/objects"
(cd "$out" && xargs -a objects gcov -b -j -t 2>/dev/null) >"$out/gcov.json"
python3 - "$ROOT" "$out/gcov.json" <<'PY'
import json, os, sys
root, data = sys.argv[1], sys.argv[2]
lines, branches = {}, {}  # (file, line) -> hit; (file, line, i) -> taken
dec = json.JSONDecoder()
text = open(data).read()
pos = 0
while True:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    if pos >= len(text):
        break
    doc, pos = dec.raw_decode(text, pos)
    for f in doc["files"]:
        path = os.path.normpath(os.path.join(doc.get("current_working_directory", ""), f["file"]))
        rel = os.path.relpath(path, root)
        if not rel.startswith("src/"):
            continue
        for ln in f["lines"]:
            key = (rel, ln["line_number"])
            lines[key] = lines.get(key, False) or ln["count"] > 0
            for i, b in enumerate(ln.get("branches", [])):
                k = key + (i,)
                branches[k] = branches.get(k, False) or b["count"] > 0
mods = {}
for (rel, _), hit in lines.items():
    m = mods.setdefault(rel.split("/")[1], [0, 0, 0, 0])
    m[0] += hit; m[1] += 1
for (rel, _, _), hit in branches.items():
    m = mods.setdefault(rel.split("/")[1], [0, 0, 0, 0])
    m[2] += hit; m[3] += 1
def pct(a, b):
    return "%5.1f%%" % (100.0 * a / b) if b else "   - "
print("| module | lines | line cov. | branches | branch cov. |")
print("| --- | ---: | ---: | ---: | ---: |")
tot = [0, 0, 0, 0]
for name in sorted(mods):
    m = mods[name]
    tot = [x + y for x, y in zip(tot, m)]
    print("| src/%s/ | %d / %d | %s | %d / %d | %s |" % (name, m[0], m[1], pct(m[0], m[1]), m[2], m[3], pct(m[2], m[3])))
print("| **all** | %d / %d | %s | %d / %d | %s |" % (tot[0], tot[1], pct(tot[0], tot[1]), tot[2], tot[3], pct(tot[2], tot[3])))
PY
[ $status = 0 ] || echo "coverage: some tests failed (ctest status $status); the table counts what ran" >&2
exit $status
