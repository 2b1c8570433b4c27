"""rmscore's verl reward function loaded and called by verl 0.9.1 itself, from the command line in
docs/frameworks/verl.md (issue 28, verl).

verl 0.9.1 comes from PyPI, installed with `--no-deps` into .cache/verl-0.9.1 (git ignores .cache/),
together with only what its config loading, reward workers and Ray need beside this venv (VERL_REQS,
every one pinned): verl's base requirements pull torch and, through its extras, CUDA builds of vLLM,
SGLang and flash-attn, none of which the reward path imports. Everything else verl imports on that
path (torch 2.13.0 CPU, transformers 5.24.0, numpy, pandas, datasets) is this venv's: transformers
is newer than verl's declared `<5.11`, which only its tokenizer loading touches here. The first run
downloads about 75 MB (ray is most of it); later runs reuse the directory.

frameworks_verl_driver.py runs in a child process (verl and Ray set process-wide logging, event
loops and environment) and does what verl does:
- `python -m verl.trainer.main_ppo <the docs' overrides> --cfg job`: verl's own entry point, so
  Hydra composes verl's packaged ppo_trainer.yaml from exactly the documented command line;
- `RewardLoopWorker(config)` and its `compute_score_batch`: the reward worker of verl's reward loop,
  which loads the function through `load_reward_manager` / `get_custom_reward_fn` and calls it
  through the naive reward manager, once per sample;
- with Ray: `RewardLoopManager(config).compute_rm_score(batch)` on a local Ray cluster started
  with the runtime environment verl's run_ppo builds, so the reward worker is a Ray actor that sees
  only what the runtime environment carries ($RMSCORE_TARGET from the documented override).
The scores are checked against the server's own answer and against ONNX Runtime directly, for the
text verl decoded.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from test_client import GRPC_KINDS, HTTP_KIND, assert_scores, local_tokenizer, ort_scores, shared_server

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "frameworks" / "verl.md"
DRIVER = pathlib.Path(__file__).with_name("frameworks_verl_driver.py")
VERL_VERSION = "0.9.1"
# verl itself, and what its reward path imports that this venv lacks (checked by importing
# verl.trainer.main_ppo, verl.experimental.reward_loop and starting a Ray actor). Pinned, so every
# run loads the same code; the directory is reinstalled when this list changes.
VERL_REQS = [
    f"verl=={VERL_VERSION}", "ray==2.60.0", "hydra-core==1.3.8", "omegaconf==2.3.0", "antlr4-python3-runtime==4.9.3",
    "tensordict==0.10.0", "pyvers==0.1.0", "codetiming==1.4.0", "cloudpickle==3.1.3", "orjson==3.13.0",
    "importlib-metadata==10.2.0", "zipp==4.1.2", "jsonschema==4.26.0", "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0", "rpds-py==2026.9.1", "attrs==26.1.0", "aiohttp==3.14.5", "aiohappyeyeballs==2.7.1",
    "aiosignal==1.4.0", "frozenlist==1.8.0", "multidict==7.2.1", "propcache==0.5.4", "yarl==1.25.1",
]
SITE = ROOT / ".cache" / f"verl-{VERL_VERSION}"
HOST = "10.0.0.5:50051"  # the placeholder targets in the docs' command lines: gRPC, and the FastAPI URL
HTTP_URL = "http://10.0.0.5:8000"
POLICY_TOKENIZER = ROOT / "models" / "default" / "hf"  # stands in for the policy model verl decodes with

PROMPTED = [  # (extra_info as verl's GSM8K preprocessing writes it, response)
    ({"split": "train", "index": 0, "answer": "4", "question": "What is 2 + 2?"}, "It is 4."),
    ({"split": "train", "index": 1, "answer": "7", "question": "Name a prime number."}, "Seven."),
]
NO_PROMPT = [  # verl's full_hh_rlhf preprocessing: extra_info holds split and index only
    ({"split": "train", "index": 2}, "Rayleigh scattering makes it blue."),
    ({"split": "train", "index": 3}, "I am not sure."),
]


def sample(info: dict, response: str, source: str = "openai/gsm8k") -> dict:
    return {"data_source": source, "ground_truth": info.get("answer"), "extra_info": info, "response": response,
            "prompt_text": info.get("question") or info.get("q")}


def verl_site() -> pathlib.Path:
    """verl 0.9.1 and VERL_REQS, installed once with --no-deps (pip, from the configured index)."""
    stamp = SITE / "requirements.txt"
    if stamp.is_file() and stamp.read_text().split() == VERL_REQS:
        return SITE
    SITE.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".verl-{VERL_VERSION}-", dir=SITE.parent))
    try:
        p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--prefer-binary",
                            "--no-cache-dir", "--disable-pip-version-check", "--target", str(tmp), *VERL_REQS],
                           capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, f"pip install --no-deps verl=={VERL_VERSION} failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
        (tmp / "requirements.txt").write_text("\n".join(VERL_REQS) + "\n")
        shutil.rmtree(SITE, ignore_errors=True)
        tmp.rename(SITE)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return SITE


def doc_command_lines() -> list[list[str]]:
    """The overrides of each `python -m verl.trainer.main_ppo` command line in docs/frameworks/verl.md."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S):
        if "verl.trainer.main_ppo" not in block:
            continue
        words = shlex.split(block.replace("\\\n", " "))
        args = words[words.index("verl.trainer.main_ppo") + 1:]
        lines.append([a for a in args if a != "..."])
    return lines


def docs_line(with_arg: str) -> list[str]:
    """The one documented command line with this argument (the target's placeholder included)."""
    (line,) = [ln for ln in doc_command_lines() if with_arg in ln]
    return line


def with_target(overrides: list[str], target: str) -> list[str]:
    return [a.replace(HTTP_URL, target).replace(HOST, target) for a in overrides]


@pytest.fixture(scope="module")
def target() -> str:
    return shared_server(GRPC_KINDS[0]).target


@pytest.fixture(scope="module")
def verl_run(target, tmp_path_factory):
    """One child process: every run below through verl 0.9.1's own code; what it returned and logged."""
    site = verl_site()
    rpc_line = docs_line(f"+reward.custom_reward_function.reward_kwargs.target={HOST}")
    http_line = docs_line(f"+reward.custom_reward_function.reward_kwargs.target={HTTP_URL}")
    ray_line = docs_line(f"+ray_kwargs.ray_init.runtime_env.env_vars.RMSCORE_TARGET={HOST}")
    policy = [f"actor_rollout_ref.model.path={POLICY_TOKENIZER}"]
    docs = with_target(rpc_line, target) + policy
    out = tmp_path_factory.mktemp("verl") / "out.json"
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short
    runs = {
        "docs": {"overrides": docs, "samples": [sample(i, r) for i, r in PROMPTED]
                 + [sample(i, r, "Dahoas/full-hh-rlhf") for i, r in NO_PROMPT]},
        "docs_async": {"overrides": [a.replace("name=compute_score", "name=compute_score_async") for a in docs],
                       "samples": [sample(i, r) for i, r in PROMPTED]},
        "http": {"overrides": with_target(http_line, shared_server(HTTP_KIND).base_url) + policy,
                 "samples": [sample(i, r) for i, r in PROMPTED]},
        "prompt_key": {"overrides": docs + ["+reward.custom_reward_function.reward_kwargs.prompt_key=q"],
                       "samples": [sample({"index": 0, "q": PROMPTED[0][0]["question"]}, PROMPTED[0][1])]},
        "refuse": {"overrides": docs + ["+reward.custom_reward_function.reward_kwargs.missing_prompt=error"],
                   "samples": [sample(*NO_PROMPT[0], "Dahoas/full-hh-rlhf")]},
        "no_plus": {"overrides": [a.removeprefix("+") for a in docs]},
        "legacy": {"overrides": [a.removeprefix("reward.") for a in docs if a.startswith("reward.")]},
        "ray": {"ray": True, "samples": [sample(i, r) for i, r in PROMPTED],
                "overrides": with_target(ray_line, target) + policy + [
                    "reward.num_workers=1", "ray_kwargs.ray_init.num_cpus=1",
                    "+ray_kwargs.ray_init.include_dashboard=false", f"+ray_kwargs.ray_init._temp_dir={ray_tmp}"]},
    }
    env = {k: v for k, v in os.environ.items() if k not in ("RMSCORE_TARGET", "HYDRA_FULL_ERROR")}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")])),
               RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", TOKENIZERS_PARALLELISM="false")
    t0 = time.monotonic()
    try:
        for attempt in (1, 2):
            p = subprocess.run([sys.executable, str(DRIVER)], input=json.dumps({"out": str(out), "runs": runs}),
                               capture_output=True, text=True, timeout=400, env=env,
                               cwd=tmp_path_factory.mktemp("cwd"))
            # Ray waits a fixed 30 s for its raylet to register (ray/_private/node.py); on 2 loaded cores
            # it took longer once in a CI run (2026-12-05), in ray.init, before any verl or rmscore code
            # ran. Ray's own start is not what this checks: the driver (whose exit takes Ray's processes
            # with it) runs once more, and a second such failure fails the test.
            if p.returncode == 0 or "timed out during startup" not in p.stderr or attempt == 2:
                break
            print(f"verl driver: Ray's node start timed out; running it once more:\n{p.stderr[-1500:]}")
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert p.returncode == 0, f"verl driver failed:\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    got = json.loads(out.read_text())
    print(f"verl {VERL_VERSION} driver: {time.monotonic() - t0:.1f} s (import {got['import_seconds']} s; "
          + ", ".join(f"{k} {v['seconds']} s" for k, v in got["runs"].items()) + ")")
    assert got["verl_version"] == VERL_VERSION
    return got["runs"], p.stderr


def references(target: str, pairs: list[tuple[str | None, str]]) -> list[float]:
    """ONNX Runtime's score of each (prompt or None, response) as the server's model encodes it, after
    checking that the server itself answers the same for the prompted ones."""
    tok = local_tokenizer()
    want = ort_scores([(tok.encode(p, r) if p is not None else tok.encode(r)).ids for p, r in pairs])
    from rmscore_client import RewardClient

    with RewardClient(target) as c:
        prompted = [i for i, (p, _) in enumerate(pairs) if p is not None]
        if prompted:
            own = c.score_texts([pairs[i][0] for i in prompted], [pairs[i][1] for i in prompted]).scores
            assert_scores(list(own), [want[i] for i in prompted])
    return want


def test_docs_command_line_is_what_verl_loads(verl_run):
    runs, _ = verl_run
    assert runs["docs"]["reward"]["path"] == "pkg://rmscore_client.adapters.verl"
    assert runs["docs"]["reward"]["name"] == "compute_score"
    assert set(runs["docs"]["reward"]["reward_kwargs"]) == {"target"}
    # Without the leading + Hydra refuses: reward_kwargs is in none of verl's default configs.
    err = runs["no_plus"]["compose_error"]
    assert "Key 'reward_kwargs' is not in struct" in err and "+reward.custom_reward_function.reward_kwargs" in err
    # verl 0.9.1's main_ppo reads only reward.custom_reward_function: the top-level block of earlier
    # versions composes, but no custom function is loaded from it (verl falls back to its own scorers).
    assert runs["legacy"]["reward"]["path"] is None and runs["legacy"]["custom_reward_fn_loaded"] is False


def test_verl_reward_worker_scores_as_the_server_does(verl_run, target):
    """verl's reward worker, on the docs' command line: prompt from extra_info, the sample without
    a prompt scored as its response alone, and what verl logs named after rmscore's keys."""
    runs, stderr = verl_run
    run = runs["docs"]
    assert "error" not in run, run.get("traceback")
    texts = run["solution_str"]  # what verl decoded and passed as solution_str
    pairs = [(i["question"], t) for (i, _), t in zip(PROMPTED, texts)] + [(None, t) for t in texts[len(PROMPTED):]]
    want = references(target, pairs)
    assert_scores([o["reward_score"] for o in run["outputs"]], want)
    for o, missing in zip(run["outputs"], [0.0] * len(PROMPTED) + [1.0] * len(NO_PROMPT)):
        assert o["reward_extra_info"] == {"score": o["reward_score"], "rm_score": o["reward_score"],
                                          "rm_prompt_missing": missing}
    # Said once per process in the log, however many samples lack a prompt.
    assert stderr.count("rmscore: extra_info has no prompt") == 1, stderr[-3000:]
    assert run["async"] is False

    run = runs["docs_async"]
    assert run["async"] is True, "verl awaits compute_score_async on its reward loop"
    assert_scores([o["reward_score"] for o in run["outputs"]], want[:len(PROMPTED)])

    run = runs["http"]
    assert run["reward"]["reward_kwargs"]["http"] is True and run["reward"]["reward_kwargs"]["target"].startswith("http://")
    assert_scores([o["reward_score"] for o in run["outputs"]], want[:len(PROMPTED)])

    run = runs["prompt_key"]
    assert_scores([o["reward_score"] for o in run["outputs"]], want[:1])
    assert run["outputs"][0]["reward_extra_info"]["rm_prompt_missing"] == 0.0


def test_refusal_by_configuration_stops_verl(verl_run):
    run = verl_run[0]["refuse"]
    assert run["error"].startswith("ValueError: extra_info has no prompt"), run


def test_target_reaches_verl_ray_workers_through_runtime_env(verl_run, target):
    """The docs' Ray line: this driver's environment has no $RMSCORE_TARGET, and verl's reward
    worker, a Ray actor, reaches the server through the runtime environment the override sets."""
    run = verl_run[0]["ray"]
    assert "error" not in run, run.get("traceback")
    assert run["workers"] == 1
    want = references(target, [(i["question"], t) for (i, _), t in zip(PROMPTED, run["solution_str"])])
    assert_scores(run["reward_score"], want)
    assert run["reward_extra_keys"] == ["score", "rm_score", "rm_prompt_missing"]
    assert_scores(run["reward_extra_info"]["rm_score"], want)
