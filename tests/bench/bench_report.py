#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The results table of tests/bench/bench.sh (benchmark helper, not a test).

    bench_report.py RESULTS [--markdown OUT.md]

RESULTS holds one figure of one run per line, "SIZE KEY VALUE" (seconds,
bytes), and "SIZE meta:NAME VALUE" facts. Prints one table: the median of
every figure, all runs, the figure it is compared with, the ratio of the two
medians and the issue's target (met or not). The same table goes to
OUT.md when asked. Nothing fails on a missed target: this is a report.
"""
import argparse
import statistics
import sys
from collections import defaultdict

MiB = 1 << 20


def load(path):
    runs = defaultdict(lambda: defaultdict(list))
    meta = defaultdict(dict)
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split(" ", 2)
            if len(parts) != 3:
                continue
            size, key, value = parts
            if key.startswith("meta:"):
                meta[size][key[5:]] = value
            else:
                runs[size][key].append(float(value))
    return runs, meta


def fmt_s(v):
    return "%.3f s" % v if v < 10 else "%.2f s" % v


def fmt_mib(v):
    return "%.0f MiB" % (v / MiB)


class Table:
    def __init__(self, runs, meta):
        self.runs, self.meta = runs, meta
        self.rows = []
        self.met = self.targets = 0

    def med(self, size, key):
        v = self.runs[size].get(key)
        return statistics.median(v) if v else None

    def add(self, size, figure, key, kind, ref=None, ratio=None, target=None):
        """kind: 's' (seconds), 'rate' (seconds of reading out_bytes, shown
        as GB/s), 'srate' (same for the source bytes), 'mem' (bytes), 'cpu'
        (CPU-seconds used by the whole machine during the read).
        ref: (label, key) of the figure compared with. ratio: 'faster'
        (ref/fig time), 'frac' (fig/ref memory), 'x' (fig/ref time),
        'xrate' (ref/fig time: a rate ratio), 'xcpu' (fig/ref CPU time).
        target: (text, test(value))."""
        vals = self.runs[size].get(key)
        if not vals:
            return
        nbytes = float(self.meta[size].get("src_bytes" if kind == "srate" else "out_bytes", 0))

        def show(v):
            if kind in ("rate", "srate"):
                return "%.2f GB/s" % (nbytes / v / 1e9)
            if kind == "cpu":
                return "%.2f CPU-s" % v
            return fmt_mib(v) if kind == "mem" else fmt_s(v)

        m = statistics.median(vals)
        row = [size, figure, show(m), ", ".join(show(v) for v in vals), "", "", "", ""]
        if kind in ("rate", "srate"):
            row[2] += " (%s)" % fmt_s(m)
        value = None
        if ref:
            r = self.med(size, ref[1])
            if r:
                row[4] = ref[0]
                if ratio == "faster":
                    value = r / m
                    row[5] = "%.1fx faster" % value
                elif ratio == "frac":
                    value = m / r
                    row[5] = "1/%.0f" % (1 / value) if value else "0"
                elif ratio == "x":
                    value = m / r
                    row[5] = "%.2fx the time" % value
                elif ratio == "xrate":
                    value = r / m
                    row[5] = "%.2fx the rate" % value
                elif ratio == "xcpu":
                    value = m / r
                    row[5] = "%.2fx the CPU time" % value
        if target:
            text, test = target
            row[6] = text
            v = value if ref else m
            if v is not None:
                ok = test(v)
                row[7] = "yes" if ok else "NO"
                self.targets += 1
                self.met += ok
        self.rows.append(row)

    def add_bound(self, size):
        """The best first-read rate ratio a converting server can reach when
        the reads are CPU-bound: the ceiling's CPU time over the ceiling's
        plus the conversion floor's."""
        ceil, floor = self.med(size, "ceil_cat1_cpu"), self.med(size, "convert_floor_cpu")
        if ceil is None or floor is None:
            return
        self.rows.append([size, "3. bound when CPU-bound: ceiling CPU / (ceiling + floor)",
                          "%.2fx the rate" % (ceil / (ceil + floor)), "", "", "", "", ""])

    def add_hwm(self, size):
        vals = self.runs[size].get("daemon_hwm")
        budget = float(self.meta["all"].get("budget") or self.meta[size].get("budget") or 0)
        if not vals:
            return
        peak = max(vals)
        row = [size, "daemon peak RSS (VmHWM) during 3-5", fmt_mib(statistics.median(vals)),
               "max %s over %d mounts" % (fmt_mib(peak), len(vals)), "", "", "", ""]
        if budget:
            row[4] = "cache budget %s" % fmt_mib(budget)
            row[5] = "max - budget = %+.0f MiB" % ((peak - budget) / MiB)
            row[6] = "max <= budget + 64 MiB"
            ok = peak <= budget + 64 * MiB
            row[7] = "yes" if ok else "NO"
            self.targets += 1
            self.met += ok
        self.rows.append(row)

    def render(self):
        head = ["checkpoint", "figure", "median", "runs", "compared with", "ratio of medians",
                "target", "met"]
        rows = [head] + self.rows
        w = [max(len(r[i]) for r in rows) for i in range(len(head))]
        out = ["| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(r)) + " |" for r in rows]
        out.insert(1, "|" + "|".join("-" * (n + 2) for n in w) + "|")
        return "\n".join(out)


def build(runs, meta):
    t = Table(runs, meta)
    for size in runs:
        if size == "all":
            continue
        ge = lambda n: (lambda v: v >= n)  # noqa: E731
        le = lambda n: (lambda v: v <= n)  # noqa: E731
        lt = lambda n: (lambda v: v < n)  # noqa: E731
        t.add(size, "1. ckfs export: wall time", "export_ckfs_s", "s",
              ("verl merger", "export_verl_s"), "faster", (">= 5x faster", ge(5)))
        t.add(size, "1. verl merger: wall time", "export_verl_s", "s")
        t.add(size, "1. ckfs export vs verl merger + sync (both durable)", "export_ckfs_s", "s",
              ("verl merger + sync", "export_verl_sync_s"), "faster")
        t.add(size, "1. ckfs export: peak RSS", "export_ckfs_rss", "mem",
              ("verl merger", "export_verl_rss"), "frac", ("<= 1/10", le(0.1)))
        t.add(size, "1. verl merger: peak RSS", "export_verl_rss", "mem")
        ready_target = {"0.5b": ("< 0.2 s", lt(0.2)), "70b": ("< 1 s", lt(1.0))}.get(size)
        t.add(size, "2. mount to ready (header read)", "ready_s", "s", target=ready_target)
        t.add(size, "2. ckfs inspect", "inspect_s", "s")
        t.add(size, "3. cat of the rank files (page cache)", "src_cat_s", "srate")
        t.add(size, "3. FUSE ceiling: first read", "ceil_cat1_s", "rate")
        t.add(size, "3. ckfs: first read (fresh mount)", "ckfs_cat1_s", "rate",
              ("FUSE ceiling, first read", "ceil_cat1_s"), "xrate", (">= 0.8x", ge(0.8)))
        t.add(size, "3. FUSE ceiling: first read, CPU time", "ceil_cat1_cpu", "cpu")
        t.add(size, "3. ckfs: first read, CPU time", "ckfs_cat1_cpu", "cpu",
              ("FUSE ceiling, first read", "ceil_cat1_cpu"), "xcpu")
        t.add(size, "3. conversion floor: fp32 -> bf16 of the rank files alone", "convert_floor_cpu",
              "cpu")
        t.add(size, "3. the same from mapped windows (before)", "convert_floor_mmap_cpu", "cpu",
              ("conversion floor (pread)", "convert_floor_cpu"), "xcpu")
        t.add_bound(size)
        t.add(size, "3. FUSE ceiling: second read", "ceil_cat2_s", "rate")
        t.add(size, "3. ckfs: second read (page cache)", "ckfs_cat2_s", "rate",
              ("FUSE ceiling, second read", "ceil_cat2_s"), "xrate")
        t.add(size, "3. FUSE ceiling: first read, read_ahead_kb 128", "ceil_cat1_ra128_s", "rate",
              ("the same at 1024", "ceil_cat1_s"), "xrate")
        t.add(size, "3. ckfs: first read, read_ahead_kb 128", "ckfs_cat1_ra128_s", "rate",
              ("the same at 1024", "ckfs_cat1_s"), "xrate")
        t.add(size, "3. ckfs vs ceiling, both at read_ahead_kb 128", "ckfs_cat1_ra128_s", "rate",
              ("FUSE ceiling at 128", "ceil_cat1_ra128_s"), "xrate")
        t.add(size, "4. safe_open+get_tensor: exported copy", "st_export_s", "s")
        t.add(size, "4. safe_open+get_tensor: mount, first load", "st_mount_s", "s",
              ("exported copy", "st_export_s"), "x", ("<= 1.5x", le(1.5)))
        t.add(size, "4. safe_open+get_tensor: mount, second load", "st_mount2_s", "s",
              ("exported copy", "st_export_s"), "x")
        t.add(size, "4. safe_open+get_tensor: FUSE ceiling", "st_ceil_s", "s",
              ("exported copy", "st_export_s"), "x")
        t.add(size, "4. safe_open+get_tensor: mount vs ceiling", "st_mount_s", "s",
              ("FUSE ceiling", "st_ceil_s"), "x")
        t.add(size, "5. from_pretrained: exported copy", "hf_export_s", "s")
        t.add(size, "5. from_pretrained: mount, first load", "hf_mount_s", "s",
              ("exported copy", "hf_export_s"), "x", ("<= 1.3x", le(1.3)))
        t.add(size, "5. from_pretrained: mount, second load", "hf_mount2_s", "s",
              ("exported copy", "hf_export_s"), "x")
        t.add(size, "5. from_pretrained: FUSE ceiling", "hf_ceil_s", "s",
              ("exported copy", "hf_export_s"), "x")
        t.add(size, "5. from_pretrained: mount vs ceiling", "hf_mount_s", "s",
              ("FUSE ceiling", "hf_ceil_s"), "x")
        t.add_hwm(size)
    return t


def describe(meta):
    lines = []
    if meta["all"].get("env"):
        lines.append(meta["all"]["env"])
    for size, m in meta.items():
        if size == "all":
            continue
        src, disk = float(m.get("src_bytes", 0)), float(m.get("src_disk", 0))
        line = "%s: %s, %s rank files, %.2f GB fp32" % (size, m.get("shape", "?"),
                                                        m.get("world", "?"), src / 1e9)
        if src and disk < src / 2:
            line += " (holes: %.1f MB on disk)" % (disk / 1e6)
        if m.get("out_bytes"):
            line += " -> model.safetensors %.2f GB bf16" % (float(m["out_bytes"]) / 1e9)
        lines.append(line)
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--markdown")
    a = ap.parse_args()
    runs, meta = load(a.results)
    t = build(runs, meta)
    desc = describe(meta)
    summary = "targets met: %d of %d" % (t.met, t.targets)
    table = t.render()
    print()
    print("\n".join(desc))
    print()
    print(table)
    print()
    print(summary)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write("\n".join("- " + d for d in desc) + "\n\n" + table + "\n\n" + summary + "\n")
        print("markdown table written to %s" % a.markdown, file=sys.stderr)


if __name__ == "__main__":
    main()
