"""OpenRLHF's reward-function file, backed by rmscore: `--reward.remote_url` names this file.

OpenRLHF (read at v0.11.0, 3c3be623, openrlhf/utils/agent.py `SingleTurnAgentExecutor`) loads a
`--reward.remote_url` ending in `.py` with importlib under the module name "reward_func" (so this
file imports absolutely), in every vLLM rollout actor, and calls

    reward_func(queries, prompts, labels)

once per sample, from a worker thread, with three one-element lists. It reads a dict: `scores`
(else `rewards`), `rewards`, and `extra_logs`. Unlike OpenRLHF's own HTTP client this form can
send a token and retries with backoff until the deadline, and the call goes to rmscore's
`/get_reward`, which splits each query into prompt and response as for OpenRLHF's URL form.

Configured by the environment of the rollout actors (put it in the Ray job's runtime_env):
    RMSCORE_URL               the FastAPI server's base URL (required), e.g. http://10.0.0.5:8000
    RMSCORE_AUTH_TOKEN_FILE   a file holding the server's bearer token (optional)
    RMSCORE_TLS_CA_FILE       a CA bundle for an https:// URL (optional)
    RMSCORE_TIMEOUT_S         seconds per call, retries included (default 120)

    python -c "import rmscore_client.adapters.openrlhf_reward_func as m; print(m.__file__)"

prints the path to give `--reward.remote_url`.
"""

from __future__ import annotations

import os
import pathlib
import threading

from rmscore_client.sync import HttpRewardClient

_client: HttpRewardClient | None = None
_client_pid: int | None = None
_lock = threading.Lock()


def _shared_client() -> HttpRewardClient:
    """One client per process (a rollout actor), built at the first call: OpenRLHF calls from threads."""
    global _client, _client_pid
    with _lock:
        if _client is None or _client_pid != os.getpid():
            url = os.environ.get("RMSCORE_URL")
            if not url:
                raise RuntimeError("RMSCORE_URL is not set in this process: put it in the Ray job's runtime_env "
                                   "env_vars (the rollout actors call reward_func)")
            token_file = os.environ.get("RMSCORE_AUTH_TOKEN_FILE")
            token = pathlib.Path(token_file).read_text().strip() if token_file else None
            _client = HttpRewardClient(url, auth_token=token, tls_ca_file=os.environ.get("RMSCORE_TLS_CA_FILE"),
                                       timeout_s=float(os.environ.get("RMSCORE_TIMEOUT_S", "120")))
            _client_pid = os.getpid()
        return _client


def reward_func(queries, prompts, labels) -> dict:
    """Rewards of `queries` as OpenRLHF reads them: 1-D float tensors under `rewards` and `scores`
    (the form of OpenRLHF's own example reward functions), and no extra logs."""
    import torch  # the rollout actors run vLLM: torch is there

    rewards = _shared_client().get_reward(list(queries), list(prompts) if prompts is not None else None,
                                          list(labels) if labels is not None else None)
    t = torch.tensor(rewards, dtype=torch.float32)
    return {"rewards": t, "scores": t.clone(), "extra_logs": {}}
