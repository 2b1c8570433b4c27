"""Adapters that plug rmscore into RLHF trainers (docs/frameworks/).

- `rmscore_client.adapters.trl`: reward functions for TRL's GRPOTrainer (sync and async).
- `rmscore_client.adapters.verl`: verl's custom reward function, `compute_score` (sync and async).
- OpenRLHF and vLLM-style clients need no client code: they talk to the FastAPI server's
  `/get_reward` and `/classify`, `/score`, `/pooling` routes.
"""
