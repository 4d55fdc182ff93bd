#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Derived local headers (docs/formats.md, "Local headers"): a verl FSDP
# rank file's storage whose local zip header would cost a read of its own
# is located by torch.save's alignment rule at open, and its header is read
# and compared before the first byte of that storage is served. A real
# actor (tests/fixtures/clients/fsdp/qwen2_fsdp2_w2) copied, with the local
# header of one such storage made 64 bytes longer by hand (its data would
# start 64 bytes later than the rule says): `inspect` and the mount still
# work (the header is not read before), but reading the weights (the
# kernel's reads of this small file reach that storage) fails with EIO, a
# log line naming the file and the cause, never other bytes;
# `export` fails with that line. The same from the plan cache (the guards
# are kept in its record), and for rank 0 (its own guards, built at every
# open). The undamaged actor serves what `export` writes.
source "$(dirname "$0")/lib.sh"
require_fuse

SRC=$CKFS_ROOT/tests/fixtures/clients/fsdp/qwen2_fsdp2_w2
export CKFS_PLAN_CACHE=$WORK/plans

# damage FILE RECORD: the record's local extra field 64 bytes longer;
# prints "NAME REAL DERIVED" (where the header now puts the data, and
# where the rule does)
damage() {
	"$PY" - "$1" "$2" <<'PY'
import struct, sys, zipfile
path, rec = sys.argv[1], sys.argv[2]
info = next(i for i in zipfile.ZipFile(path).infolist() if i.filename.endswith("/" + rec))
b = bytearray(open(path, "rb").read())
at = info.header_offset
xlen = struct.unpack_from("<H", b, at + 28)[0]
struct.pack_into("<H", b, at + 28, xlen + 64)
open(path, "r+b").write(b)
data = at + 30 + len(info.filename) + xlen
print(info.filename, data + 64, data)
PY
}

GOOD=$WORK/good
cp -a "$SRC" "$GOOD"
CKFS_PLAN_CACHE=off "$CKFS" export --quiet "$GOOD" "$WORK/exp" || die "export of the good actor failed"

for rank in 1 0; do
	for run in checked cached; do
		BAD=$WORK/bad$rank
		if [ "$run" = checked ]; then
			rm -rf "$BAD" "$CKFS_PLAN_CACHE"
			cp -a "$SRC" "$BAD"
			read -r name real derived < <(damage "$BAD/model_world_size_2_rank_$rank.pt" data/10)
			CAUSE="'$BAD/model_world_size_2_rank_$rank.pt': local header of zip entry '$name' puts its data at $real, not at $derived where torch.save's alignment would"
		fi
		t="rank $rank, $run"
		"$CKFS" inspect --log-level info "$BAD" >/dev/null 2>"$WORK/log-inspect" ||
			fail "$t: inspect refused: $(cat "$WORK/log-inspect")"
		if [ "$run" = cached ] && [ "$rank" = 1 ]; then
			grep -q "from the plan cache" "$WORK/log-inspect" || fail "$t: the plan cache was not used"
		fi
		if "$CKFS" export --quiet "$BAD" "$WORK/out-$rank-$run" 2>"$WORK/log-export"; then
			fail "$t: export succeeded"
		fi
		grep -qxF "ckfs: $CAUSE" "$WORK/log-export" ||
			fail "$t: export said '$(cat "$WORK/log-export")', expected '$CAUSE'"

		mnt=$WORK/mnt-$rank-$run
		mkdir -p "$mnt"
		start_foreground "$WORK/log-$rank-$run" "$WORK/notify-$rank-$run.sock" "$BAD" "$mnt"
		pid=$FG_PID
		[ -s "$mnt/config.json" ] || fail "$t: config.json is not served"
		ls -l "$mnt" >/dev/null || fail "$t: ls"
		"$PY" "$HELPER" errno "$mnt/model.safetensors" EIO || fail "$t: read errno"
		grep -qF "$CAUSE" "$WORK/log-$rank-$run" ||
			fail "$t: no log line '$CAUSE': $(cat "$WORK/log-$rank-$run")"
		kill -0 "$pid" 2>/dev/null || die "$t: the daemon died"
		kill -TERM "$pid"
		wait "$pid" || fail "$t: daemon exit status $? after SIGTERM"
		log "$t: refused, $CAUSE"
	done
done

# the undamaged actor: the same bytes as the export, checked and cached
rm -rf "$CKFS_PLAN_CACHE"
for run in checked cached; do
	mnt=$WORK/mnt-good-$run
	mkdir -p "$mnt"
	do_mount "$GOOD" "$mnt" || fail "good, $run: mount"
	cmp -s "$mnt/model.safetensors" "$WORK/exp/model.safetensors" ||
		fail "good, $run: model.safetensors differs from the export"
	"$CKFS" umount "$mnt" || fail "good, $run: umount"
done
ls "$CKFS_PLAN_CACHE"/*.plan >/dev/null 2>&1 || fail "good: no plan cache record"

finish
