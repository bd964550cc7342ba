#!/usr/bin/env python3
"""symb.py SAMPLES BINARY [--top N] [--lines]: per-function (and per-line) sample counts of the
samples that fall inside BINARY's mappings."""
import sys, subprocess, collections, re, os
samples, binary = sys.argv[1], sys.argv[2]
top = int(sys.argv[sys.argv.index('--top') + 1]) if '--top' in sys.argv else 40
want_lines = '--lines' in sys.argv
name = os.path.basename(binary)
maps, rips = [], []
for line in open(samples):
    if line.startswith('maps '):
        p = line.split()
        if len(p) >= 7 and os.path.basename(p[6]) == name and int(p[3], 16) == 0:
            bias = int(p[1].split('-')[0], 16)
        if len(p) >= 7 and os.path.basename(p[6]) == name and 'x' in p[2]:
            lo, hi = (int(x, 16) for x in p[1].split('-'))
            maps.append((lo, hi, int(p[3], 16)))
    elif line.startswith('rip '):
        _, a, c = line.split()
        rips.append((int(a, 16), int(c)))
total = sum(c for _, c in rips)
# PT_LOAD: offset -> vaddr
loads = []
for l in subprocess.run(['readelf', '-lW', binary], capture_output=True, text=True).stdout.splitlines():
    l = l.split()
    if l and l[0] == 'LOAD':
        loads.append((int(l[1], 16), int(l[2], 16), int(l[4], 16)))
def vaddr(rip):
    for lo, hi, off in maps:
        if lo <= rip < hi:
            return rip - bias
    return None
inbin = [(vaddr(a), c) for a, c in rips]
inbin = [(v, c) for v, c in inbin if v is not None]
nb = sum(c for _, c in inbin)
addrs = sorted({v for v, _ in inbin})
out = subprocess.run(['addr2line', '-f', '-i', '-C', '-e', binary] + [hex(a) for a in addrs] if False else
                     ['addr2line', '-f', '-C', '-a', '-i', '-e', binary], input='\n'.join(hex(a) for a in addrs),
                     capture_output=True, text=True).stdout.splitlines()
# parse blocks: 0xaddr, then (func, file:line) pairs
info, cur = {}, None
i = 0
while i < len(out):
    l = out[i]
    if l.startswith('0x'):
        cur = int(l, 16); info[cur] = []; i += 1; continue
    func = l; loc = out[i + 1] if i + 1 < len(out) else '?'
    info[cur].append((func, loc)); i += 2
def short(f):
    f = re.sub(r'<[^<>]*>', '', f); f = re.sub(r'<[^<>]*>', '', f); return f[:110]
byfunc, byline, byaddr = collections.Counter(), collections.Counter(), collections.Counter()
for v, c in inbin:
    chain = info.get(v, [('?', '?')])
    outer = chain[-1][0]; inner = chain[0]
    byfunc[short(outer)] += c
    byline[(short(inner[0]), inner[1].split('/')[-1])] += c
    byaddr[v] += c
print(f'samples {total}, in {name}: {nb}')
for f, c in byfunc.most_common(top):
    print(f'{c:8d} {100*c/max(nb,1):5.1f}%  {f}')
if want_lines:
    print('--- lines (innermost inline frame)')
    for (f, l), c in byline.most_common(top):
        print(f'{c:8d} {100*c/max(nb,1):5.1f}%  {l:40s} {f}')
    print('--- addresses')
    for a, c in byaddr.most_common(top):
        print(f'{c:8d} {a:#x} {short(info.get(a,[("?","?")])[0][0])} {info.get(a,[("?","?")])[0][1].split("/")[-1]}')
