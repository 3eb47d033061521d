#!/usr/bin/env python3
"""Registers and stack frame of each GPU kernel in a linked offload library or executable,
read from its embedded device image (cubin): no GPU and no cuobjdump needed.

Usage:
  python3 scripts/kernel-regs.py FILE [SUBSTRING] [--cubin PREFIX]

FILE is e.g. BUILD/.libs/libkivi-omp.so.1 of an `--enable-offload=nvptx` build; SUBSTRING keeps
the kernels whose name contains it (e.g. `gqa_decode`).  For every CUDA ELF image found in FILE
it prints, per kernel: registers per thread (the image's .nv.info attribute EIATTR_REGCOUNT, as
ptxas allocated them), the frame size in bytes (EIATTR_FRAME_SIZE; nonzero means a stack, e.g.
spills or a local array) and the name.  Blocks per SM by registers: 65536 / (threads x
registers, rounded up to 8), so 128 threads at 128 registers allow 4, at 129..168 3.

--cubin PREFIX also writes image K, whole (sections and program headers), to PREFIX.K.cubin,
for `cuobjdump -sass PREFIX.0.cubin` (scripts/sass-loops.py reads that listing).  cuobjdump
warns that it switches to the old format: a build's images carry the older ELF header
(tools/kivi-cubin-fix.c), and the listing is complete.  FILE may be such a cubin too.
"""
import struct
import sys

EM_CUDA = 190
EIATTR_FRAME_SIZE, EIATTR_REGCOUNT = 0x11, 0x2F


def images(data):
    """The CUDA ELF images inside data: (offset, bytes)."""
    i = data.find(b"\x7fELF")
    while i >= 0:
        if data[i + 4] == 2 and struct.unpack_from("<H", data, i + 0x12)[0] == EM_CUDA:
            phoff, shoff = struct.unpack_from("<QQ", data, i + 0x20)
            phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, i + 0x36)
            end = i + max(shoff + shentsize * shnum, phoff + phentsize * phnum)  # the tables come last
            if i < end <= len(data):
                yield i, data[i:end]
        i = data.find(b"\x7fELF", i + 4)


def kernels(img):
    """{symbol name: {attribute: value}} from the image's .nv.info section."""
    shoff, = struct.unpack_from("<Q", img, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", img, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", img, shoff + k * shentsize) for k in range(shnum)]

    def cstr(off):
        return img[off:img.index(b"\0", off)].decode()

    names = [cstr(secs[shstrndx][4] + s[0]) for s in secs]
    symtab, strtab = secs[names.index(".symtab")], secs[names.index(".strtab")][4]
    syms = [cstr(strtab + struct.unpack_from("<I", img, o)[0])
            for o in range(symtab[4], symtab[4] + symtab[5], 24)]
    out = {}
    info = secs[names.index(".nv.info")]
    o, end = info[4], info[4] + info[5]
    while o < end:
        fmt, attr = img[o], img[o + 1]
        if fmt == 4:  # EIFMT_SVAL: a 16-bit size and a payload
            size, = struct.unpack_from("<H", img, o + 2)
            if attr in (EIATTR_FRAME_SIZE, EIATTR_REGCOUNT) and size >= 8:
                sym, val = struct.unpack_from("<II", img, o + 4)
                out.setdefault(syms[sym], {})[attr] = val
            o += 4 + size
        elif fmt == 3:  # EIFMT_HVAL: a 16-bit value
            o += 4
        elif fmt == 2:  # EIFMT_BVAL
            o += 3
        else:  # EIFMT_NVAL
            o += 2
    return out


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) >= 2 else 2
    args, prefix = sys.argv[1:], None
    if "--cubin" in args:
        k = args.index("--cubin")
        if k + 1 >= len(args):
            print("--cubin needs a PREFIX", file=sys.stderr)
            return 2
        prefix = args[k + 1]
        del args[k:k + 2]
    if not args:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    data = open(args[0], "rb").read()
    want = args[1] if len(args) > 1 else ""
    found = 0
    for off, img in images(data):
        if prefix is not None:
            with open("%s.%d.cubin" % (prefix, found), "wb") as f:
                f.write(img)
        found += 1
        print("image at 0x%x (%d bytes)" % (off, len(img)))
        for name, attrs in sorted(kernels(img).items()):
            if want in name:
                print("%4s regs  %4s frame  %s" % (attrs.get(EIATTR_REGCOUNT, "-"), attrs.get(EIATTR_FRAME_SIZE, "-"), name))
    if not found:
        print("no CUDA device image in %s" % args[0], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
