"""rmscore serve with timestamps at each hop of a unary Score (perf_counter, us): each hop's median over the
last 2,000 calls, written to $TRACE_JSON every 2 s. Started by drive.py (README.md)."""
import os, sys, time, threading, json, collections
import numpy as np
from rmscore.core import batcher as B, scoring as S
from rmscore.frontends import grpc_server as G
T = collections.defaultdict(list)
cur = {}
pc = time.perf_counter
orig_score = G.RewardModelServicer.Score
async def Score(self, request, context):
    t0 = pc(); cur['t0'] = t0
    r = await orig_score(self, request, context)
    t1 = pc(); T['handler_total'].append(t1 - t0); T['settle->return'].append(t1 - cur.get('settle', t1))
    return r
G.RewardModelServicer.Score = Score
orig_submit = B.Batcher.submit
def submit(self, job):
    cur['submit'] = pc(); T['entry->submit'].append(cur['submit'] - cur.get('t0', cur['submit']))
    r = orig_submit(self, job)
    if os.environ.get("YIELD_AFTER_SUBMIT"):
        time.sleep(0)
    return r
B.Batcher.submit = submit
orig_run = B.Batcher._run
def _run(self, b, model, lone=False):
    t = pc(); T['submit->run'].append(t - cur.get('submit', t)); cur['run'] = t
    wrapped = lambda ids, m: (cur.__setitem__('m0', pc()), model(ids, m), cur.__setitem__('m1', pc()))[1]
    r = orig_run(self, b, wrapped, lone)
    T['model'].append(cur['m1'] - cur['m0']); T['run->model'].append(cur['m0'] - t)
    return r
B.Batcher._run = _run
orig_answer = B.Batcher._answer
def _answer(self, answers):
    if not answers: return orig_answer(self, answers)
    cur['answer'] = pc(); T['model->answer'].append(cur['answer'] - cur.get('m1', cur['answer']))
    return orig_answer(self, answers)
B.Batcher._answer = _answer
orig_settle = S.settle
def settle(fut, outcome):
    t = pc(); T['answer->settle(loop)'].append(t - cur.get('answer', t)); cur['settle'] = t
    return orig_settle(fut, outcome)
S.settle = settle
def dump():
    while True:
        time.sleep(2)
        out = {k: (float(np.median(v[-2000:])) * 1e6, len(v)) for k, v in list(T.items())}
        open(os.environ['TRACE_JSON'], 'w').write(json.dumps(out))
threading.Thread(target=dump, daemon=True).start()
from rmscore.cli import main
sys.exit(main(sys.argv[1:]))
