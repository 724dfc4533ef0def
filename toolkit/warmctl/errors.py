"""The one exception type every user-facing failure goes through."""

from __future__ import annotations


class WarmctlError(Exception):
    """A failure the user can act on: `str(err)` is ONE line, `exit_code` is the CLI's exit code.

    `kind` classifies it for callers that react differently (verify reports a sleeping host as
    ASLEEP, not as slow): refused, dns, timeout, tls, auth, dev_route, not_found, server,
    bad_request, protocol, too_large (an answer past the cap on what is read), asleep,
    drain_timeout, input, missing_dependency, or generic.
    """

    def __init__(
        self,
        message: str,
        exit_code: int = 2,
        *,
        kind: str = "generic",
        status: int | None = None,
        gate: str | None = None,
    ) -> None:
        one_line = " ".join(str(message).split())
        super().__init__(one_line)
        self.message = one_line
        self.exit_code = exit_code
        self.kind = kind
        self.status = status
        # the state a host's proxy answered with (warmctl.sleepwake.gate.proxy_state)
        self.gate = gate

    def __str__(self) -> str:
        return self.message
