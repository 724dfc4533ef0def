"""The proposals written for the inventory: an instance's changed keys, and the YAML snippet
`ansible-playbook -i INVENTORY -i SNIPPET` takes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from warmctl.tune.propose import (
    CAPTURE,
    KV_BLOCKS,
    MAX_BATCHED,
    MAX_NUM_SEQS,
    WARMUP_PROMPTS,
    WARMUP_RAMP,
    Proposal,
)

WARMUP_FLAGS = {WARMUP_PROMPTS: "--prompt-tokens", WARMUP_RAMP: "--batch-sizes"}
EXTRA_FLAGS = {MAX_BATCHED: "--max-num-batched-tokens", KV_BLOCKS: "--num-gpu-blocks-override"}


def _replace_flags(args: Sequence[str], flags: dict[str, str]) -> list[str]:
    """`args` without the given flags (and their values), then the flags appended."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in flags:
            skip = "=" not in a
            continue
        out.append(a)
    for flag, value in flags.items():
        out += [flag, value]
    return out


def instance_changes(p: Proposal, instance: dict[str, Any] | None = None) -> dict[str, Any]:
    """The instance's keys after the proposal (only those it changes), merged over
    `instance` (its dict in the inventory) so lists and dicts keep what the operator had."""
    base = instance or {}
    out: dict[str, Any] = {}
    cap = p.choice(CAPTURE)
    if not cap.keep:
        comp = dict(base.get("compilation_config") or {})
        comp["cudagraph_capture_sizes"] = cap.value
        out["compilation_config"] = comp
    seqs = p.choice(MAX_NUM_SEQS)
    if not seqs.keep:
        out["max_num_seqs"] = seqs.value
    extra = {
        flag: str(p.choice(key).value)
        for key, flag in EXTRA_FLAGS.items()
        if not p.choice(key).keep
    }
    if extra:
        out["extra_args"] = _replace_flags(list(base.get("extra_args") or []), extra)
    warm = {
        flag: ",".join(map(str, p.choice(key).value))
        for key, flag in WARMUP_FLAGS.items()
        if not p.choice(key).keep
    }
    if warm:
        out["warmup_args"] = _replace_flags(list(base.get("warmup_args") or []), warm)
    return out


def snippet(
    proposals: Sequence[Proposal],
    hosts: dict[str, tuple[str, str, list[dict[str, Any]] | None, bool | None]],
    header: str,
) -> str:
    """YAML for `ansible-playbook -i INVENTORY -i SNIPPET`: per inventory host, its whole
    `vllm_service_instances` with the proposals merged into the tuned instances.

    `hosts`: target label -> (inventory host, instance name, the host's instance list or None
    for a host given on the command line: its entry then holds only the tuned keys and `port`,
    to be merged by hand; whether it sleeps)."""
    import yaml

    from warmctl.plan.inventory import instance_entry

    out: dict[str, dict[str, Any]] = {}
    for p in proposals:
        host, name, instances, _ = hosts[p.target]
        entry = out.setdefault(host, {})
        if instances is not None:
            current = entry.setdefault(
                "vllm_service_instances", [dict(i) for i in instances if isinstance(i, dict)]
            )
            for inst in current:
                if str(inst.get("name")) == name:
                    inst.update(instance_changes(p, inst))
        else:
            current = entry.setdefault("vllm_service_instances", [])
            current.append({**instance_entry(name), **instance_changes(p)})
    # plain types: the inventory's strings are Ansible's own str subclasses
    plain = json.loads(json.dumps({"all": {"hosts": out}}))
    body = yaml.safe_dump(plain, sort_keys=False, default_flow_style=None)
    return header + body
