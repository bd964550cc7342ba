import sys, statistics, collections
d = collections.defaultdict(list); order = []
for line in open(sys.argv[1]):
    p = line.split()
    if len(p) < 4: continue
    name, row, v = p[0], p[2], float(p[3].rstrip("ns"))
    if name not in order: order.append(name)
    d[(name, row)].append(v)
rows = sorted({k[1] for k in d})
for row in rows:
    print(row)
    for n in order:
        v = d.get((n, row))
        if v: print(f"  {n:10s} median {statistics.median(v):7.1f} ns  min {min(v):7.1f}  max {max(v):7.1f}  n={len(v)}")
