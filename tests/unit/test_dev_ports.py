"""The dev tooling's ports: found free outside the kernel's ephemeral range, so that a client's
outgoing connection cannot take a port between the moment it is found and the moment a server (a
Kafka node, restarted on its old ports too) binds it. A CI run lost a cluster that way."""

from __future__ import annotations

import socket

from retry_scheduler.dev import procs


def test_free_ports_are_outside_the_ephemeral_range_and_bindable() -> None:
    ephemeral = procs._ephemeral_range()
    ports = {procs.free_port() for _ in range(50)}
    assert not ports & set(ephemeral)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_a_server_listens_on_is_never_given() -> None:
    listeners = []
    try:
        for port in procs.PRIVATE_PORTS[:400]:
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            s.listen()
            listeners.append(s)
        taken = {s.getsockname()[1] for s in listeners}
        assert all(procs.free_port() not in taken for _ in range(200))
    finally:
        for s in listeners:
            s.close()
