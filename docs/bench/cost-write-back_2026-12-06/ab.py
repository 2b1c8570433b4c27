"""Write-back A/B: a cost table measured while the CPU was busy (stale) against the same table after
one load run refined it and the server wrote it back. Same load, alternating arms, fresh starts."""
import json, multiprocessing as mp, pathlib, random, shutil, statistics, sys, threading, time
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tools"))
from rmscore_tools import launch
from rmscore_tools.caller import Caller
from rmscore_tools.stats import mean_ci

KIND = sys.argv[1]; REPS = int(sys.argv[2]); SECS = float(sys.argv[3])
W = pathlib.Path(f"/tmp/rmscore-wb-{KIND}"); shutil.rmtree(W, True); W.mkdir(parents=True)

def hog(stop):
    while not stop.is_set():
        sum(range(10000))

rng = random.Random(7)
LENS = [max(16, min(256, int(rng.lognormvariate(4.56, 0.6)))) for _ in range(4000)]

def load(server, secs, conc=8):
    done = [0]; stop = time.monotonic() + secs; lock = threading.Lock()
    def worker(k):
        c = Caller.to(server); i = k
        while time.monotonic() < stop:
            n = LENS[i % len(LENS)]; i += conc
            c.score_ids([[101] + [2000 + (j % 500) for j in range(n - 2)] + [102]])
            with lock: done[0] += 1
        c.close()
    ts = [threading.Thread(target=worker, args=(k,)) for k in range(conc)]
    t0 = time.monotonic(); [t.start() for t in ts]; [t.join() for t in ts]
    return done[0] / (time.monotonic() - t0)

def cell(d, b=1, l=128):
    f = next(d.glob("*.json")); t = json.loads(f.read_text())["table"]
    return t["cost_us"][t["batch_sizes"].index(b)][t["lengths"].index(l)] / 1e3

def start(d):
    return launch.start(KIND, cost_profile_dir=str(d))

# stale: measured under two busy processes
stale = W / "stale"; stale.mkdir()
ev = mp.Event(); hogs = [mp.Process(target=hog, args=(ev,)) for _ in range(2)]; [h.start() for h in hogs]
s = start(stale); ev.set(); [h.join() for h in hogs]; s.stop()
# quiet: measured on the idle machine (the truth proxy)
quiet = W / "quiet"; quiet.mkdir(); s = start(quiet); s.stop()
# refined: the stale table after one load run, written back once idle
ref = W / "refined"; shutil.copytree(stale, ref); s = start(ref); load(s, 2 * SECS); time.sleep(3); s.stop()
doc = json.loads(next(ref.glob("*.json")).read_text())
print(f"{KIND}: 1x128 cost ms: stale {cell(stale):.1f}, quiet {cell(quiet):.1f}, refined {cell(ref):.1f} "
      f"(refined_batches {doc.get('refined_batches')}); 8x128: {cell(stale,8):.1f} / {cell(quiet,8):.1f} / {cell(ref,8):.1f}", flush=True)
res = {"stale": [], "refined": []}
for r in range(REPS):
    for arm in (("stale", "refined") if r % 2 == 0 else ("refined", "stale")):
        d = W / f"run-{r}-{arm}"; shutil.copytree(stale if arm == "stale" else ref, d)
        s = start(d); x = load(s, SECS); s.stop(); res[arm].append(x)
        print(f"  rep {r} {arm}: {x:.1f} seq/s", flush=True)
ratios = [a / b for a, b in zip(res["refined"], res["stale"])]
print(f"{KIND}: refined/stale throughput over the first {SECS:.0f} s after start, C=8: {mean_ci(ratios).fmt()}  "
      f"(stale {statistics.mean(res['stale']):.1f}, refined {statistics.mean(res['refined']):.1f} seq/s)", flush=True)
