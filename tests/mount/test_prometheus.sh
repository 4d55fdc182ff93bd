#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# ckfs stats --prometheus: node_exporter's textfile format, checked line by
# line (HELP, then TYPE, then the sample of each metric; names and types
# valid and unique; counters end in _total), every value equal to what
# --json reports, the mount point label escaped as the format requires
# (a mount point holding a space, a double quote and a backslash), the
# bytes read and the read errors of a source changed under the mount
# counted, the HELP and TYPE lines the same on two mounts (the textfile
# collector merges one metric from several files only then), and the
# one-line refusals: --json with --prometheus (2), a folder that is not a
# mount (1).
source "$(dirname "$0")/lib.sh"
require_fuse

FIX=$FIXTURES/qwen2_fsdp2_w2

# Check one --prometheus output against --json; print "name value" lines.
check_format() { # PROM_FILE JSON_FILE MOUNTPOINT
	"$PY" - "$@" <<'PY'
import json, re, sys
prom, stats, mnt = open(sys.argv[1]).read(), json.load(open(sys.argv[2])), sys.argv[3]
FIELDS = {  # metric -> stats field (--json)
    "ckfs_cache_hits_total": "hits", "ckfs_cache_misses_total": "misses",
    "ckfs_cache_waits_total": "waits", "ckfs_cache_fills_total": "fills",
    "ckfs_cache_fill_errors_total": "fill_errors", "ckfs_cache_filled_bytes_total": "bytes_filled",
    "ckfs_cache_recycled_total": "recycled", "ckfs_cache_evictions_total": "evictions",
    "ckfs_cache_bytes": "bytes_cached", "ckfs_cache_slices": "slices_cached",
    "ckfs_cache_budget_bytes": "budget", "ckfs_cache_slice_bytes": "slice_size",
    "ckfs_prefetch_queued_total": "prefetch_queued", "ckfs_prefetch_dropped_total": "prefetch_dropped",
    "ckfs_prefetch_hits_total": "prefetch_hits",
    "ckfs_readahead_sequential_reads_total": "readahead_sequential",
    "ckfs_readahead_slices_total": "readahead_slices",
    "ckfs_readahead_skipped_total": "readahead_skipped",
    "ckfs_readahead_stored_bytes_total": "readahead_stored", "ckfs_reads_total": "reads",
    "ckfs_readahead_rows_total": "readahead_rows",
    "ckfs_read_bytes_total": "bytes_read", "ckfs_read_errors_total": "errors",
    "ckfs_opens_total": "opens", "ckfs_source_read_bytes_total": "source_bytes_read",
    "ckfs_cache_shared_slices_total": "shared_slices", "ckfs_cache_shared_bytes_total": "shared_bytes",
    "ckfs_cache_saved_bytes": "bytes_saved", "ckfs_cache_hashed_bytes_total": "bytes_hashed",
    "ckfs_store_requests_total": "store_requests", "ckfs_store_retries_total": "store_retries",
    "ckfs_store_received_bytes_total": "store_bytes",
    "ckfs_preload_target_bytes": "preload_bytes", "ckfs_preload_stored_bytes_total": "preload_stored",
    "ckfs_preload_skipped_bytes_total": "preload_skipped",
    "ckfs_preload_errors_total": "preload_errors", "ckfs_preload_done": "preload_done",
    "ckfs_cache_memory_bytes": "slice_memory", "ckfs_resident_bytes": "rss",
    "ckfs_resident_anon_bytes": "rss_anon",
    "ckfs_files": "files", "ckfs_uptime_seconds": "uptime_s",
}
MOVING = {"ckfs_uptime_seconds", "ckfs_resident_bytes", "ckfs_resident_anon_bytes"}  # between the two calls
NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\\\|\\"|\\n)*"'
SAMPLE = re.compile(rf"^({NAME})\{{({LABEL}(?:,{LABEL})*)\}} (-?[0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?)$")
def unescape(v): return re.sub(r'\\(.)', lambda m: "\n" if m.group(1) == "n" else m.group(1), v)
errors, seen, values, state = [], set(), {}, None
for n, line in enumerate(prom.splitlines(), 1):
    if m := re.match(rf"^# HELP ({NAME}) (\S.*)$", line):
        if m.group(1) in seen: errors.append(f"line {n}: {m.group(1)} described twice")
        seen.add(m.group(1)); state = (m.group(1), "help")
    elif m := re.match(rf"^# TYPE ({NAME}) (counter|gauge)$", line):
        if state != (m.group(1), "help"): errors.append(f"line {n}: TYPE not right after its HELP")
        if m.group(2) == "counter" and not m.group(1).endswith("_total"):
            errors.append(f"line {n}: counter {m.group(1)} does not end in _total")
        state = (m.group(1), "type")
    elif m := SAMPLE.match(line):
        if state != (m.group(1), "type"): errors.append(f"line {n}: sample without its HELP and TYPE")
        labels = dict((k, unescape(v)) for k, v in re.findall(r'([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"', m.group(2)))
        if labels.get("mountpoint") != mnt: errors.append(f"line {n}: mountpoint label {labels.get('mountpoint')!r}")
        values[m.group(1)] = (labels, float(m.group(3)))
    else:
        errors.append(f"line {n}: not in the text format: {line!r}")
info = values.pop("ckfs_mount_info", None)
if not info or info[1] != 1 or info[0].get("source") != stats["source"] or info[0].get("pid") != str(stats["pid"]):
    errors.append(f"ckfs_mount_info wrong: {info}")
if set(values) != set(FIELDS): errors.append(f"metrics {sorted(set(values) ^ set(FIELDS))} missing or unknown")
for name, field in FIELDS.items():
    if name in values and name not in MOVING and values[name][1] != stats[field]:
        errors.append(f"{name} is {values[name][1]}, --json says {field} {stats[field]}")
if not 0 < stats["rss_anon"] <= stats["rss"]:
    errors.append(f"resident memory {stats['rss']}, anonymous {stats['rss_anon']}: not read")
for e in errors: print("ERROR", e)
for name, (_, v) in values.items(): print(name, int(v) if v == int(v) else v)
sys.exit(1 if errors else 0)
PY
}

# A mount point with a space, a double quote and a backslash in its name.
MNT=$WORK/'mnt "a\b c'
mkdir -p "$MNT" "$WORK/plain"
do_mount "$FIX" "$MNT" || die "mount failed"
cat "$MNT/model.safetensors" >/dev/null || fail "reading model.safetensors"
size=$(stat -c %s "$MNT/model.safetensors")
"$CKFS" stats --prometheus "$MNT" >"$WORK/a.prom" || fail "stats --prometheus failed"
"$CKFS" stats --json "$MNT" >"$WORK/a.json" || fail "stats --json failed"
if check_format "$WORK/a.prom" "$WORK/a.json" "$MNT" >"$WORK/a.values"; then
	log "format, values and the escaped mount point label: ok ($(grep -c '^# TYPE' "$WORK/a.prom") metrics)"
else
	grep ERROR "$WORK/a.values" >&2
	fail "the --prometheus output (above)"
fi
value() { awk -v n="$1" '$1 == n { print $2 }' "$2"; }
[ "$(value ckfs_read_bytes_total "$WORK/a.values")" -ge "$size" ] 2>/dev/null ||
	fail "ckfs_read_bytes_total $(value ckfs_read_bytes_total "$WORK/a.values") < $size bytes read"
[ "$(value ckfs_cache_fills_total "$WORK/a.values")" -ge 1 ] 2>/dev/null || fail "no fill counted"
[ "$(value ckfs_read_errors_total "$WORK/a.values")" = 0 ] || fail "read errors on a clean read"

# A second mount: the same HELP and TYPE lines, its own label.
cp -a "$FIX" "$WORK/ck"
do_mount "$WORK/ck" "$WORK/plain" || die "second mount failed"
"$CKFS" stats --prometheus "$WORK/plain" >"$WORK/b.prom" || fail "stats --prometheus (second mount)"
cmp -s <(grep '^#' "$WORK/a.prom" | grep -v '^# HELP ckfs_mount_info') \
	<(grep '^#' "$WORK/b.prom" | grep -v '^# HELP ckfs_mount_info') ||
	fail "HELP or TYPE lines differ between two mounts"
grep -q "^ckfs_files{mountpoint=\"$WORK/plain\"} " "$WORK/b.prom" || fail "second mount's label"

# A source changed under the mount: the failed read is counted.
truncate -s 1000 "$WORK/ck/model_world_size_2_rank_1.pt"
cat "$WORK/plain/model.safetensors" >/dev/null 2>&1 && fail "read after truncation succeeded"
"$CKFS" stats --prometheus "$WORK/plain" >"$WORK/c.prom" || fail "stats --prometheus after the fault"
"$CKFS" stats --json "$WORK/plain" >"$WORK/c.json"
check_format "$WORK/c.prom" "$WORK/c.json" "$WORK/plain" >"$WORK/c.values" || fail "format after the fault"
[ "$(value ckfs_read_errors_total "$WORK/c.values")" -ge 1 ] 2>/dev/null || fail "read error not counted"
[ "$(value ckfs_cache_fill_errors_total "$WORK/c.values")" -ge 1 ] 2>/dev/null ||
	fail "fill error not counted"

# Refusals: one line, the usual statuses.
err=$("$CKFS" stats --json --prometheus "$MNT" 2>&1 >/dev/null)
[ $? = 2 ] && grep -q "exclude each other" <<<"$err" || fail "--json --prometheus: '$err'"
err=$("$CKFS" stats --prometheus "$WORK" 2>&1 >/dev/null)
[ $? = 1 ] && [ "$(wc -l <<<"$err")" = 1 ] && grep -q "not a ckfs mount" <<<"$err" ||
	fail "--prometheus on a plain folder: '$err'"

"$CKFS" umount "$MNT" || fail "umount $MNT"
"$CKFS" umount "$WORK/plain" || fail "umount $WORK/plain"
finish
