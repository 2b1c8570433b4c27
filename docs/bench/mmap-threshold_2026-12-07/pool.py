import re, sys, collections
from rmscore_tools.stats import mean_ci
rows = collections.defaultdict(lambda: collections.defaultdict(dict))
for f in sys.argv[1:]:
    kind = None
    for line in open(f):
        m = re.match(r"^(\S+): A ", line)
        if m: kind = m.group(1) + "@" + f; continue
        m = re.match(r"^(\d+) (A|B): c1 ([\d.]+) seq/s p50 ([\d.]+) ms cpu ([\d.]+) ms/req \| c64 ([\d.]+) seq/s cpu ([\d.]+)", line)
        if m:
            rows[kind][int(m.group(1))][m.group(2)] = list(map(float, m.groups()[2:]))
pooled = collections.defaultdict(lambda: collections.defaultdict(list))
for kind, rounds in rows.items():
    k = kind.split("@")[0]
    for r, ab in rounds.items():
        for i, name in enumerate(["c1", "p50", "cpu1", "c64", "cpu64"]):
            pooled[k][name].append(ab["B"][i] / ab["A"][i])
for k, figs in pooled.items():
    print(k, "n=%d" % len(figs["c1"]), "  ".join(f"{n} {mean_ci(v).fmt()}" for n, v in figs.items()))
