#!/usr/bin/env python3
"""Static instruction counts of a GPU kernel's loops, from its SASS: no GPU needed.

Usage:
  python3 scripts/sass-loops.py SASS KERNEL [--range LO:HI ...]
  python3 scripts/sass-loops.py --ncu CSV KERNEL [--per N]

SASS is the text `cuobjdump -sass` prints for the device image; KERNEL is the end of the
kernel's name (e.g. `gqa_decode_l640_1` for a kernel of decode_gqa.c's region, the
a 2-bit one; the line number changes with the source).  For every backward branch
the script prints the loop it closes: first and last address, instructions, and the most
frequent opcodes.  Each --range LO:HI (hex addresses) prints the same for [LO, HI), e.g. one
path of a loop body.

The device image of an offload build, as ptxas compiled it, taken out of the linked library:
  python3 scripts/kernel-regs.py BUILD/.libs/libkivi-omp.so.1 --cubin /tmp/img
  cuobjdump -sass /tmp/img.0.cubin > kernels.sass
cuobjdump ships with the CUDA toolkit, or in the PyPI wheel nvidia-cuda-cuobjdump
(`pip download nvidia-cuda-cuobjdump --no-deps`, then unzip).  The counts are per warp
instruction of one pass through the code, not executed totals: Nsight Compute's source page
gives those.

With --ncu, CSV is Nsight Compute's source page of a profiled run (`ncu --set full
--import-source yes -o R ...`, then `ncu -i R.ncu-rep --page source --csv --print-source sass`):
for every loop of the kernel whose name ends with KERNEL, the warp-instructions it executed
(divided by N, e.g. the 32-token groups the run read), its share of the stall samples, and its
most executed opcodes.
"""
import csv
import collections
import re
import signal
import sys


def kernel_instructions(path, name):
    """(address, text) of every instruction of the kernel whose name ends with name."""
    found, body = None, None
    for line in open(path):
        if "Function : " in line:
            body = [] if line.split("Function : ")[1].strip().endswith(name) else None
            if body is not None:
                found = body
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m and body is not None:
            body.append((int(m.group(1), 16), m.group(2)))
    return found


def opcode(text):
    words = text.split()
    op = words[1] if words[0].startswith("@") else words[0]  # skip a predicate
    return op.split(".")[0]


def summary(label, body):
    c = collections.Counter(opcode(t) for _, t in body)
    top = ", ".join(f"{k} {v}" for k, v in c.most_common(12))
    print(f"{label}: {len(body)} instructions: {top}")


def loop_start(a, text):
    """The target of the instruction at address a if it is a backward branch (it closes a loop)."""
    m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
    return int(m.group(1), 16) if m and int(m.group(1), 16) <= a else None


def ncu_loops(path, name, per):
    """Executed counts and stall samples of each loop, from an ncu source-page CSV."""
    body, ins = None, None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if row and row[0] == "Kernel Name":
                body = [] if row[1].endswith(name) else None
                if body is not None:
                    ins = body
            elif row and row[0] == "Address":
                col = {h: i for i, h in enumerate(row)}
            elif row and row[0].startswith("0x") and body is not None:
                body.append((int(row[0], 16), row[col["Source"]].strip(),
                             int(row[col["Instructions Executed"]] or 0),
                             int(row[col["Warp Stall Sampling (All Samples)"]] or 0)))
    if not ins:
        sys.exit(f"no kernel matching '{name}' in {path}")
    total, stalls = sum(x[2] for x in ins), sum(x[3] for x in ins) or 1
    print(f"{name}: {total / per:.0f} warp-instructions executed per {per} ({total} in all)")
    for a, t, n, _ in ins:
        lo = loop_start(a, t)
        if lo is not None and n:
            seg = [x for x in ins if lo <= x[0] <= a]
            c = collections.Counter()
            for x in seg:
                c[opcode(x[1])] += x[2]
            top = ", ".join(f"{k} {v / per:.0f}" for k, v in c.most_common(10))
            print(f"loop +{lo - ins[0][0]:#x}-+{a - ins[0][0]:#x}: "
                  f"{sum(x[2] for x in seg) / per:.0f} executed, "
                  f"{100 * sum(x[3] for x in seg) / stalls:.1f} % of the stall samples: {top}")


def main(argv):
    if len(argv) >= 4 and argv[1] == "--ncu":
        per = int(argv[5]) if len(argv) >= 6 and argv[4] == "--per" else 1
        return ncu_loops(argv[2], argv[3], per)
    if len(argv) < 3:
        sys.exit(__doc__)
    ins = kernel_instructions(argv[1], argv[2])
    if not ins:
        sys.exit(f"no kernel matching '{argv[2]}' in {argv[1]}")
    index = {a: i for i, (a, _) in enumerate(ins)}
    print(f"{argv[2]}: {len(ins)} instructions")
    for i, (a, t) in enumerate(ins):
        lo = loop_start(a, t)
        if lo is not None and lo in index:
            summary(f"loop {lo:#x}-{a:#x}", ins[index[lo]:i + 1])
    args = argv[3:]
    for k in range(0, len(args), 2):
        if args[k] != "--range" or k + 1 >= len(args):
            sys.exit(__doc__)
        lo, hi = (int(x, 16) for x in args[k + 1].split(":"))
        summary(f"range {lo:#x}-{hi:#x}", [(a, t) for a, t in ins if lo <= a < hi])


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet when piped into head
    main(sys.argv)
