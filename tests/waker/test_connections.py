"""The waker door's bound (`warmctl.waker.connections`) without a process: past the bound the
oldest idle connection makes room, a request's connection is never closed for room, and when
every connection holds a request the new one is refused; a storm is one line, not one per
connection."""

from __future__ import annotations

import socket

from warmctl.waker.connections import Conn, Connections, Storm


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def conn() -> Conn:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.close()  # the bookkeeping needs no live socket
    return Conn(sock)


def test_idle_ones_make_room_requests_stay_and_a_full_door_refuses() -> None:
    lines: list[str] = []
    clock = Clock()
    door = Connections(3, Storm("tiny", 3, lines.append, clock))
    a, b, c = conn(), conn(), conn()
    assert all(door.admit(x) for x in (a, b, c))
    assert door.started(b)  # b's head came: a request
    d = conn()
    assert door.admit(d)  # the oldest idle (a) made room
    assert a.evicted and not b.evicted and not door.started(a)
    assert len(door) == 3 and door.descriptors() == 4  # a's descriptor not yet released
    door.released(a)
    assert door.descriptors() == 3
    assert door.started(c) and door.started(d)  # every connection holds a request
    assert not door.admit(conn())  # refused
    assert not (b.evicted or c.evicted or d.evicted)
    clock.now += 10
    door.storm.close()
    assert len(lines) == 1, lines
    assert "2 connection(s) past its bound of 3" in lines[0], lines
    assert "1 idle ones closed to make room, 1 refused" in lines[0], lines


def test_a_long_storm_is_one_line_a_minute() -> None:
    lines: list[str] = []
    clock = Clock()
    storm = Storm("tiny", 8, lines.append, clock)
    for _ in range(150):  # 2.5 minutes of one eviction a second
        storm.note("idle")
        clock.now += 1.0
    storm.close()
    assert len(lines) == 3, lines
    assert all("connection storm" in line for line in lines)
    assert lines[0].endswith("goes on (one line a minute)") and lines[-1].endswith("over")
    assert sum(int(line.split("storm: ")[1].split()[0]) for line in lines) == 150


def test_every_event_of_a_storm_counts_in_the_waker_metrics() -> None:
    from warmctl.waker.metrics import WakerMetrics

    metrics = WakerMetrics("tiny", None)
    door = Connections(2, Storm("tiny", 2, [].append, Clock(), metrics.connection_past_bound))
    a, b = conn(), conn()
    assert door.admit(a) and door.admit(b) and door.admit(conn())  # a closed for room
    assert door.started(b)
    door.storm.note("descriptors")

    def count(what: str) -> float | None:
        name = "warmctl_waker_past_bound_connections_total"
        return metrics.registry.get_sample_value(name, {"what": what})

    assert (count("idle"), count("refused"), count("descriptors")) == (1.0, 0.0, 1.0)
