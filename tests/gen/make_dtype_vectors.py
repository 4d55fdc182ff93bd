#!/usr/bin/env python3
"""Conversion test vectors produced by torch's own CPU cast kernels.

For every conversion below, a source array (edge cases + seeded random bit patterns, or every
bit pattern for types of 16 bits or fewer) is converted with `src_tensor.to(dtype)` on the whole
1-D contiguous tensor, which is the vectorised copy kernel that verl's merger (`.bfloat16()`)
and ckfs's reference use.  Written to tests/fixtures/dtype/:

    <from>_to_<to>.src   raw little-endian source elements
    <from>_to_<to>.dst   raw little-endian torch results, same count
    manifest.txt         '# ...' comment lines, then '<from> <to> <count>' per conversion

Type names: f64 f32 f16 bf16 i64 i32 i16 i8 u8 bool f8_e4m3 (float8_e4m3fn) f8_e5m2.

The header of manifest.txt records how NaNs come out on the other code paths (a 1-element
tensor, a 0-d tensor = the scalar c10 conversion, and other ATEN_CPU_CAPABILITY kernels), so a C
implementation knows which NaN encoding is the one to match.

    .venv/bin/python tests/gen/make_dtype_vectors.py [--out tests/fixtures/dtype] [--no-capabilities]
"""

import argparse
import hashlib
import os
import subprocess
import sys

import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO, "tests", "fixtures", "dtype")
SEED = 20260101
N_RANDOM = 100_000

TYPES = {
    "f64": (torch.float64, np.uint64), "f32": (torch.float32, np.uint32), "f16": (torch.float16, np.uint16),
    "bf16": (torch.bfloat16, np.uint16), "i64": (torch.int64, np.int64), "i32": (torch.int32, np.int32),
    "i16": (torch.int16, np.int16), "i8": (torch.int8, np.int8), "u8": (torch.uint8, np.uint8),
    "bool": (torch.bool, np.uint8), "f8_e4m3": (torch.float8_e4m3fn, np.uint8),
    "f8_e5m2": (torch.float8_e5m2, np.uint8),
}

CONVERSIONS = [
    ("f32", "bf16"), ("f32", "f16"), ("f16", "bf16"), ("bf16", "f16"), ("f64", "bf16"), ("f64", "f16"),
    ("f64", "f32"), ("bf16", "f32"), ("f16", "f32"), ("i64", "bf16"), ("i32", "bf16"), ("i16", "bf16"),
    ("i8", "bf16"), ("u8", "bf16"), ("bool", "bf16"), ("f8_e4m3", "bf16"), ("f8_e5m2", "bf16"),
    ("f8_e4m3", "f32"), ("f32", "f32"), ("f32", "f8_e4m3"),
]


def rng(tag):
    return np.random.default_rng([SEED, int(hashlib.sha256(tag.encode()).hexdigest()[:8], 16)])


def with_neg32(bits):
    b = np.array(bits, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([b, b | np.uint32(0x80000000)])


def f32_edges():
    e = [0x00000000, 0x7F800000, 0x7FC00000, 0x7F800001, 0x7FA00000, 0x7FBFFFFF, 0x7FC00001, 0x7FD55555,
         0x7FE00000, 0x7FFFFFFF, 0x7F7FFFFF, 0x00800000, 0x007FFFFF, 0x00000001, 0x00000002, 0x00008000,
         0x00010000, 0x00018000, 0x0000FFFF, 0x3F800000, 0x3F808000, 0x3F818000, 0x3F80FFFF, 0x3F807FFF,
         0x3F808001, 0x3F7FFFFF, 0x3F7F8000, 0x7F7F7FFF, 0x7F7F8000, 0x7F7F8001, 0x7F7EFFFF, 0x7F7E8000,
         # float16 boundaries
         0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001, 0x47800000, 0x477FD000, 0x477FDFFF,
         0x38800000, 0x387FC000, 0x387FE000, 0x387FF000, 0x33800000, 0x33000000, 0x33000001, 0x32FFFFFF,
         0x33400000, 0x33C00000, 0x34200000, 0x32800000, 0x3F801000, 0x3F803000, 0x3F800FFF, 0x3F801001,
         0x387FFFFF, 0x38000000, 0x38001000, 0x38002000,
         # misc
         0x40490FDB, 0x3EAAAAAB, 0x4B800000, 0x4B7FFFFF, 0x5F000000, 0x4F000000, 0x3DCCCCCD]
    # ties for bf16 at many exponents, both parities, plus one below / above
    for exp in (1, 2, 100, 126, 127, 128, 200, 253, 254):
        for mant_hi in (0x00, 0x01, 0x7E, 0x7F):
            hi = (exp << 7) | mant_hi
            for lo in (0x7FFF, 0x8000, 0x8001):
                e.append((hi << 16) | lo)
    # ties for f16 (13 dropped bits) in the normal and subnormal f16 range
    for exp in (103, 105, 110, 112, 113, 114, 127, 142):
        for m in (0x000000, 0x002000, 0x7FC000, 0x7FE000):
            for lo in (0x0FFF, 0x1000, 0x1001):
                e.append((exp << 23) | m | lo)
    return with_neg32(e)


def f32_source():
    r = rng("f32").integers(0, 2**32, size=N_RANDOM, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([f32_edges(), r]).view(np.float32)


def f64_source():
    e = [0x0000000000000000, 0x7FF0000000000000, 0x7FF8000000000000, 0x7FF0000000000001, 0x7FF4000000000000,
         0x7FFFFFFFFFFFFFFF, 0x7FF8000000000001, 0x7FEFFFFFFFFFFFFF, 0x0010000000000000, 0x000FFFFFFFFFFFFF,
         0x0000000000000001, 0x3FF0000000000000]
    vals = []
    with np.errstate(invalid="ignore"):
        f32e = f32_edges().view(np.float32).astype(np.float64)
    f32e = f32e[np.isfinite(f32e)]
    vals.append(f32e)  # exactly representable in f32
    # double rounding probes: an f32 tie for bf16 / f16 nudged by far less than half an f32 ulp
    r = rng("f64dr")
    hi = r.integers(0x0080, 0x7F7F, size=1000, dtype=np.uint32)
    ties_bf16 = ((hi << 16) | 0x8000).astype(np.uint32).view(np.float32).astype(np.float64)
    m = r.integers(0, 1 << 10, size=1000, dtype=np.uint32)
    ex = r.integers(103, 143, size=1000, dtype=np.uint32)
    ties_f16 = ((ex << 23) | (m << 13) | 0x1000).astype(np.uint32).view(np.float32).astype(np.float64)
    for t in (ties_bf16, ties_f16):
        vals += [t, t * (1 + 2.0**-40), t * (1 - 2.0**-40), t * (1 + 2.0**-30), t * (1 - 2.0**-30)]
    # values just above / below the f32 max and the f16 / bf16 rounding limits
    vals.append(np.array([3.4028235677973366e38, 3.4028235677973366e38 * (1 + 2.0**-30), 3.402823669209385e38,
                          65504.0, 65519.999999, 65520.0, 65520.000001, 2.0**-24, 2.0**-25, 2.0**-25 * (1 + 2.0**-40),
                          2.0**-25 * (1 - 2.0**-40), 1e-45, 7e-46, 1.401298464324817e-45, 2.0**-150,
                          2.0**-150 * (1 + 2.0**-40), 2.0**-149, 1e300, 1e-300]))
    finite = np.concatenate(vals)
    finite = np.concatenate([finite, -finite]).view(np.uint64)
    edges = np.array(e, dtype=np.uint64)
    edges = np.concatenate([edges, edges | np.uint64(0x8000000000000000)])
    n = N_RANDOM // 4  # f64 sources are 8 bytes: fewer random ones keep the fixtures small
    rnd_all = rng("f64all").integers(0, 2**64, size=n, dtype=np.uint64, endpoint=False)
    rr = rng("f64mid")
    sign = rr.integers(0, 2, size=n, dtype=np.uint64) << np.uint64(63)
    expo = rr.integers(1023 - 40, 1023 + 40, size=n, dtype=np.uint64) << np.uint64(52)
    mant = rr.integers(0, 1 << 52, size=n, dtype=np.uint64)
    return np.concatenate([edges, finite, rnd_all, sign | expo | mant]).view(np.float64)


def all16():
    return np.arange(65536, dtype=np.uint32).astype(np.uint16)


def int_source(npt, bits):
    info = np.iinfo(npt)
    e = [0, 1, -1, 2, -2, info.max, info.min, info.max - 1, info.min + 1]
    for k in range(1, bits - 1):
        for d in (-1, 0, 1):
            e += [(1 << k) + d, -((1 << k) + d)]
    # integers whose float32 value is an exact bf16 tie (int -> float -> bf16 double rounding)
    for k in range(9, bits - 1):
        base = 1 << k
        step = base >> 8  # bf16 ulp at 2^k is 2^(k-7); half ulp 2^(k-8)
        for j in (1, 3, 5, 255, 257):
            for d in (0, -1, 1):
                v = base + j * step + d
                if v <= info.max:
                    e += [v, -v]
    e = [v for v in e if info.min <= v <= info.max]
    r = rng(f"int{bits}")
    n = N_RANDOM // (2 if bits == 32 else 4)
    big = r.integers(info.min, info.max, size=n, dtype=npt, endpoint=True)
    small = r.integers(-(1 << 20), 1 << 20, size=n, dtype=np.int64).astype(npt)
    return np.concatenate([np.array(e, dtype=npt), big, small])


def source(name):
    if name == "f32":
        return f32_source()
    if name == "f64":
        return f64_source()
    if name in ("f16", "bf16"):
        return all16()
    if name in ("i16", "i8", "u8"):
        npt = TYPES[name][1]
        info = np.iinfo(npt)
        return np.arange(info.min, info.max + 1, dtype=np.int64).astype(npt)
    if name in ("i32", "i64"):
        return int_source(TYPES[name][1], 32 if name == "i32" else 64)
    if name == "bool":
        return np.array([0, 1], dtype=np.uint8)
    if name in ("f8_e4m3", "f8_e5m2"):
        return np.arange(256, dtype=np.uint32).astype(np.uint8)
    raise KeyError(name)


def to_torch(name, arr):
    """numpy source -> torch tensor of the named dtype (float sources are reinterpreted bits)."""
    if name == "bool":
        return torch.from_numpy(arr.astype(np.bool_))
    if name in ("i64", "i32", "i16", "i8", "u8"):
        return torch.from_numpy(np.ascontiguousarray(arr.astype(TYPES[name][1])))
    a = np.ascontiguousarray(arr)
    raw = a.view({1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}[a.itemsize]).copy()
    t = torch.from_numpy(raw).view(TYPES[name][0])
    assert t.element_size() == a.itemsize
    return t


def raw_bytes(t):
    t = t.contiguous()
    if t.dtype == torch.bool:
        return t.to(torch.uint8).numpy().tobytes()
    n = t.element_size()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[n]).numpy().tobytes()


def bits_of(t):
    n = t.element_size()
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[n]).numpy().view(
        {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[n])


def f8_e4m3_probes():
    """f32 values around every float8_e4m3fn value: each one, the midpoints
    between neighbours (ties), and one f32 ulp either side of those."""
    vals = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    v = np.sort(np.unique(vals[torch.isfinite(vals)].numpy().astype(np.float32)))
    mids = ((v[:-1].astype(np.float64) + v[1:]) / 2).astype(np.float32)
    probes = np.concatenate([v, mids, np.float32([464.0, 480.0, 496.0, 512.0, 1e-30])])
    bits = probes.view(np.uint32)
    near = np.concatenate([bits, bits + np.uint32(1), bits - np.uint32(1)])
    return near.view(np.float32)


def compute_all():
    res = {}
    for f, t in CONVERSIONS:
        srcv = source(f)
        if (f, t) == ("f32", "f8_e4m3"):
            srcv = np.concatenate([srcv, f8_e4m3_probes()])
        src = to_torch(f, srcv)
        dst = src.to(TYPES[t][0])
        res[(f, t)] = (src, dst)
    return res


def nan_report(results):
    """Compare NaN results of whole-tensor casts with 1-element and 0-d (scalar) casts."""
    lines = []
    for (f, t), (src, dst) in results.items():
        if not src.is_floating_point() or not dst.is_floating_point() or f == t:
            continue
        isnan = torch.isnan(src.float() if src.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else src)
        idx = torch.nonzero(isnan).flatten().tolist()
        if not idx:
            continue
        whole = bits_of(dst)
        diff1, diff0, enc_whole, enc_one, enc_zero = 0, 0, set(), set(), set()
        for i in idx:
            one = bits_of(src[i:i + 1].clone().to(dst.dtype))[0]
            zero = bits_of(src[i].clone().to(dst.dtype).reshape(1))[0]
            enc_whole.add(int(whole[i]))
            enc_one.add(int(one))
            enc_zero.add(int(zero))
            diff1 += int(one != whole[i])
            diff0 += int(zero != whole[i])
        fmt = lambda s: ",".join(f"0x{v:0{dst.element_size() * 2}X}" for v in sorted(s)[:6]) + (
            ",..." if len(s) > 6 else "")
        lines.append(f"# NaN {f}->{t}: {len(idx)} NaN sources; whole-tensor outputs {{{fmt(enc_whole)}}}; "
                     f"1-element tensor differs in {diff1}; 0-d tensor (scalar path) differs in {diff0} "
                     f"(scalar outputs {{{fmt(enc_zero)}}})")
    return lines


def position_report():
    """Does a NaN's output depend on where it sits in the tensor (vector body vs tail)?"""
    probes = {"f32": [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FA00000],
              "f16": [0x7E00, 0xFE00, 0x7C01, 0x7D00], "bf16": [0x7FC0, 0xFFC0, 0x7F81, 0x7FA0],
              "f64": [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0x7FF4000000000000]}
    lines = []
    for f, t in CONVERSIONS:
        if f not in probes or f == t:
            continue
        seen = {}
        for n in list(range(1, 70)) + [127, 128, 129, 255, 256, 257, 1000]:
            for pos in sorted({0, n // 2, n - 1, min(n - 1, 7), min(n - 1, 8), min(n - 1, 15), min(n - 1, 16),
                               min(n - 1, 31), min(n - 1, 32)}):
                for nb in probes[f]:
                    x = torch.ones(n, dtype=TYPES[f][0])
                    bits_of_view(x)[pos] = nb
                    seen.setdefault(nb, set()).add(int(bits_of(x.to(TYPES[t][0]))[pos]))
        w = TYPES[t][0].itemsize * 2
        dep = {k: v for k, v in seen.items() if len(v) > 1}
        desc = "; ".join(f"0x{k:X}->" + "|".join(f"0x{v:0{w}X}" for v in sorted(vs)) for k, vs in seen.items())
        lines.append(f"# NaN position {f}->{t}: " + ("DEPENDS on position in the tensor (vector body vs tail): "
                                                     if dep else "same at every position: ") + desc)
    return lines


def rounding_report(results):
    """Is the cast direct or through float32 (double rounding)?  Checked on the finite sources."""
    lines = []

    def rne_bf16(f32bits):
        u = f32bits.astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

    for (f, t), (src, dst) in results.items():
        if t not in ("bf16", "f16") or f not in ("f64", "i64", "i32"):
            continue
        a = src.numpy()
        fin = np.isfinite(a) if f == "f64" else np.ones(len(a), bool)
        with np.errstate(over="ignore", invalid="ignore"):
            via32 = a.astype(np.float32)
            via = rne_bf16(via32.view(np.uint32)) if t == "bf16" else via32.astype(np.float16).view(np.uint16)
            direct = None if t == "bf16" else a.astype(np.float16).view(np.uint16)
        d = bits_of(dst)
        n_via = int((fin & (via != d)).sum())
        msg = f"# rounding {f}->{t}: {'equals' if n_via == 0 else 'DIFFERS from'} RNE to float32 then RNE to {t}"
        if direct is not None:
            msg += f" ({int((fin & (direct != d)).sum())} of {int(fin.sum())} differ from one direct RNE)"
        lines.append(msg + (f" [{n_via} mismatches]" if n_via else ""))
    return lines


def bits_of_view(t):
    n = t.element_size()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[n]).numpy().view(
        {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[n])


def dump(results, d):
    os.makedirs(d, exist_ok=True)
    for (f, t), (_, dst) in results.items():
        with open(os.path.join(d, f"{f}_to_{t}.dst"), "wb") as fh:
            fh.write(raw_bytes(dst))


def capability_report(results):
    import tempfile

    lines = []
    for other in ("default", "avx2", "avx512"):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, ATEN_CPU_CAPABILITY=other)
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--dump", d], env=env,
                               capture_output=True, text=True)
            if p.returncode != 0:
                lines.append(f"# ATEN_CPU_CAPABILITY={other}: could not run ({p.stderr.strip()[-120:]})")
                continue
            kernel = p.stdout.strip().splitlines()[-1]
            diffs = []
            for (f, t), (src, dst) in results.items():
                theirs = np.frombuffer(open(os.path.join(d, f"{f}_to_{t}.dst"), "rb").read(),
                                       dtype=bits_of(dst).dtype)
                bad = np.nonzero(theirs != bits_of(dst))[0]
                if len(bad):
                    s32 = src.float() if src.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else src
                    nan_only = bool(src.is_floating_point() and torch.isnan(s32[torch.from_numpy(bad)]).all())
                    diffs.append(f"{f}->{t} {len(bad)} elems ({'all NaN sources' if nan_only else 'NOT only NaN'}"
                                 f", e.g. 0x{int(bits_of(dst)[bad[0]]):X} vs 0x{int(theirs[bad[0]]):X})")
            lines.append(f"# ATEN_CPU_CAPABILITY={other} (kernel {kernel}): "
                         + ("all dst identical" if not diffs else "differs: " + "; ".join(diffs)))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--no-capabilities", action="store_true", help="skip the cross-kernel comparison")
    ap.add_argument("--dump", help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(1)

    results = compute_all()
    if args.dump:
        dump(results, args.dump)
        print(torch.backends.cpu.get_cpu_capability())
        return

    cap = torch.backends.cpu.get_cpu_capability()
    header = [
        "# ckfs dtype conversion vectors, generated by tests/gen/make_dtype_vectors.py",
        f"# torch {torch.__version__}, numpy {np.__version__}, cpu capability {cap}, seed {SEED}",
        "# dst = torch.from_numpy(src).to(dtype) on the whole 1-D contiguous tensor (vectorised copy kernel).",
        "# Files: <from>_to_<to>.src / .dst, raw little-endian, <count> elements each; bool = 1 byte 0/1;",
        "# f8_e4m3 = torch.float8_e4m3fn, f8_e5m2 = torch.float8_e5m2.",
    ]
    header += nan_report(results)
    header += position_report()
    header += rounding_report(results)
    header.append("# Compare NaN outputs of conversions marked DEPENDS above by NaN-ness only (the encoding "
                  "follows the element's position relative to the SIMD width).")
    if not args.no_capabilities:
        header += capability_report(results)
    os.makedirs(args.out, exist_ok=True)
    lines = []
    for (f, t), (src, dst) in results.items():
        base = os.path.join(args.out, f"{f}_to_{t}")
        with open(base + ".src", "wb") as fh:
            fh.write(raw_bytes(src))
        with open(base + ".dst", "wb") as fh:
            fh.write(raw_bytes(dst))
        lines.append(f"{f} {t} {src.numel()}")
    with open(os.path.join(args.out, "manifest.txt"), "w") as fh:
        fh.write("\n".join(header + lines) + "\n")
    print("\n".join(header + lines))


if __name__ == "__main__":
    main()
