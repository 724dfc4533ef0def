"""A is plain `vllm serve`; B and C start exactly what warmctl.plan.render renders for the unit."""

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from warmctl.bench import configs
from warmctl.bench.runner import parse_plan
from warmctl.cli import cli
from warmctl.errors import WarmctlError
from warmctl.plan.render import render_instance
from warmctl.plan.unitfile import unit_values


@pytest.fixture
def site(tmp_path: Path) -> configs.Site:
    return configs.Site(
        device="gpu",
        venv=tmp_path / "venv",
        model="/models/qwen3",
        served_name="m",
        port=8123,
        workdir=tmp_path / "work",
        warmctl_venv=tmp_path / "wv",
        extra_args=("--max-model-len", "2048"),
        extra_env={"VLLM_USE_FLASHINFER_SAMPLER": "0"},
    )


def test_b_is_the_rendered_unit(site, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", "/somewhere/else")  # never leaks into a config
    b = configs.standard()["B"]
    launch = b.launch(site, site.workdir / "t0")
    rendered = render_instance(b.instance(site), host=b.hostvars(site))
    assert launch.spec.argv == list(rendered.plan.exec_argv)
    assert launch.warmup_argv == list(rendered.plan.warmup_argv)
    for key, value in rendered.env.items():
        assert launch.spec.env[key] == value
    cache = str(b.cache_dir(site))
    assert launch.spec.env["TRITON_CACHE_DIR"].startswith(cache)
    assert launch.spec.env["VLLM_CACHE_ROOT"].startswith(cache)
    assert launch.sleep and "--enable-sleep-mode" in launch.spec.argv
    assert launch.spec.argv[0] == str(site.venv / "bin" / "python")
    # the bench talks to vLLM where the unit makes it listen (a loopback port behind the proxy)
    port = launch.spec.argv[launch.spec.argv.index("--port") + 1]
    assert launch.spec.base_url == f"http://127.0.0.1:{port}"
    assert launch.warmup_argv[2] == f"127.0.0.1:{port}"
    assert launch.warmup_argv[0] == str(site.warmctl_venv / "bin" / "warmctl")


def test_a_is_plain_vllm_with_default_caches(site, monkeypatch):
    monkeypatch.setenv("VLLM_CACHE_ROOT", "/somewhere/else")
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere/else")
    launch = configs.standard()["A"].launch(site, site.workdir / "t0")
    argv = launch.spec.argv
    assert argv[1:5] == ["-m", "vllm.entrypoints.cli.main", "serve", "/models/qwen3"]
    assert "--enable-sleep-mode" not in argv and "--compilation-config" not in argv
    assert argv[-2:] == ["--max-model-len", "2048"]
    env = launch.spec.env
    for key in ("VLLM_CACHE_ROOT", "XDG_CACHE_HOME", "TRITON_CACHE_DIR", "VLLM_SERVER_DEV_MODE"):
        assert key not in env
    assert env["HOME"].endswith("/A/home") and env["TMPDIR"].endswith("/t0")
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert launch.warmup_argv is None and not launch.sleep


def test_c_changes_only_the_capture_sizes(site):
    table = configs.standard((1, 8, 64))
    b = table["B"].launch(site, site.workdir / "t0").spec.argv
    c = table["C"].launch(site, site.workdir / "t1").spec.argv

    def without_cc(argv):
        if "--compilation-config" not in argv:
            return argv, {}
        i = argv.index("--compilation-config")
        return argv[:i] + argv[i + 2 :], json.loads(argv[i + 1])

    (b_rest, b_cc), (c_rest, c_cc) = without_cc(b), without_cc(c)
    assert b_rest == c_rest
    assert c_cc == {**b_cc, "cudagraph_capture_sizes": [1, 8, 64]}


def test_every_start_gets_a_fresh_tmpdir_and_keeps_its_home(site):
    b = configs.standard()["B"]
    first = b.launch(site, site.workdir / "t0")
    second = b.launch(site, site.workdir / "t1")
    assert first.spec.env["TMPDIR"] != second.spec.env["TMPDIR"]
    assert first.spec.env["HOME"] == second.spec.env["HOME"]


def test_cpu_unit_has_no_sleep(site):
    cpu = configs.Site(**{**site.__dict__, "device": "cpu"})
    launch = configs.standard()["B"].launch(cpu, cpu.workdir / "t0")
    assert "vllm.entrypoints.openai.api_server" in launch.spec.argv
    assert not launch.sleep


def test_listen_url():
    argv = ["py", "serve", "m", "--host", "0.0.0.0", "--port", "18000"]
    assert configs.listen_url(argv, "http://127.0.0.1:8000") == "http://127.0.0.1:18000"
    assert configs.listen_url(["py", "--port=9"], "x") == "http://127.0.0.1:9"
    assert configs.listen_url(["py"], "http://127.0.0.1:8000") == "http://127.0.0.1:8000"


def test_plan_parsing():
    table = configs.standard()
    steps = parse_plan("A, B,B+sleep ,C", table)
    assert [s.label for s in steps] == ["A", "B", "B+sleep", "C"]
    with pytest.raises(WarmctlError, match="bad plan item 'D'"):
        parse_plan("A,D", table)
    with pytest.raises(WarmctlError, match="bad plan item"):
        parse_plan("B+nap", table)


MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def test_tensor_parallel_spreads_every_config_over_the_gpus(site):
    """TP=2 (docs/BENCHMARKS.md, "TP=2"): A is `vllm serve --tensor-parallel-size 2`; B and C
    are the unit an inventory with `tensor_parallel_size: 2, gpus: [0, 1]` renders; the
    machine's env (NVLink multicast off) reaches all three."""
    tp = configs.Site(**{**site.__dict__, "tensor_parallel_size": 2, "extra_env": MULTICAST_OFF})
    table = configs.standard()
    a = table["A"].launch(tp, tp.workdir / "t0").spec
    assert a.argv[a.argv.index("--tensor-parallel-size") + 1] == "2"
    assert "CUDA_VISIBLE_DEVICES" not in a.env or a.env["CUDA_VISIBLE_DEVICES"] == os.environ.get(
        "CUDA_VISIBLE_DEVICES"
    )
    for key in ("B", "C"):
        cfg = table[key]
        inst = cfg.instance(tp)
        assert inst["tensor_parallel_size"] == 2 and inst["gpus"] == [0, 1]
        rendered = render_instance(inst, host=cfg.hostvars(tp))
        launch = cfg.launch(tp, tp.workdir / f"t-{key}")
        assert launch.spec.argv == list(rendered.plan.exec_argv)
        assert launch.spec.argv[launch.spec.argv.index("--tensor-parallel-size") + 1] == "2"
        assert launch.spec.env["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert launch.spec.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert launch.sleep  # sleep/wake with two workers is part of the plan
        allowed = unit_values(rendered.unit_text, "Service", "DeviceAllow")
        assert {"/dev/nvidia0 rw", "/dev/nvidia1 rw"} <= set(allowed)
    for spec in (a, table["B"].launch(tp, tp.workdir / "t1").spec):
        assert {k: spec.env[k] for k in MULTICAST_OFF} == MULTICAST_OFF
    one = table["B"].launch(site, site.workdir / "t2").spec  # the default stays one GPU
    assert "--tensor-parallel-size" not in one.argv and "CUDA_VISIBLE_DEVICES" not in one.env


def test_bad_tensor_parallel_size_is_one_line(tmp_path):
    result = CliRunner().invoke(
        cli,
        ["bench", "--model", "m", "--out", str(tmp_path), "--tensor-parallel-size", "0"],
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == "warmctl bench: --tensor-parallel-size 0: expected 1 or more"
    assert not (tmp_path / "work").exists()


def test_an_instance_keeps_its_extra_args_after_the_sites(site):
    """What `tools/experiments/tune_bench.py` deploys: tune's flags after the machine's own."""
    tuned = configs.Config(
        "U",
        "tuned",
        True,
        {"cudagraph_capture_sizes": [2, 640]},
        {
            "extra_args": ["--num-gpu-blocks-override", "2560"],
            "warmup_args": ["--prompt-tokens", "190,590", "--batch-sizes", "1,8"],
        },
    )
    launch = tuned.launch(site, site.workdir / "t0")
    argv = launch.spec.argv
    assert argv[-4:] == ["--max-model-len", "2048", "--num-gpu-blocks-override", "2560"]
    assert json.loads(argv[argv.index("--compilation-config") + 1]) == {
        "cudagraph_capture_sizes": [2, 640]
    }
    assert launch.warmup_argv[-4:] == ["--prompt-tokens", "190,590", "--batch-sizes", "1,8"]


def test_l_runs_the_launcher_on_the_units_launch_file(site):
    """L: the unit's ExecStart (the launcher on `-m MODULE`) with its launch file written where
    the unit names it, the state file in the start's own tmp (no /run outside systemd); the
    bench reaches and judges the server by what the launch file runs. B keeps the plain unit
    (the launcher is on by default on GPU hosts)."""
    table = configs.standard()
    b, l_config = table["B"], table["L"]
    launch = l_config.launch(site, site.workdir / "t0")
    rendered = render_instance(l_config.instance(site), host=l_config.hostvars(site))
    argv = launch.spec.argv
    assert argv[1].endswith("/share/warmctl/vllm_launch.py")
    assert argv[argv.index("--launch-file") + 1] == rendered.plan.launch_file
    assert Path(rendered.plan.launch_file).read_text() == rendered.files[rendered.plan.launch_file]
    assert argv[argv.index("--state-file") + 1] == str(site.workdir / "t0" / "launcher.json")
    assert (
        launch.sleep and launch.spec.base_url == b.launch(site, site.workdir / "t1").spec.base_url
    )
    assert b.launch(site, site.workdir / "t2").spec.argv[1:3] == ["-m", "vllm.entrypoints.cli.main"]


def test_p_and_q_prepare_the_next_server_and_warm_a_relaunch_shorter(site):
    """P: L with the launcher's `--prepare reuse` (before its `--`) and, after a relaunch, the
    unit's warmup with V's arguments; Q: P with the EngineCore's modules preloaded. Their cold
    start keeps the unit's own warmup."""
    table = configs.standard()
    launch_l = table["L"].launch(site, site.workdir / "t0")
    p = table["P"].launch(site, site.workdir / "t1")
    q = table["Q"].launch(site, site.workdir / "t2")
    cut = p.spec.argv.index("--")
    assert p.spec.argv[cut - 2 : cut] == ["--prepare", "reuse"]
    assert p.spec.argv[cut:] == launch_l.spec.argv[launch_l.spec.argv.index("--") :]
    assert p.warmup_argv == launch_l.warmup_argv and launch_l.relaunch_warmup_argv is None
    assert p.relaunch_warmup_argv is not None
    assert p.relaunch_warmup_argv[-5:] == list(configs.V_WARMUP_ARGS)
    q_argv = q.spec.argv[: q.spec.argv.index("--")]
    assert "vllm.v1.worker.gpu_model_runner" in q_argv and "reuse" in q_argv
    assert q_argv.count("--preload") == len(configs.Q_PRELOAD)
    # parse_plan takes them with +relaunch (they run the launcher)
    from warmctl.bench.runner import parse_plan

    assert [s.config.key for s in parse_plan("P+relaunch,Q+relaunch", table)] == ["P", "Q"]
    d = table["E"].launch(site, site.workdir / "t3").spec.argv
    assert d[d.index("--") - 2 : d.index("--")] == ["--standby-delay", "60"]


def test_x_is_r_prepared_with_the_standby_forked_once_the_server_is_ready(site):
    """X: R's levers in the launch file (the same vLLM arguments and variables as R's, so it
    loads R's compiled artifact from the cache it shares with B and R), P's `--prepare reuse`
    and relaunch warmup, and the launcher's `--standby-delay ready` (after the unit's options:
    the last --standby-delay wins); parse_plan takes X+relaunch."""
    from warmctl.launcher.vllm_launch import parse, parse_launch

    table = configs.standard()
    r = table["R"].launch(site, site.workdir / "t0")
    x = table["X"].launch(site, site.workdir / "t1")
    cut = x.spec.argv.index("--")
    assert x.spec.argv[cut - 4 : cut] == ["--prepare", "reuse", "--standby-delay", "ready"]
    opts = parse(x.spec.argv[2:])
    assert opts.standby_ready and opts.prepare == "reuse"

    def launched(launch: configs.Launch) -> tuple[list[str], dict[str, str]]:
        argv = launch.spec.argv
        text = Path(argv[argv.index("--launch-file") + 1]).read_text()
        doc = parse_launch(text.encode())
        return doc.args, doc.env

    args, env = launched(x)
    assert (args, env) == launched(r)
    assert configs.RESTART_LEVERS.items() <= env.items()
    assert x.relaunch_warmup_argv is not None
    assert x.relaunch_warmup_argv[-5:] == list(configs.P_RELAUNCH_WARMUP_ARGS)
    assert x.warmup_argv == r.warmup_argv
    assert table["X"].cache_key == table["R"].cache_key == "B"
    assert [s.config.key for s in parse_plan("A,P+relaunch,R,X+relaunch", table)][-1] == "X"
