#!/usr/bin/env python3
"""Compares the device code of two offload builds kernel by kernel, without a GPU.

Usage:
  python3 scripts/sass-compare.py A B [SUBSTRING]

A and B are linked offload libraries (BUILD/.libs/libkivi-omp.so.1) or `cuobjdump -sass`
listings of them.  For a library the script extracts its device image (kernel-regs.py --cubin)
and lists it with cuobjdump (on PATH, or $CUOBJDUMP; cuobjdump needs nvdisasm beside it or on
PATH; both ship with the CUDA toolkit and as the PyPI wheels nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm).

A kernel's name is taken without the offload prefix (device and file ids) and without its
`_lNNN` line tag, so a kernel moved to another file or line still pairs with itself; kernels
whose names then collide are told apart by their order in the listing (#2, #3, ...).  Kernels
whose names pair with none (a region moved into another function) are paired by their code
and reported "KIND as NAME_IN_B".  Addresses
are dropped and branch targets replaced by X.  Each kernel is then one of:

  same       the same instructions in the same order, registers included;
  registers  the same instructions in the same order but for register numbers;
  params     (renamed kernels only) the same but for registers and the offsets of the
             kernel's parameters (a region whose captured variables come in another order);
  reordered  the same number of each opcode in another order (scheduling);
  different  other instructions: the counts of A and B and the opcodes that differ most.

SUBSTRING keeps the kernels whose name contains it.  Exit status 0 when every kernel is `same`
or `registers`, 1 otherwise (2 on a usage error).
"""
import collections
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def listing(path, tmp, tag):
    """The SASS text of path (a library, or already a listing)."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head != b"\x7fELF":
        return open(path, errors="replace").read()
    prefix = os.path.join(tmp, tag)
    subprocess.run([sys.executable, os.path.join(HERE, "kernel-regs.py"), path, "--cubin", prefix],
                   check=True, stdout=subprocess.DEVNULL)
    tool = os.environ.get("CUOBJDUMP", "cuobjdump")
    out = subprocess.run([tool, "-sass", prefix + ".0.cubin"], check=True, capture_output=True, text=True)
    return out.stdout


def kernels(text):
    """{name: [instruction, ...]} with names and instructions normalized (see the top)."""
    result, seen, cur = {}, collections.Counter(), None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            name = re.sub(r"^__omp_offloading_[0-9a-f]+_[0-9a-f]+_", "", m.group(1))
            name = re.sub(r"_l\d+", "", name)
            seen[name] += 1
            cur = name if seen[name] == 1 else "%s#%d" % (name, seen[name])
            result[cur] = []
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;?\s*(/\*.*\*/)?\s*$", line)
        if cur is not None and m:
            ins = m.group(1).rstrip(" ;")
            if re.search(r"\b(BRA|BSSY|CALL|BRX|JMP)\b", ins):
                ins = re.sub(r"0x[0-9a-f]+", "X", ins)
            result[cur].append(ins)
    return result


def opcode(ins):
    return re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0]


def unregister(ins):
    return re.sub(r"\bU?[RPB][0-9]+\b", "r", ins)


def unparam(ins):
    return re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[param]", ins)


def main(argv):
    if len(argv) not in (3, 4):
        sys.stderr.write(__doc__)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        ka, kb = (kernels(listing(p, tmp, t)) for p, t in ((argv[1], "a"), (argv[2], "b")))
    sub = argv[3] if len(argv) == 4 else ""
    names = sorted(n for n in set(ka) | set(kb) if sub in n)
    tally, worst = collections.Counter(), 0
    # kernels whose names pair with none (a region moved into another function): paired by
    # their code, identical first, then but for register numbers, then but for the kernel
    # parameters' offsets (a region whose captured variables come in another order)
    only_a = [n for n in names if n not in kb]
    only_b = [n for n in names if n not in ka]
    for key, kind in ((lambda x: x, "same"), (lambda x: [unregister(i) for i in x], "registers"),
                      (lambda x: [unparam(unregister(i)) for i in x], "params")):
        for na in list(only_a):
            nb = next((m for m in only_b if key(kb[m]) == key(ka[na])), None)
            if nb is None:
                continue
            print("%-44s %-10s as %s" % (na, kind, nb))
            only_a.remove(na)
            only_b.remove(nb)
            tally[kind + " (renamed)"] += 1
            worst = worst if kind != "params" else 1
    for n in names:
        if n not in ka or n not in kb:
            if n in only_a or n in only_b:
                print("%-44s only in %s, %d instructions" % (n, "B" if n not in ka else "A",
                                                             len(kb[n] if n not in ka else ka[n])))
                tally["only in one"] += 1
                worst = 1
            continue
        a, b = ka[n], kb[n]
        if a == b:
            kind = "same"
        elif [unregister(x) for x in a] == [unregister(x) for x in b]:
            kind = "registers"
        else:
            ca, cb = collections.Counter(map(opcode, a)), collections.Counter(map(opcode, b))
            kind = "reordered" if ca == cb else "different"
            worst = 1
            diff = sorted(((cb[o] - ca[o], o) for o in set(ca) | set(cb) if ca[o] != cb[o]), key=lambda x: -abs(x[0]))
            detail = ", ".join("%s %+d" % (o, d) for d, o in diff[:6])
            print("%-44s %-10s %5d -> %5d instructions%s" % (n, kind, len(a), len(b), "; " + detail if detail else ""))
        tally[kind] += 1
    print("kernels: " + ", ".join("%d %s" % (v, k) for k, v in sorted(tally.items())))
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv))
