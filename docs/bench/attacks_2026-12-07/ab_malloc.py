"""PYTHONMALLOC=pymalloc (arm A) against PYTHONMALLOC=malloc (arm B) on one Python kind (argv: rounds, kind):
rmscore_tools.bench.ab_env with these two arms. The outputs beside this file (ab_malloc_KIND.txt) came from
this script's first form, which printed the same figures as "malloc/pymalloc". docs/bench/attacks_2026-12-07/README.md."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tools"))
from rmscore_tools.bench import ab_env  # noqa: E402

rounds = sys.argv[1] if len(sys.argv) > 1 else "5"
kind = sys.argv[2] if len(sys.argv) > 2 else "py-http-onnxruntime"
sys.exit(ab_env.main(["--kind", kind, "--rounds", rounds, "--a", "PYTHONMALLOC=pymalloc", "--b", "PYTHONMALLOC=malloc"]))
