"""Adapters that plug rmscore into RLHF trainers.

- `rmscore_client.adapters.trl`: reward functions for TRL's GRPOTrainer (sync and async).
- OpenRLHF needs no client code: point `--remote_rm_url` at the FastAPI server's
  `/get_reward` (server_py/rmscore/frontends/openrlhf.py, see docs/client.md).
"""
