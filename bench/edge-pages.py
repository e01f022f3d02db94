#!/usr/bin/env python3
"""Resident pages of a running process's binary, by ELF section and by crate, and its other
resident mappings (heap, arenas, stacks).

  bench/edge-pages.py PID UNSTRIPPED_ELF [--top N] [--symbols] [--lib NAME=ARCHIVE.a ...]
  INSPECT="python3 bench/edge-pages.py" ...  # from bench/edge-footprint.sh: PID comes last,
                                             # so give the ELF etc. through EDGE_PAGES_ARGS

Reads /proc/PID/maps and /proc/PID/pagemap (bit 63: present; bit 61: file page, 0 = a private
copy, i.e. anonymous), maps each resident page of the binary's mappings to the unstripped
build's sections and symbols (same layout: compare `readelf -S`), and splits every page's
4 KiB over the symbols in it (bytes not covered by a symbol count for the section). C symbols
are credited to the archive (--lib) that defines them. Reads /proc/PID/pagemap: run it as the
process's user.
"""
import bisect, collections, os, re, shlex, struct, subprocess, sys

argv = sys.argv[1:]
if os.environ.get("EDGE_PAGES_ARGS"):
    argv = [argv[-1]] + shlex.split(os.environ["EDGE_PAGES_ARGS"]) + argv[:-1]
sys.argv = [sys.argv[0]] + argv
pid, elf = sys.argv[1], sys.argv[2]
top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 25
PAGE = os.sysconf("SC_PAGE_SIZE")
exe = os.path.realpath(f"/proc/{pid}/exe")

def run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout

# PT_LOAD segments: (offset, vaddr, filesz)
loads = []
for line in run("readelf", "-lW", elf).splitlines():
    p = line.split()
    if p and p[0] == "LOAD":
        loads.append((int(p[1], 16), int(p[2], 16), int(p[4], 16)))
sections = []
for m in re.finditer(r"\]\s+(\S+)\s+\S+\s+([0-9a-f]{16})\s+([0-9a-f]+)\s+([0-9a-f]+)\s+\S+\s+(\S*A\S*)", run("readelf", "-SW", elf)):
    name, addr, size = m.group(1), int(m.group(2), 16), int(m.group(4), 16)
    if addr:
        sections.append((addr, addr + size, name))
sections.sort()

def section_of(v):
    for a, b, n in sections:
        if a <= v < b:
            return n
    return "(between sections)"

# symbols with sizes, demangled
syms = []
for line in run("nm", "-C", "-S", "-n", "--defined-only", elf).splitlines():
    p = line.split(" ", 3)
    if len(p) == 4 and len(p[0]) == 16 and len(p[1]) == 16:
        syms.append((int(p[0], 16), int(p[1], 16), p[2], p[3]))
syms.sort()
starts = [s[0] for s in syms]

# C symbols: which archive defines them (--lib NAME=path.a, repeatable)
c_owner = {}
for i, arg in enumerate(sys.argv):
    if arg == "--lib":
        lib, path = sys.argv[i + 1].split("=", 1)
        for line in run("nm", "--defined-only", path).splitlines():
            p = line.split()
            if len(p) == 3:
                c_owner.setdefault(p[2], lib)

def crate(name):
    n = name
    while n.startswith("<"):
        n = n[1:]
    n = n.lstrip("&*").replace("mut ", "").replace("dyn ", "")
    if "::" not in n or n.startswith("_"):
        return c_owner.get(name.split("@")[0], "other (C, not found in --lib)")
    return n.split("::", 1)[0].split("<", 1)[0]

maps = []
for line in open(f"/proc/{pid}/maps"):
    p = line.split()
    if len(p) >= 6 and p[5] == exe:
        a, b = (int(x, 16) for x in p[0].split("-"))
        maps.append((a, b, int(p[2], 16), p[1]))
by_section = collections.Counter()
by_section_anon = collections.Counter()
by_crate = collections.Counter()
by_symbol = collections.Counter()
total = anon = 0
with open(f"/proc/{pid}/pagemap", "rb") as pm:
    for a, b, off, perms in maps:
        pm.seek(a // PAGE * 8)
        data = pm.read((b - a) // PAGE * 8)
        for i in range((b - a) // PAGE):
            e = struct.unpack_from("<Q", data, i * 8)[0]
            if not e >> 63 & 1:
                continue
            fo = off + i * PAGE
            v = None
            for po, pv, pf in loads:
                if po <= fo < po + max(pf, 1) + PAGE:
                    v = pv + fo - po
                    break
            if v is None:
                continue
            total += 1
            is_anon = not (e >> 61 & 1)
            anon += is_anon
            lo, hi = v, v + PAGE
            # split the page's bytes over sections, then symbols
            covered = collections.Counter()
            j = max(bisect.bisect_right(starts, lo) - 1, 0)
            k = j
            while k < len(syms) and syms[k][0] < hi:
                s, z, t, n = syms[k]
                if z and s + z > lo:
                    o = min(hi, s + z) - max(lo, s)
                    if o > 0:
                        covered[n] += o
                k += 1
            used = 0
            for n, o in covered.items():
                o = min(o, PAGE - used)
                if o <= 0:
                    break
                used += o
                by_crate[crate(n)] += o
                by_symbol[n] += o
            sec_bytes = collections.Counter()
            for sa, sb, sn in sections:
                o = min(hi, sb) - max(lo, sa)
                if o > 0:
                    sec_bytes[sn] += o
            if not sec_bytes:
                sec_bytes["(between sections)"] = PAGE
            scale = PAGE / sum(sec_bytes.values())
            for sn, o in sec_bytes.items():
                by_section[sn] += o * scale
                if is_anon:
                    by_section_anon[sn] += o * scale
            if used < PAGE:
                by_crate[f"[{section_of(lo)} unnamed]"] += PAGE - used

print(f"binary {exe}: {total * PAGE // 1024} KiB resident in its mappings, of which {anon * PAGE // 1024} KiB private copies (anonymous)")
print("\nby section (KiB resident, of it anonymous):")
for n, b in sorted(by_section.items(), key=lambda x: -x[1]):
    print(f"  {b / 1024:8.0f} {by_section_anon[n] / 1024:6.0f}  {n}")
print("\nby crate (KiB):")
for n, b in by_crate.most_common(top):
    print(f"  {b / 1024:8.0f}  {n}")
if "--symbols" in sys.argv:
    print("\nby symbol (KiB):")
    for n, b in by_symbol.most_common(top):
        print(f"  {b / 1024:8.1f}  {n[:150]}")

print("\nresident mappings (KiB: rss, anonymous, size):")
cur = None
rows = []
for line in open(f"/proc/{pid}/smaps"):
    p = line.split()
    if len(p) >= 5 and "-" in p[0] and not p[0].endswith(":"):
        a, b = (int(x, 16) for x in p[0].split("-"))
        cur = {"perms": p[1], "name": p[5] if len(p) > 5 else "", "size": (b - a) // 1024}
        rows.append(cur)
    elif p and p[0] in ("Rss:", "Anonymous:"):
        cur[p[0][:-1]] = int(p[1])
for r in rows:
    if r.get("Rss"):
        print(f"  {r['Rss']:6} {r['Anonymous']:6} {r['size']:8} {r['perms']} {r['name']}")
