"""Tiers: unit/ (no server, seconds), conformance/ (the contract on every server kind),
integration/ (client, benchmark, load, faults, export, fuzzing), deploy/ (compose, images,
manifests, dashboards and rules with real tools). `bash scripts/test.sh TIER` runs one.

The shared helpers beside this file (servers.py: real servers on loopback; harness.py: golden
inputs and the contract's expectations) are imported by name from every tier: pytest puts this
folder on sys.path because it holds this conftest."""
