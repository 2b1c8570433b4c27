"""`rmscore up` must not trust port 9090: Debian's prometheus.service may already hold it."""

import socket

from rmscore_tools.up import stack


def test_prometheus_port_moves_off_a_taken_port():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        port = stack.prometheus_port(preferred=taken)
        assert port != taken and port > 0
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # really free


def test_prometheus_port_keeps_a_free_preferred_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert stack.prometheus_port(preferred=free) == free
