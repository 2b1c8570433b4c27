"""rmscore.bench: load generation and the repeated-runs benchmark (`rmscore bench`).

Light on import: the Locust file imports `workload` and `clients` from here
under gevent, so nothing heavy (matplotlib, torch) is imported at package level.
"""
