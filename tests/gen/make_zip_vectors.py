#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Write the inputs of tests/unit/test_zip.c.

tests/fixtures/zip/  archives written by real tools: torch.save (torch 2.8)
                     in several modes, Python's zipfile, torch DCP, plus raw
                     tensor bytes and record manifests to compare against.
tests/corpus/zip/    small hand-crafted archives, most of them broken in one
                     specific way; the expected code and message of each is
                     asserted in test_zip.c.

Run from the repository root with the test venv (torch is only needed for
the fixtures; the corpus needs the standard library alone):

    /work/venvtest/v/bin/python tests/gen/make_zip_vectors.py

Outputs are committed, so the C tests never need Python. All are
deterministic except legacy.pt, whose storage keys are memory addresses
(only its first bytes matter to the tests).
"""

import io
import os
import shutil
import struct
import sys
import tempfile
import zipfile
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "zip")
CORPUS = os.path.join(ROOT, "tests", "corpus", "zip")

LOCAL_SIG = 0x04034B50
CENTRAL_SIG = 0x02014B50
EOCD_SIG = 0x06054B50
ZIP64_EOCD_SIG = 0x06064B50
ZIP64_LOCATOR_SIG = 0x07064B50
SAT32 = 0xFFFFFFFF


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


# ---------------------------------------------------------------------------
# Real tools


def state_dict(torch):
    return {
        "w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "b": torch.arange(5, dtype=torch.int64),
        "e": torch.empty(0, dtype=torch.float32),  # an empty record
    }


def manifest(path):
    """name size crc per entry, in central directory order."""
    with zipfile.ZipFile(path) as zf:
        return "".join("%s %d %08x\n" % (i.filename, i.file_size, i.CRC)
                       for i in zf.infolist())


def make_fixtures():
    try:
        import torch
    except ImportError:
        print("torch not importable: fixtures not regenerated", file=sys.stderr)
        return
    import torch.serialization as ser

    os.makedirs(FIXTURES, exist_ok=True)
    sd = state_dict(torch)

    # 1. Plain torch.save to an ASCII path: folder = file stem "sd".
    sd_pt = os.path.join(FIXTURES, "sd.pt")
    torch.save(sd, sd_pt)
    write(os.path.join(FIXTURES, "sd.data0.bin"), sd["w"].numpy().tobytes())
    write(os.path.join(FIXTURES, "sd.data1.bin"), sd["b"].numpy().tobytes())
    write(os.path.join(FIXTURES, "sd.records.txt"), manifest(sd_pt).encode())

    # 2. To a BytesIO, and to a non-ASCII path: both use folder "archive".
    buf = io.BytesIO()
    torch.save(sd, buf)
    write(os.path.join(FIXTURES, "bytesio.pt"), buf.getvalue())
    with tempfile.TemporaryDirectory() as tmp:
        p = os.path.join(tmp, "poids_\u00e9t\u00e9.pt")
        torch.save(sd, p)
        shutil.copyfile(p, os.path.join(FIXTURES, "nonascii.pt"))
    with zipfile.ZipFile(os.path.join(FIXTURES, "nonascii.pt")) as zf:
        assert zf.namelist()[0].startswith("archive/"), zf.namelist()

    # 3. CRC computation disabled: every CRC field is 0.
    if hasattr(ser, "set_crc32_options"):
        ser.set_crc32_options(False)
        try:
            torch.save(sd, os.path.join(FIXTURES, "nocrc.pt"))
        finally:
            ser.set_crc32_options(True)

    # 4. Rewritten by zipfile: two records deflated, one with a forced zip64
    # local header, the rest stored; same names, same order.
    rezip = os.path.join(FIXTURES, "rezip.zip")
    with zipfile.ZipFile(sd_pt) as src, \
            zipfile.ZipFile(rezip, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            zi = zipfile.ZipInfo(info.filename, date_time=(2020, 1, 1, 0, 0, 0))
            if info.filename.endswith(("/data.pkl", "/data/0")):
                zi.compress_type = zipfile.ZIP_DEFLATED
            if info.filename.endswith("/data/1"):
                with dst.open(zi, "w", force_zip64=True) as f:
                    f.write(data)
            else:
                dst.writestr(zi, data)
    write(os.path.join(FIXTURES, "rezip.records.txt"), manifest(rezip).encode())

    # 5. Embedded at an odd offset: 7 bytes before, 13 after.
    with open(sd_pt, "rb") as f:
        body = f.read()
    write(os.path.join(FIXTURES, "embedded.bin"), b"JUNK123" + body + b"trailing-junk")

    # 6. The legacy (pre-1.6) pickle format.
    torch.save(sd, os.path.join(FIXTURES, "legacy.pt"),
               _use_new_zipfile_serialization=False)

    # 7. Past 4 GiB: miniz's central zip64 extras (sizes of the big record,
    # offsets of the records after it). skip_data() leaves the storage
    # bytes as a hole, so only the head and tail of the 4.4 GB file are
    # kept; the test rebuilds it as a sparse file.
    if hasattr(ser, "skip_data"):
        big = dict(sd)
        big["big"] = torch.empty(4_400_000_000, dtype=torch.uint8)
        big["c"] = torch.arange(3, dtype=torch.int64)
        with tempfile.TemporaryDirectory() as tmp:
            p = os.path.join(tmp, "big.pt")
            with ser.skip_data():
                torch.save(big, p)
            size = os.path.getsize(p)
            with zipfile.ZipFile(p) as zf:
                infos = zf.infolist()
                # Tail: from the first local header past the big record.
                tail_off = min(i.header_offset for i in infos
                               if i.header_offset > 0xFFFFFFFF)
                head_len = max(i.header_offset for i in infos
                               if i.header_offset < 0xFFFFFFFF) + 4096
            with open(p, "rb") as f:
                head = f.read(head_len)
                f.seek(tail_off)
                tail = f.read()
            assert size - tail_off < 4096 and not any(head[2048:])
            write(os.path.join(FIXTURES, "big_skipdata.head"), head.rstrip(b"\0"))
            write(os.path.join(FIXTURES, "big_skipdata.tail"), tail)
            write(os.path.join(FIXTURES, "big_skipdata.records.txt"),
                  ("%d %d\n" % (size, tail_off) + manifest(p)).encode())

    # 8. A real DCP file: each item of __0_0.distcp is a torch.save zip at
    # an offset recorded in .metadata; list "key offset length" next to it.
    try:
        import warnings
        import torch.distributed.checkpoint as dcp
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save({"w": sd["w"], "b": sd["b"]}, checkpoint_id=tmp)
            md = dcp.FileSystemReader(tmp).read_metadata()
            lines = []
            for idx, info in sorted(md.storage_data.items(),
                                    key=lambda kv: kv[1].offset):
                assert info.relative_path == "__0_0.distcp", info
                lines.append("%s %d %d\n" % (idx.fqn, info.offset, info.length))
            shutil.copyfile(os.path.join(tmp, "__0_0.distcp"),
                            os.path.join(FIXTURES, "dcp.distcp"))
            write(os.path.join(FIXTURES, "dcp.items.txt"), "".join(lines).encode())
    except Exception as e:  # DCP is optional for this module
        print("dcp fixture skipped: %r" % (e,), file=sys.stderr)


# ---------------------------------------------------------------------------
# Hand-crafted archives


def deflate(data):
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


def E(name, data=b"", method=0, **kw):
    """One entry. Optional keys override what build() writes:
    comp (stored bytes), crc, size, csize (central values), flags,
    lsig/lname/lmethod/lextra (local header), cd_lho, cd_sig,
    cd_zip64 (tuple of 'size','csize','lho' moved into a zip64 extra),
    cd_extra_pre (extra blocks before the zip64 one), cd_extra (raw)."""
    if isinstance(name, str):
        name = name.encode()
    d = dict(name=name, data=data, method=method)
    d.update(kw)
    return d


def build(entries, zip64=False, eocd=None, z64=None, loc=None, saturate=False,
          count=None):
    eocd = eocd or {}
    z64 = z64 or {}
    loc = loc or {}
    out = bytearray()
    cd = bytearray()
    for e in entries:
        data = e["data"]
        method = e["method"]
        comp = e.get("comp", deflate(data) if method == 8 else data)
        crc = e.get("crc", zlib.crc32(data))
        size = e.get("size", len(data))
        csize = e.get("csize", len(comp))
        flags = e.get("flags", 0x0800)
        lho = len(out)
        lname = e.get("lname", e["name"])
        lextra = e.get("lextra", b"")
        out += struct.pack("<IHHHHHIIIHH", e.get("lsig", LOCAL_SIG), 20, flags,
                           e.get("lmethod", method), 0, 0x21, crc,
                           min(csize, SAT32), min(size, SAT32),
                           len(lname), len(lextra))
        out += lname + lextra + comp

        fields = {"size": size, "csize": csize, "lho": e.get("cd_lho", lho)}
        z64f = e.get("cd_zip64", ())
        extra = bytearray(e.get("cd_extra_pre", b""))
        if z64f:
            body = b"".join(struct.pack("<Q", fields[k])
                            for k in ("size", "csize", "lho") if k in z64f)
            body = e.get("cd_zip64_body", body)
            extra += struct.pack("<HH", 1, len(body)) + body
        extra = bytes(e.get("cd_extra", extra))
        v = {k: (SAT32 if k in z64f else fields[k]) for k in fields}
        cd += struct.pack("<IHHHHHHIIIHHHHHII", e.get("cd_sig", CENTRAL_SIG),
                          0x031E, 20, flags, method, 0, 0x21, crc,
                          v["csize"], v["size"], len(e["name"]), len(extra),
                          0, 0, 0, 0, v["lho"])
        cd += e["name"] + extra

    n = len(entries) if count is None else count
    cd_off = len(out)
    out += cd
    if zip64:
        z64_off = len(out)
        out += struct.pack("<IQHHIIQQQQ", z64.get("sig", ZIP64_EOCD_SIG), 44,
                           0x031E, 45, 0, 0, z64.get("count", n),
                           z64.get("count", n), z64.get("cd_size", len(cd)),
                           z64.get("cd_off", cd_off))
        out += struct.pack("<IIQI", ZIP64_LOCATOR_SIG, 0,
                           loc.get("off", z64_off), loc.get("disks", 1))
    cnt = 0xFFFF if saturate else min(n, 0xFFFF)
    out += struct.pack("<IHHHHIIH", EOCD_SIG, eocd.get("disk", 0), 0,
                       eocd.get("count", cnt), eocd.get("count", cnt),
                       eocd.get("cd_size", SAT32 if saturate else len(cd)),
                       eocd.get("cd_off", SAT32 if saturate else cd_off), 0)
    return bytes(out)


HELLO = b"hello, zip\n"
TEXT = b"".join(b"line %d of a compressible record\n" % i for i in range(40))


def make_corpus():
    c = {}
    small = [E("top/a.txt", HELLO), E("top/b.txt", TEXT, 8), E("top/empty")]
    ok_small = build(small)
    c["ok_small.zip"] = ok_small
    # Zip64 end records plus central zip64 extras holding only the
    # saturated fields, after an unrelated extra block.
    ut = struct.pack("<HHBI", 0x5455, 5, 1, 0)
    c["ok_zip64_extra.zip"] = build([
        E("z/lho-only", HELLO, cd_zip64=("lho",)),
        E("z/all-three", TEXT, 8, cd_zip64=("size", "csize", "lho"),
          cd_extra_pre=ut),
        E("z/csize-only", TEXT, 8, cd_zip64=("csize",)),
    ], zip64=True, saturate=True)

    c["ok_no_entries.zip"] = build([])  # just an end record, 22 bytes
    c["empty.zip"] = b""
    c["not_zip.txt"] = b"this is not a zip archive, just text\n"
    c["eocd_truncated.zip"] = ok_small[:-5]
    c["eocd_missing.zip"] = ok_small[:ok_small.index(b"PK\x01\x02")]
    # EOCD says the directory is 10 bytes shorter: the last entry is cut.
    cd_len = len(ok_small) - 22 - ok_small.index(b"PK\x01\x02")
    c["cd_truncated.zip"] = build(small, eocd={"cd_size": cd_len - 10})
    c["cd_past_end.zip"] = build(small, eocd={"cd_size": cd_len + 10})
    c["cd_offset_outside.zip"] = build(small, eocd={"cd_off": 0x7FFFFFF0})
    c["cd_bad_sig.zip"] = build([E("a", HELLO, cd_sig=0x02014B51)])
    c["cd_trailing.zip"] = build([E("a", HELLO), E("b", HELLO)],
                                 eocd={"count": 1})
    c["count_mismatch.zip"] = build([E("a", HELLO)], eocd={"count": 100})
    # One entry with a long name but a count of 2: 2 * 46 bytes fit in the
    # directory, yet the first record leaves no room for the second.
    c["cd_count_high.zip"] = build([E("n" * 100, HELLO)], eocd={"count": 2})
    c["count_huge.zip"] = build([E("a", HELLO)], zip64=True, saturate=True,
                                z64={"count": 1 << 40})
    c["zip64_locator_outside.zip"] = build([E("a", HELLO)], zip64=True,
                                           loc={"off": 0xFFFFFFFFFF})
    c["zip64_bad_sig.zip"] = build([E("a", HELLO)], zip64=True,
                                   z64={"sig": 0x06064B51})
    c["zip64_size_lie.zip"] = build([E("a", HELLO)], zip64=True, saturate=True,
                                    z64={"cd_size": 1000})
    c["zip64_disagree.zip"] = build([E("a", HELLO)], zip64=True,
                                    z64={"cd_size": 1000})
    c["zip64_extra_short.zip"] = build([E("a", HELLO, cd_zip64=("lho",),
                                          cd_zip64_body=b"\0\0\0\0")])
    c["multidisk.zip"] = build([E("a", HELLO)], eocd={"disk": 1})
    c["name_nul.zip"] = build([E(b"a\0b", HELLO)])
    c["data_past_eof.zip"] = build([E("a", HELLO, size=0x100000,
                                      csize=0x100000)])
    c["data_over_cd.zip"] = build([E("a", HELLO, size=len(HELLO) + 20,
                                     csize=len(HELLO) + 20)])
    c["local_out_of_range.zip"] = build([E("a", HELLO, cd_lho=0x10000)])
    c["local_sig_bad.zip"] = build([E("a", HELLO, lsig=0x04034B51)])
    c["local_name_mismatch.zip"] = build([E("a", HELLO), E("b", HELLO,
                                                          lname=b"c")])
    c["local_method_mismatch.zip"] = build([E("a", HELLO, lmethod=8)])
    c["stored_size_mismatch.zip"] = build([E("a", HELLO, size=len(HELLO) - 1)])
    c["dup_name.zip"] = build([E("a", HELLO), E("a", TEXT)])
    # "b" lies entirely inside the data of "a", a classic overlap bomb.
    inner = build([E("b", HELLO)])
    inner_local = inner[:inner.index(b"PK\x01\x02")]
    ov = build([E("a", inner_local), E("b", HELLO, cd_lho=30 + 1)])
    c["overlap.zip"] = ov
    c["encrypted.zip"] = build([E("a", HELLO, flags=0x0801)])
    c["method_lzma.zip"] = build([E("a", HELLO, method=14, comp=HELLO)])
    zeros = bytes(4 << 20)
    c["bomb.zip"] = build([E("bomb", zeros, 8)])
    c["bomb_lying.zip"] = build([E("bomb", zeros, 8, size=100)])
    c["deflate_corrupt.zip"] = build([E("a", TEXT, 8, comp=b"\xff" * 16)])
    c["deflate_truncated.zip"] = build([E("a", TEXT, 8,
                                          comp=deflate(TEXT)[:40])])
    c["crc_bad.zip"] = build([E("a", HELLO), E("b", TEXT, 8,
                                              crc=zlib.crc32(TEXT) ^ 1)])
    for name, data in sorted(c.items()):
        write(os.path.join(CORPUS, name), data)


def main():
    make_corpus()
    make_fixtures()


if __name__ == "__main__":
    main()
