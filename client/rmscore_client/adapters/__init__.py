"""Adapters that plug rmscore into RLHF trainers.

- `rmscore.client.adapters.trl`: reward functions for TRL's GRPOTrainer (sync and async).
- OpenRLHF needs no client code: point `--remote_rm_url` at the FastAPI server's
  `/get_reward` (server_py/rmscore/server/openrlhf.py, see docs/client.md).
"""
