"""The proxy's doors against a client it must refuse, on a real nginx rendered from templates/
(a wake-on-request instance with an awake-only door, bearer tokens, an allow list) in front of
the vLLM double, with `warmctl waker` as a real process:

- a bearer token is compared exactly: its case variants (and a token's punctuation taken as
  a regex) get 401 on /v1/ and /metrics, on both doors, and wake nothing;
- the allow list comes first: a client from a refused address gets 403 and nothing of the
  gate (no state, no /health JSON, no 503 asleep/draining/warming, no hold, no wake), in every
  state of the gate, on both doors, for every path; an allowed client still gets the gate.

Loopback has many addresses: the allowed client connects from 127.0.0.2, the refused one from
127.0.0.1."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.double import VllmDouble
from tests.hardening.proxy_support import Nginx, free_port, render_proxy
from tests.hardening.test_proxy import TOKEN
from tests.waker.support import GateFiles, Waker

ALLOWED, REFUSED = "127.0.0.2", "127.0.0.1"
# every character a token may have (warmctl.plan.validate): punctuation that means something in a
# regex must match only itself
PUNCT_TOKEN = "Tok.en+with~all/the=punct-uat_ion"
COMPLETION = {"model": "double-model", "prompt": "hi", "max_tokens": 2}


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict[str, object]:
        return json.loads(self.body)

    def __str__(self) -> str:
        return f"{self.status} {self.body[:160]!r}"


IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)


class FromConnection(http.client.HTTPConnection):
    """A connection to 127.0.0.1 from another loopback address. The source port is chosen at
    connect (IP_BIND_ADDRESS_NO_PORT), as for any client: a port bound up front could be one a
    closed connection still holds (a reset) or one the next test's nginx is about to bind."""

    def __init__(self, port: int, source: str) -> None:
        super().__init__("127.0.0.1", port, timeout=30)
        self.source = source

    def connect(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            if self.source != "127.0.0.1":
                sock.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
                sock.bind((self.source, 0))
            sock.connect((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self.sock = sock


def ask(port: int, method: str, path: str, source: str, token: str | None = TOKEN) -> Answer:
    """One request from `source` (a loopback address), a fresh connection each."""
    conn = FromConnection(port, source)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        # a token, or a whole header value (one with a space: its own scheme)
        headers["Authorization"] = token if " " in token else f"Bearer {token}"
    body = json.dumps(COMPLETION).encode() if method == "POST" else None
    try:
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        return Answer(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


@dataclass
class Doors:
    gate: GateFiles
    double: VllmDouble
    waker: Waker
    port: int
    awake_port: int

    def state(self, state: str) -> None:
        """Leave the gate as `state` has it (and vLLM asleep when the gate says so)."""
        for flag in ("closed", "wakeable", "draining", "warming"):
            self.gate.path(flag).unlink(missing_ok=True)
        if state in ("closed", "wakeable"):
            self.double.put_to_sleep(1)
        if state != "open":
            self.gate.path(state).write_text(f"{state} for the test\n")

    def nothing_reached_or_asked(self) -> None:
        assert self.double.counters.requests == [], self.double.counters.requests
        assert not self.gate.wake_request.exists()
        assert self.waker.state()["holding"] == 0


@pytest.fixture
def doors(nginx_bin: str, vllm_double: VllmDouble, tmp_path: Path) -> Iterator[Doors]:
    gate = GateFiles(tmp_path / "gate")
    gate.dir.mkdir()
    port, awake_port = free_port(), free_port()
    host = {
        "vllm_proxy_enabled": True,
        "vllm_proxy_gate_dir": str(gate.dir),
        "vllm_proxy_upstream_port_offset": vllm_double.port - port,
        "vllm_proxy_api_keys": [TOKEN, PUNCT_TOKEN],
        "vllm_proxy_allow": [ALLOWED, "10.0.0.0/8", "::1"],
        "vllm_proxy_access_log": str(tmp_path / "access.log"),
        "vllm_proxy_retry_after": 7,
    }
    instance = {"name": "tiny", "model": "/m", "port": port, "awake_port": awake_port,
                "idle_sleep": {"after": "1h"}}  # fmt: skip
    files = render_proxy(instance, host)
    waker = Waker(gate, vllm_double.address, tmp_path / "waker.log").start()
    nginx = Nginx(nginx_bin, tmp_path / "nginx", files).start(port)
    try:
        yield Doors(gate, vllm_double, waker, port, awake_port)
    finally:
        nginx.stop()
        waker.stop()


def case_variants(token: str) -> list[str]:
    flipped = next(i for i, c in enumerate(token) if c.isalpha())
    one = token[:flipped] + token[flipped].swapcase() + token[flipped + 1 :]
    return [v for v in (token.upper(), token.lower(), token.swapcase(), one) if v != token]


def test_token_case_variants_are_refused_at_every_door(doors: Doors) -> None:
    variants = [*case_variants(TOKEN), *case_variants(PUNCT_TOKEN)]
    variants += [PUNCT_TOKEN.replace(".", "x"), PUNCT_TOKEN.replace("+", "nn")]  # as a regex
    variants += [f"bearer {TOKEN}", f"BEARER {TOKEN}", f"Bearer  {TOKEN}", f"Bearer {TOKEN}x"]
    seen = []
    for state in ("open", "wakeable"):
        doors.state(state)
        for port in (doors.port, doors.awake_port):
            for path in ("/v1/models", "/metrics"):
                for token in variants:
                    r = ask(port, "GET", path, ALLOWED, token)
                    seen.append(f"{state} {path} {token!r} -> {r.status}")
                    assert r.status == 401, seen[-1]
                    assert r.json()["error"]["code"] == 401
            r = ask(port, "POST", "/v1/completions", ALLOWED, TOKEN.upper())
            assert r.status == 401, r
    print(f"{len(seen)} requests with a token's case variant or look-alike: all 401")
    doors.nothing_reached_or_asked()
    # the tokens themselves pass, exactly as configured
    doors.state("open")
    for token in (TOKEN, PUNCT_TOKEN):
        for port in (doors.port, doors.awake_port):
            assert ask(port, "GET", "/v1/models", ALLOWED, token).status == 200
            assert ask(port, "GET", "/metrics", ALLOWED, token).status == 200


REQUESTS = [
    ("GET", "/health", None),
    ("GET", "/v1/models", TOKEN),
    ("GET", "/v1/models", None),  # no token: 403 all the same, not 401
    ("POST", "/v1/completions", TOKEN),
    ("GET", "/metrics", TOKEN),
    ("GET", "/metrics", None),
    ("POST", "/sleep?level=1", TOKEN),  # a dev route
    ("GET", "/_warmctl_wake", TOKEN),
    ("GET", "/elsewhere", None),
]


@pytest.mark.parametrize("state", ["open", "closed", "wakeable", "draining", "warming"])
def test_a_refused_client_gets_403_and_nothing_of_the_gate(doors: Doors, state: str) -> None:
    doors.state(state)
    answers = []
    for port in (doors.port, doors.awake_port):
        for method, path, token in REQUESTS:
            try:
                r = ask(port, method, path, REFUSED, token)
            except OSError as err:
                raise AssertionError(f"{state}: {method} {path}: {err!r}") from None
            answers.append(f"{state}: {method} {path} -> {r}")
            assert r.status == 403, answers[-1]
            assert r.json() == {"error": {"message": "forbidden", "type": "Forbidden",
                                          "code": 403}}, answers[-1]  # fmt: skip
            assert "retry-after" not in r.headers, answers[-1]
            text = r.body.decode()
            for word in ("asleep", "draining", "warming", "wake", "state", "tiny"):
                assert word not in text, answers[-1]
    print("\n".join([*answers[:3], "..."]))
    doors.nothing_reached_or_asked()


@pytest.mark.parametrize(
    ("state", "health"),
    [("closed", 503), ("wakeable", 200), ("draining", 503), ("warming", 503)],
)
def test_an_allowed_client_still_gets_the_gate(doors: Doors, state: str, health: int) -> None:
    """The same requests from an allowed address: the gate answers as before (the 403 above
    is the allow list's, not a door that refuses everyone)."""
    doors.state(state)
    r = ask(doors.port, "GET", "/health", ALLOWED, None)
    assert r.status == health, r
    assert r.json().get("state") == ("asleep" if state in ("closed", "wakeable") else state)
    if state != "wakeable":
        r = ask(doors.port, "GET", "/v1/models", ALLOWED)
        assert r.status == 503 and r.headers["retry-after"] == "7", r
    assert ask(doors.port, "GET", "/v1/models", ALLOWED, None).status == 401
