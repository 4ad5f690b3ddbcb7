"""The rendered sbatch script (what `rlcore run --dry-run` prints): key lines, multi-node logic,
container wrapping, environment, extra options. Needs no SLURM."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys

import pytest
from pydantic import ValidationError

from rlcore.registry import Registry

from rlcore_launcher_slurm.options import SlurmOptions


def render(slurm_launcher, launch_request, capsys, manifest=None, **options) -> str:
    launcher = slurm_launcher(**options)
    assert launcher.launch(launch_request(manifest=manifest, dry_run=True)) == 0
    out = capsys.readouterr().out
    assert "dry run: nothing was submitted" in out
    return out


def sbatch_directives(script: str) -> list[str]:
    return [line[len("#SBATCH ") :] for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_plugin_registers_launcher_and_jobs_command():
    registry = Registry.discover()
    component = registry.get("launcher", "slurm")
    assert component.distribution == "rlcore-launcher-slurm"
    assert component.options is SlurmOptions
    assert "jobs" in [command.name for command in registry.commands()]


def test_dry_run_renders_resources_and_submits_nothing(slurm_launcher, launch_request, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no SLURM commands at all: a dry run needs none
    out = render(
        slurm_launcher, launch_request, capsys,
        manifest={"run": {"name": "gsm8k grpo"}},
        nodes=1, gpus_per_node=4, cpus_per_task=16, mem="200G", partition="gpu", account="proj1",
        time="4:00:00", python="/opt/py/bin/python",
    )
    run_dir = tmp_path / "run"
    directives = sbatch_directives(out)
    assert directives[:2] == ["--job-name=rlcore-gsm8k_grpo", "--comment=rlcore"]
    for expected in (
        "--nodes=1", "--ntasks-per-node=1", "--cpus-per-task=16", "--gpus-per-node=4", "--mem=200G",
        "--partition=gpu", "--account=proj1", "--time=4:00:00",
        f"--output={run_dir}/launch/slurm-%j.log", f"--chdir={run_dir}",
    ):
        assert expected in directives
    driver = re.search(r"^RLCORE_DRIVER=\((.*)\)$", out, re.M).group(1)
    assert shlex.split(driver) == [
        "/opt/py/bin/python", "-m", "rlcore", "run", f"{run_dir}/launch/manifest.toml", "--run-dir", str(run_dir)
    ]
    # The dry run wrote nothing.
    assert not run_dir.exists()


def test_defaults_leave_resources_to_slurm(slurm_launcher, launch_request, capsys):
    directives = sbatch_directives(render(slurm_launcher, launch_request, capsys))
    options = {d.split("=")[0] for d in directives}
    assert not options & {"--partition", "--account", "--time", "--mem", "--gpus-per-node", "--cpus-per-task"}
    assert f"RLCORE_PYTHON={shlex.quote(sys.executable)}" in render(slurm_launcher, launch_request, capsys)


def test_one_node_starts_ray_only_when_installed(slurm_launcher, launch_request, capsys):
    out = render(slurm_launcher, launch_request, capsys, nodes=1)
    assert "if in_job \"$RLCORE_PYTHON\" -c 'import ray'" in out
    assert "Ray is not installed: running the driver without a Ray cluster" in out
    off = render(slurm_launcher, launch_request, capsys, nodes=1, ray="off")
    assert "--head" not in off and "RLCORE_USE_RAY" not in off


def test_multi_node_head_and_workers(slurm_launcher, launch_request, capsys):
    out = render(
        slurm_launcher, launch_request, capsys,
        nodes=4, gpus_per_node=8, cpus_per_task=32, network_interface="ib0", ray_port=6390, ray_join_timeout=90,
    )
    assert "RLCORE_USE_RAY=1" in out and "import ray'" not in out  # several nodes always need Ray
    assert "RLCORE_IFACE=ib0" in out
    assert "RLCORE_RAY_PORT=6390" in out
    assert "RLCORE_RAY_TIMEOUT=90" in out
    assert "RLCORE_RAY_START=(--block --disable-usage-stats --num-cpus=32 --num-gpus=8)" in out
    # Head on the first node, bound explicitly; workers on the others, bound to their own address.
    head = out.index('start --head --node-ip-address="$RLCORE_HEAD_IP"')
    workers = out.index('for node in "${RLCORE_NODES[@]:1}"')
    worker = out.index('start --address="$RAY_ADDRESS" --node-ip-address="$ip"')
    join_all = out.index('then wait_for_ray "${#RLCORE_NODES[@]}"')
    driver = out.index('"${RLCORE_WRAP[@]}" "${RLCORE_DRIVER[@]}" &')
    assert head < workers < worker < join_all < driver
    assert 'on_node "$RLCORE_HEAD"' in out and 'on_node "$node"' in out
    assert "srun --nodes=1 --ntasks=1 --overlap -w \"$node\"" in out
    assert "trap stop_ray EXIT" in out


def test_port_defaults_to_one_derived_from_the_job_id(slurm_launcher, launch_request, capsys):
    out = render(slurm_launcher, launch_request, capsys, nodes=2)
    assert "RLCORE_RAY_PORT=$((20000 + SLURM_JOB_ID % 20000))" in out
    assert "RLCORE_IFACE=''" in out


def test_container_wraps_every_command(slurm_launcher, launch_request, capsys, tmp_path):
    out = render(
        slurm_launcher, launch_request, capsys,
        nodes=2, gpus_per_node=2, container="/images/rl.sif", container_binds=["/data", "/models:/models:ro"],
    )
    wrap = re.search(r"^RLCORE_WRAP=\((.*)\)$", out, re.M).group(1)
    assert shlex.split(wrap) == [
        "apptainer", "exec", "--nv", "--bind", str(tmp_path / "run"), "--bind", "/data",
        "--bind", "/models:/models:ro", "/images/rl.sif",
    ]
    assert "command -v apptainer" in out
    # The driver, the Ray processes and the node checks all go through the wrapper.
    assert 'in_job() { "${RLCORE_WRAP[@]}" "$@"; }' in out
    assert '-w "$node" "${RLCORE_WRAP[@]}" "$@"' in out
    no_gpu = render(slurm_launcher, launch_request, capsys, container="/images/rl.sif")
    assert "--nv" not in re.search(r"^RLCORE_WRAP=\((.*)\)$", no_gpu, re.M).group(1)
    plain = render(slurm_launcher, launch_request, capsys)
    assert "RLCORE_WRAP=()" in plain and "apptainer" not in plain


def test_env_and_extra_lines(slurm_launcher, launch_request, capsys):
    out = render(
        slurm_launcher, launch_request, capsys,
        env={"HF_HOME": "/scratch/hf cache", "NCCL_DEBUG": "INFO", "QUOTE": "it's"},
        sbatch_extra=["--qos=high", "#SBATCH --exclusive", "--constraint=a100|h100"],
    )
    assert "export HF_HOME='/scratch/hf cache'" in out
    assert "export NCCL_DEBUG=INFO" in out
    assert "export QUOTE='it'\"'\"'s'" in out
    directives = sbatch_directives(out)
    assert directives[-3:] == ["--qos=high", "--exclusive", "--constraint=a100|h100"]
    # Environment is exported before anything of the job runs.
    assert out.index("export HF_HOME") < out.index("RLCORE_DRIVER=")


def test_resume_is_passed_to_the_driver(slurm_launcher, launch_request, capsys):
    request = launch_request(dry_run=True)
    request.resume = True
    slurm_launcher().launch(request)
    driver = re.search(r"^RLCORE_DRIVER=\((.*)\)$", capsys.readouterr().out, re.M).group(1)
    assert shlex.split(driver)[-1] == "--resume"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("options", [{}, {"nodes": 3, "network_interface": "lo"}, {"container": "/x.sif", "env": {"A": "b c"}}])
def test_rendered_script_is_valid_bash(slurm_launcher, launch_request, capsys, tmp_path, options):
    script = tmp_path / "job.sh"
    script.write_text(render(slurm_launcher, launch_request, capsys, **options).split("[rlcore slurm] dry run")[0])
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    "options, key, words",
    [
        ({"nodes": 0}, "nodes", "greater than or equal to 1"),
        ({"gpus_per_node": -1}, "gpus_per_node", "greater than or equal to 0"),
        ({"time": "two hours"}, "time", "SLURM time limit"),
        ({"mem": "lots"}, "mem", '"64G"'),
        ({"partition": "gpu debug"}, "partition", "no spaces"),
        ({"env": {"1BAD": "x"}}, "env", "environment variable names"),
        ({"sbatch_extra": ["qos=high"]}, "sbatch_extra", "sbatch option"),
        ({"sbatch_extra": ["--qos=high\n#SBATCH --x"]}, "sbatch_extra", "without newlines"),
        ({"nodes": 2, "ray": "off"}, "", 'ray = "off" needs nodes = 1'),
        ({"poll_interval": 0}, "poll_interval", "greater than 0"),
        ({"nodez": 2}, "nodez", "Extra inputs are not permitted"),
    ],
)
def test_bad_options_are_rejected_clearly(options, key, words):
    with pytest.raises(ValidationError) as info:
        SlurmOptions.model_validate(options)
    error = info.value.errors()[0]
    assert ".".join(str(p) for p in error["loc"]).startswith(key)
    assert words in str(info.value)


@pytest.mark.parametrize("value", ["30", "0:30", "4:00:00", "2-12", "1-12:30", "1-12:30:00", "UNLIMITED"])
def test_slurm_time_formats_are_accepted(value):
    assert SlurmOptions(time=value).time == value


def test_stop_signal_only_below_the_time_limit():
    from rlcore_launcher_slurm import script as script_module
    from rlcore_launcher_slurm.options import SlurmOptions, time_limit_seconds

    assert [time_limit_seconds(t) for t in ("30", "2:30", "1:00:00", "1-2", "1-2:03", "1-0:0:5", "UNLIMITED", None)] == [
        1800, 150, 3600, 93600, 93780, 86405, None, None]

    def script(**options):
        return script_module.render(SlurmOptions(**options), manifest={"run": {"name": "x"}}, run_dir="/tmp/run",
                                    driver=["python", "-m", "rlcore"], python="python")

    assert "#SBATCH --signal=B:USR1@120" in script(time="10")
    assert "#SBATCH --signal=B:USR1@120" in script()  # the partition's limit
    assert "--signal" not in script(time="1").replace("# No --signal", "")  # 60 s: no room for 120 s
    assert "--signal" not in script(time="10", stop_signal_s=0)
