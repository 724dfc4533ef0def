"""Parse what an operator types for a server (`HOST`, `HOST:PORT`, `[v6]:PORT`, a URL)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from warmctl.errors import WarmctlError

DEFAULT_PORT = 8000
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_-]{1,63})*\.?$"
)
_ZONE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")  # an interface name (IFNAMSIZ)


@dataclass(frozen=True)
class Target:
    """One vLLM server: `base_url` has no trailing slash; `label` is what tables show."""

    scheme: str
    host: str
    port: int
    prefix: str = ""
    name: str | None = None
    # per-host settings from an inventory (e.g. verify thresholds); not part of its identity
    settings: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.prefix}"

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "" if self.scheme == "http" else f"{self.scheme}://"
        return f"{scheme}{host}:{self.port}{self.prefix}"

    def with_name(self, name: str, settings: Mapping[str, Any] | None = None) -> Target:
        return Target(
            self.scheme, self.host, self.port, self.prefix, name, dict(settings or self.settings)
        )


def is_loopback(host: str) -> bool:
    """`host` is this machine: localhost or a loopback address (127.0.0.0/8, ::1)."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def _bad(text: str, why: str) -> WarmctlError:
    return WarmctlError(
        f"bad host {text!r}: {why} (expected HOST, HOST:PORT, [IPv6]:PORT or http(s)://HOST[:PORT])",
        kind="input",
    )


def _address(text: str, host: str, version: int | None = None) -> str | None:
    """`host` as a normalized IP address, None if it is not one; an IPv6 zone must be an
    interface name (ipaddress takes any text after '%', e.g. "::%@", which no URL holds)."""
    try:
        address = ipaddress.IPv6Address(host) if version == 6 else ipaddress.ip_address(host)
    except ValueError:
        return None
    zone = getattr(address, "scope_id", None)
    if zone is not None and not _ZONE.match(zone):
        raise _bad(text, f"IPv6 zone {zone!r} is not an interface name")
    return str(address)


def _check_host(text: str, host: str) -> str:
    if not host:
        raise _bad(text, "empty host")
    address = _address(text, host)
    if address is not None:
        return address
    if not _HOSTNAME.match(host):
        raise _bad(text, f"{host!r} is not a host name or IP address")
    return host.rstrip(".").lower() if host != "." else host


def _check_port(text: str, port: str | int | None, default: int) -> int:
    if port is None or port == "":
        return default
    try:
        value = int(port)
    except (TypeError, ValueError):
        raise _bad(text, f"port {port!r} is not a number") from None
    if not 1 <= value <= 65535:
        raise _bad(text, f"port {value} is out of range 1-65535")
    return value


def parse_target(text: str, default_port: int = DEFAULT_PORT) -> Target:
    """`host`, `host:port`, `[v6]:port`, bare IPv6, or `http(s)://host[:port][/prefix]`."""
    raw = text.strip()
    if not raw:
        raise _bad(text, "empty")
    if "://" in raw:
        try:
            parts = urlsplit(raw)
        except ValueError as exc:  # e.g. "Invalid IPv6 URL" (an unclosed '[')
            raise _bad(text, str(exc)) from None
        if parts.scheme not in ("http", "https"):
            raise _bad(text, f"scheme {parts.scheme!r} is not http or https")
        if parts.query or parts.fragment:
            raise _bad(text, "a query or fragment makes no sense here")
        try:
            port_value = parts.port
        except ValueError as exc:
            raise _bad(text, str(exc)) from None
        host = _check_host(text, parts.hostname or "")
        # a URL means what URLs mean: no port -> the scheme's port (80 / 443)
        port = port_value if port_value is not None else (443 if parts.scheme == "https" else 80)
        prefix = parts.path.rstrip("/")
        return Target(parts.scheme, host, port, prefix)
    if raw.startswith("["):
        end = raw.find("]")
        if end < 0:
            raise _bad(text, "unclosed '['")
        host = raw[1:end]
        rest = raw[end + 1 :]
        if rest and not rest.startswith(":"):
            raise _bad(text, f"unexpected {rest!r} after ']'")
        address = _address(text, host, 6)
        if address is None:
            raise _bad(text, f"{host!r} is not an IPv6 address")
        return Target("http", address, _check_port(text, rest[1:] or None, default_port))
    if raw.count(":") > 1:
        address = _address(text, raw, 6)
        if address is None:
            raise _bad(text, "too many ':' (write IPv6 as [addr]:port)")
        return Target("http", address, default_port)
    host, sep, port_text = raw.partition(":")
    if sep and not port_text:
        raise _bad(text, "missing port after ':'")
    if "/" in raw:
        raise _bad(text, "a path needs a URL (http://HOST:PORT/prefix)")
    port_number = _check_port(text, port_text or None, default_port)
    return Target("http", _check_host(text, host), port_number)
