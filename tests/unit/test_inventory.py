import builtins
from pathlib import Path

import pytest

from warmctl.errors import WarmctlError
from warmctl.plan.inventory import hosts_from_inventory, targets_for_host


def test_targets_for_host_variants() -> None:
    [t] = targets_for_host("gpu-1", {})
    assert (t.base_url, t.label) == ("http://gpu-1:8000", "gpu-1")
    [t] = targets_for_host("gpu-1", {"ansible_host": "10.0.0.5", "warmctl_port": "8100"})
    assert (t.base_url, t.label) == ("http://10.0.0.5:8100", "gpu-1:8100")
    ts = targets_for_host(
        "gpu-2",
        {
            "ansible_host": "10.0.0.6",
            "vllm_service_instances": [{"name": "chat", "port": 8001}, {"name": "code"}],
        },
    )
    assert [(t.base_url, t.label) for t in ts] == [
        ("http://10.0.0.6:8001", "gpu-2/chat"),
        ("http://10.0.0.6:8000", "gpu-2/code"),
    ]
    [t] = targets_for_host(
        "gpu-3", {"ansible_host": "10.0.0.7", "vllm_verify_address": "gpu-3.lan"}
    )
    assert t.base_url == "http://gpu-3.lan:8000"


@pytest.mark.parametrize(
    "hv",
    [
        {"warmctl_port": "x"},
        {"warmctl_port": 0},
        {"vllm_service_instances": "a"},
        {"vllm_service_instances": [3]},
    ],
)
def test_bad_host_vars(hv: dict) -> None:
    with pytest.raises(WarmctlError):
        targets_for_host("h", hv)


def write_inventory(tmp_path: Path) -> Path:
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.ini").write_text(
        "[vllm]\n"
        "gpu-1 ansible_host=10.0.0.1\n"
        "gpu-2 ansible_host=10.0.0.2 warmctl_port=9001\n"
        "[other]\n"
        "db-1 ansible_host=10.0.1.1\n"
    )
    (inv / "group_vars").mkdir()
    (inv / "group_vars" / "vllm.yml").write_text(
        "base_port: 8100\nvllm_service_instances:\n  - {name: chat, port: '{{ base_port }}'}\n"
        "  - {name: code, port: 8101}\n"
    )
    return inv / "hosts.ini"


def test_hosts_from_inventory_reads_group_vars_and_limit(tmp_path: Path) -> None:
    path = write_inventory(tmp_path)
    labels = {t.label: t.base_url for t in hosts_from_inventory(path)}
    assert labels == {
        "gpu-1/chat": "http://10.0.0.1:8100",
        "gpu-1/code": "http://10.0.0.1:8101",
        "gpu-2/chat": "http://10.0.0.2:8100",
        "gpu-2/code": "http://10.0.0.2:8101",
        "db-1:8000": "http://10.0.1.1:8000",
    }
    assert [t.label for t in hosts_from_inventory(path, limit="gpu-2")] == [
        "gpu-2/chat",
        "gpu-2/code",
    ]
    assert {t.label for t in hosts_from_inventory(path, limit="other")} == {"db-1:8000"}


def test_yaml_inventory(tmp_path: Path) -> None:
    path = tmp_path / "inv.yml"
    path.write_text(
        "all:\n  hosts:\n    a:\n      ansible_host: 127.0.0.1\n      warmctl_port: 8123\n"
    )
    [t] = hosts_from_inventory(path)
    assert t.base_url == "http://127.0.0.1:8123"


def test_inventory_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("all:\n  hosts: [\n")
    with pytest.raises(WarmctlError) as info:
        hosts_from_inventory(bad)
    assert "does not parse" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(WarmctlError, match="not found"):
        hosts_from_inventory(tmp_path / "missing.ini")
    with pytest.raises(WarmctlError, match="no hosts matching --limit"):
        hosts_from_inventory(write_inventory(tmp_path), limit="nothing-like-this")
    captured = capsys.readouterr()
    assert "WARNING" not in captured.err + captured.out  # Ansible's own chatter is swallowed


def test_missing_ansible_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_ansible(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("ansible"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_ansible)
    with pytest.raises(WarmctlError) as info:
        hosts_from_inventory(write_inventory(tmp_path))
    assert info.value.kind == "missing_dependency"
    assert "warmctl[inventory]" in str(info.value)


def test_verify_thresholds_from_host_vars() -> None:
    hv = {"vllm_verify_max_ratio": "10", "vllm_verify_max_first_ttft": 0}
    [t] = targets_for_host("gpu-1", hv)
    assert dict(t.settings) == {"max_ratio": 10.0}  # 0 means warmctl's default
    ts = targets_for_host("gpu-2", {**hv, "vllm_service_instances": [{"name": "a"}, {"name": "b"}]})
    assert [dict(t.settings) for t in ts] == [{"max_ratio": 10.0}] * 2
    with pytest.raises(WarmctlError, match="not a number"):
        targets_for_host("gpu-3", {"vllm_verify_max_ratio": "ten"})
