"""rmscore_tools: everything that starts servers and drives them from outside.

The driving code, which every part uses:
kinds.py       the one registry of server kinds;  launch.py  the one launcher (port file,
               readiness, signals by PID)
caller.py      the one way to call any server kind over either transport
loadgen.py     the one closed-loop / open-loop load generator
workload.py    RLHF length mixes and rollouts;  stats.py  intervals and percentiles
observe.py     a server from outside: resident memory (/proc), Prometheus metrics
host.py        the checkout the tools run from (ROOT) and the machine (machine_info)
args.py        command-line pieces the subcommands share (comma_list)

The parts, one command each:
up/            `rmscore up`: which kind is fastest here (stack.py: start, phases, the stack);
               start (spawning, priorities), alone (each server alone: ramp, windows),
               sizing (load sizing), report (plots, the HTML page)
bench/         `rmscore bench`: repeated runs on fresh servers, intervals, report, plots;
               `--overhead`, `--scheduling`, `--precision`; `rmscore profile` (cost_table.py);
               the GPU check (gpu_check.py) and the ONNX Runtime arena probe
reliability/   `rmscore hardening`: faults, overload, cancellation, soak, hostile input,
               transport attacks; the long side-by-side soak (soak_long.py)

Light on import: the Locust file (loadtest/rlhf_client.py) imports `kinds`, `workload` and
`caller` from here under gevent, so nothing heavy (matplotlib, torch) is imported at package level.
"""
