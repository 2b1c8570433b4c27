"""verl 0.9.1's own code, loading and calling rmscore's reward function (run by test_frameworks_verl.py).

Run as a script with the venv's Python and PYTHONPATH naming the directory that holds verl 0.9.1 and
the few packages its loader imports (the test installs them there). Reads a job (JSON) on stdin and
writes what verl returned (JSON) to the job's "out" path. For each run:

1. the command line: `python -m verl.trainer.main_ppo <overrides> --cfg job`, run as verl's own
   entry point in this process (runpy), so Hydra composes verl's packaged config (ppo_trainer.yaml
   and its defaults) from exactly those overrides and prints it instead of training;
2. the reward worker: `verl.experimental.reward_loop.RewardLoopWorker(config)`, the class verl's
   RewardLoopManager runs as a Ray actor (here in this process, without Ray): it loads the policy
   tokenizer (`actor_rollout_ref.model.path`) and the reward manager through
   `verl.trainer.ppo.reward.load_reward_manager`, which loads the custom reward function with
   `get_custom_reward_fn` (`load_extern_object`, `reward_kwargs` bound);
3. the call: `RewardLoopWorker.compute_score_batch(DataProto)` on the worker's event loop, with a
   batch shaped as verl's agent loop hands it over (left-padded prompt ids, right-padded response
   ids, attention mask, and the dataset's data_source / reward_model / extra_info columns): the
   naive reward manager decodes each response and calls the function per sample.

A run with "ray": true instead starts a local Ray cluster the way verl's `run_ppo` does (verl's
`get_ppo_ray_runtime_env(config)` merged with the config's `ray_kwargs.ray_init.runtime_env`, then
`ray.init(**ray_kwargs.ray_init)`: these few lines are run_ppo's, repeated here because run_ppo goes
on to train), then verl's `RewardLoopManager(config)` starts its reward workers as Ray actors and
`compute_rm_score(batch)` returns the DataProto verl's trainer reads (`rm_scores`, and each key of
the reward function's dict as a column named in `reward_extra_keys`). This process's own
environment has no $RMSCORE_TARGET then: a worker finds it only if the runtime environment carries it.

Nothing else of verl is re-implemented here; this file builds the input batch and reports.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import sys
import time
import traceback


def compose(overrides: list[str]):
    """The config verl's main_ppo composes from this command line (Hydra's `--cfg job` prints it)."""
    from omegaconf import OmegaConf

    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["verl/trainer/main_ppo.py", *overrides, "--cfg", "job"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_module("verl.trainer.main_ppo", run_name="__main__")
    except SystemExit as e:  # Hydra reports a bad override and exits 1
        if e.code not in (0, None):
            return None, err.getvalue() + out.getvalue()
    return OmegaConf.create(out.getvalue()), None


def batch(tokenizer, samples: list[dict]):
    """A DataProto as verl's agent loop hands it to the reward workers."""
    import numpy as np
    import torch

    from verl import DataProto

    pad = tokenizer.pad_token_id
    prompts = [tokenizer.encode(s.get("prompt_text") or "", add_special_tokens=False) for s in samples]
    responses = [tokenizer.encode(s["response"], add_special_tokens=False) for s in samples]
    p_len, r_len = max(map(len, prompts)) or 1, max(map(len, responses))
    p_ids = torch.full((len(samples), p_len), pad, dtype=torch.long)
    r_ids = torch.full((len(samples), r_len), pad, dtype=torch.long)
    mask = torch.zeros((len(samples), p_len + r_len), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        if p:
            p_ids[i, p_len - len(p):] = torch.tensor(p)
            mask[i, p_len - len(p):p_len] = 1
        r_ids[i, :len(r)] = torch.tensor(r)
        mask[i, p_len:p_len + len(r)] = 1
    col = lambda key: np.array([s[key] for s in samples], dtype=object)  # noqa: E731
    return DataProto.from_dict(
        tensors={"prompts": p_ids, "responses": r_ids, "attention_mask": mask,
                 "input_ids": torch.cat([p_ids, r_ids], dim=1)},
        non_tensors={"data_source": col("data_source"),
                     "reward_model": np.array([{"ground_truth": s.get("ground_truth"), "style": "model"}
                                               for s in samples], dtype=object),
                     "extra_info": col("extra_info")})


def run(spec: dict) -> dict:
    config, error = compose(spec["overrides"])
    if config is None:
        return {"compose_error": error}
    from verl.experimental.reward_loop import RewardLoopWorker
    from verl.trainer.ppo.reward import get_custom_reward_fn

    got: dict = {"reward": json.loads(json.dumps(
        __import__("omegaconf").OmegaConf.to_container(config.reward.custom_reward_function)))}
    if not spec.get("samples"):
        got["custom_reward_fn_loaded"] = get_custom_reward_fn(config) is not None
        return got
    worker = RewardLoopWorker(config)  # what each of verl's reward workers constructs
    tok = worker.input_tokenizer
    data = batch(tok, spec["samples"])
    try:
        outputs = worker.loop.run_until_complete(worker.compute_score_batch(data))
    except Exception as e:  # noqa: BLE001 - what verl would see raised out of its reward loop
        got["error"] = f"{type(e).__name__}: {e}"
        got["traceback"] = traceback.format_exc()[-2000:]
        return got
    got["outputs"] = [{"reward_score": float(o["reward_score"]),
                       "reward_extra_info": {k: float(v) for k, v in o["reward_extra_info"].items()}}
                      for o in outputs]
    # The response text verl passed as solution_str (the naive manager's own decode call).
    got["solution_str"] = [tok.decode(tok.encode(s["response"], add_special_tokens=False), skip_special_tokens=True)
                           for s in spec["samples"]]
    got["async"] = worker.reward_manager.is_async_reward_score
    return got


def run_on_ray(spec: dict) -> dict:
    import ray
    from omegaconf import OmegaConf

    config, error = compose(spec["overrides"])
    if config is None:
        return {"compose_error": error}
    from verl.experimental.reward_loop import RewardLoopManager
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    assert "RMSCORE_TARGET" not in os.environ
    # run_ppo (verl/trainer/main_ppo.py, 0.9.1) before it starts the TaskRunner:
    ray_init_kwargs = config.ray_kwargs.get("ray_init", {})
    runtime_env = OmegaConf.merge(get_ppo_ray_runtime_env(config), ray_init_kwargs.get("runtime_env", {}))
    ray_init_kwargs = OmegaConf.create({**ray_init_kwargs, "runtime_env": runtime_env})
    ray.init(**OmegaConf.to_container(ray_init_kwargs))
    try:
        manager = RewardLoopManager(config)
        workers = len(manager.reward_loop_workers)
        from verl.utils.tokenizer import hf_tokenizer

        tok = hf_tokenizer(config.actor_rollout_ref.model.path)
        data = batch(tok, spec["samples"])
        out = manager.compute_rm_score(data)
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    finally:
        ray.shutdown()
    # verl puts each sample's reward on its last response token (assemble_rm_scores)
    last = data.batch["attention_mask"][:, data.batch["prompts"].shape[1]:].sum(dim=1) - 1
    return {"workers": workers,
            "reward_score": [float(out.batch["rm_scores"][i, j]) for i, j in enumerate(last.tolist())],
            "reward_extra_keys": list(out.meta_info["reward_extra_keys"]),
            "reward_extra_info": {k: [float(v) for v in out.non_tensor_batch[k]]
                                  for k in out.meta_info["reward_extra_keys"]},
            "solution_str": [tok.decode(tok.encode(s["response"], add_special_tokens=False), skip_special_tokens=True)
                             for s in spec["samples"]]}


def main() -> None:
    job = json.load(sys.stdin)
    t0 = time.monotonic()
    import verl

    results = {"verl_version": verl.__version__, "import_seconds": round(time.monotonic() - t0, 2), "runs": {}}
    for name, spec in job["runs"].items():
        for k, v in spec.get("env", {}).items():
            os.environ[k] = v
        t0 = time.monotonic()
        results["runs"][name] = run_on_ray(spec) if spec.get("ray") else run(spec)
        results["runs"][name]["seconds"] = round(time.monotonic() - t0, 2)
        for k in spec.get("env", {}):
            os.environ.pop(k, None)
    with open(job["out"], "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
