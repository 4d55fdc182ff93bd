# SPDX-License-Identifier: MIT
# Shared by bench_lora.sh, bench_fp8.sh and bench_ct_views.sh (sourced): the
# first read of a file through a fresh mount, a loader's read of it, and
# medians. Needs CKFS, PY, SRC, MNT.

# first_read FILE MOUNT_OPTIONS...: "wall_s daemon_cpu_s source_bytes"
# for `cat MNT/FILE` right after mounting SRC with the options.
first_read() {
	local file=$1 pid t0 t1 ticks stats
	shift
	"$CKFS" mount "$SRC" "$MNT" "$@" 2>/dev/null
	pid=$("$CKFS" stats --json "$MNT" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
	t0=$(date +%s.%N)
	cat "$MNT/$file" >/dev/null
	t1=$(date +%s.%N)
	ticks=$(awk '{print $14 + $15}' "/proc/$pid/stat")
	stats=$("$CKFS" stats --json "$MNT" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["source_bytes_read"])')
	"$CKFS" umount "$MNT"
	echo "$(echo "$t1 - $t0" | bc) $(echo "scale=3; $ticks / $(getconf CLK_TCK)" | bc) $stats"
}

# median of the numbers on stdin, one per line
median() { sort -n | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

# column K of FILE's lines, median
col_median() { cut -d' ' -f"$1" "$2" | median; }

# loader_read DTYPE: "wall_s daemon_cpu_s source_bytes" of safe_open over
# every key in sorted order, through a fresh mount
loader_read() {
	local pid out
	"$CKFS" mount "$SRC" "$MNT" --dtype "$1" 2>/dev/null
	pid=$("$CKFS" stats --json "$MNT" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
	out=$("$PY" - "$MNT/model.safetensors" <<'PYEOF'
import sys, time
from safetensors import safe_open
t0 = time.monotonic()
with safe_open(sys.argv[1], framework="pt") as f:
    for k in sorted(f.keys()):
        f.get_tensor(k)
print(time.monotonic() - t0)
PYEOF
)
	ticks=$(awk '{print $14 + $15}' "/proc/$pid/stat")
	stats=$("$CKFS" stats --json "$MNT" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["source_bytes_read"])')
	"$CKFS" umount "$MNT"
	echo "$out $(echo "scale=3; $ticks / $(getconf CLK_TCK)" | bc) $stats"
}
