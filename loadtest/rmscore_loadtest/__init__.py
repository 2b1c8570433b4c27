"""rmscore_loadtest: everything that drives servers from outside.

caller.py      the one way to call any server kind over either transport
loadgen.py     the one closed-loop / open-loop load generator
workload.py    RLHF length mixes and rollouts;  stats.py  intervals and percentiles
observe.py     a server from outside: resident memory (/proc), Prometheus metrics
bench/         `rmscore bench`: repeated runs on fresh servers, intervals, report, plots;
               `--overhead`: the C++ serving overhead against the in-process driver
reliability/   `rmscore hardening`: faults, overload, cancellation, soak, hostile input
up.py          `rmscore up`: which kind is fastest here; up_sizing (load sizing), up_alone
               (each server alone: ramp, windows), up_report (plots, the HTML page)

Light on import: the Locust file imports `workload` and `caller` from here under gevent, so
nothing heavy (matplotlib, torch) is imported at package level.
"""
