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
from rlcore_launcher_slurm.options import SlurmOptions

from rlcore.registry import Registry


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


def test_dry_run_renders_resources_and_submits_nothing(
    slurm_launcher, launch_request, capsys, tmp_path, monkeypatch
):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no SLURM commands at all: a dry run needs none
    out = render(
        slurm_launcher,
        launch_request,
        capsys,
        manifest={"run": {"name": "gsm8k grpo"}},
        nodes=1,
        gpus_per_node=4,
        cpus_per_task=16,
        mem="200G",
        partition="gpu",
        account="proj1",
        time="4:00:00",
        python="/opt/py/bin/python",
    )
    run_dir = tmp_path / "run"
    directives = sbatch_directives(out)
    assert directives[:2] == ["--job-name=rlcore-gsm8k_grpo", "--comment=rlcore"]
    for expected in (
        "--nodes=1",
        "--ntasks-per-node=4",
        "--no-requeue",
        "--cpus-per-task=16",
        "--gpus-per-node=4",
        "--mem=200G",
        "--partition=gpu",
        "--account=proj1",
        "--time=4:00:00",
        f"--output={run_dir}/launch/slurm-%j.log",
        f"--chdir={run_dir}",
    ):
        assert expected in directives
    driver = re.search(r"^RLCORE_DRIVER=\((.*)\)$", out, re.M).group(1)
    assert shlex.split(driver) == [
        "/opt/py/bin/python",
        "-m",
        "rlcore",
        "run",
        f"{run_dir}/launch/manifest.toml",
        "--run-dir",
        str(run_dir),
    ]
    # The dry run wrote nothing.
    assert not run_dir.exists()


def test_defaults_leave_resources_to_slurm(slurm_launcher, launch_request, capsys):
    directives = sbatch_directives(render(slurm_launcher, launch_request, capsys))
    options = {d.split("=")[0] for d in directives}
    assert not options & {"--partition", "--account", "--time", "--mem", "--gpus-per-node", "--cpus-per-task"}
    assert f"RLCORE_PYTHON={shlex.quote(sys.executable)}" in render(slurm_launcher, launch_request, capsys)


def test_one_rank_by_default_one_per_gpu_with_gpus(slurm_launcher, launch_request, capsys):
    out = render(slurm_launcher, launch_request, capsys)
    assert "--ntasks-per-node=1" in sbatch_directives(out)
    assert "RLCORE_SRUN=(srun --kill-on-bad-exit=1 --nodes=1 --ntasks-per-node=1)" in out
    assert "OMP_NUM_THREADS" not in out  # one rank on the node: torch's own default
    gpus = render(slurm_launcher, launch_request, capsys, nodes=2, gpus_per_node=8)
    assert {"--nodes=2", "--ntasks-per-node=8", "--gpus-per-node=8"} <= set(sbatch_directives(gpus))
    assert "export LOCAL_WORLD_SIZE=8" in gpus
    assert "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}" in gpus  # as torchrun: one thread per rank
    assert "srun --kill-on-bad-exit=1 --nodes=2 --ntasks-per-node=8)" in gpus
    # Fewer ranks than GPUs (an engine may use the others), each with its CPUs.
    fewer = render(slurm_launcher, launch_request, capsys, gpus_per_node=8, ranks_per_node=4, cpus_per_task=6)
    assert {"--ntasks-per-node=4", "--cpus-per-task=6"} <= set(sbatch_directives(fewer))
    assert "--ntasks-per-node=4 --cpus-per-task=6)" in fewer
    assert "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-6}" in fewer


def _rank_sh(script: str) -> str:
    return shlex.split(re.search(r"^RLCORE_RANK_SH=(.*?)\nRLCORE_DRIVER=", script, re.M | re.S).group(1))[0]


def test_every_rank_starts_through_srun_with_torchrun_variables(slurm_launcher, launch_request, capsys):
    out = render(slurm_launcher, launch_request, capsys, nodes=4, ranks_per_node=2, network_interface="ib0")
    assert "ray" not in out.lower().replace("array", "")  # no Ray cluster in the job
    # The rendezvous is the first node's address on the interface, and a free port found there.
    assert 'RLCORE_RENDEZVOUS=$(in_job "$RLCORE_PYTHON" -c "$RLCORE_RENDEZVOUS_PY" ib0 0)' in out
    assert "export MASTER_ADDR MASTER_PORT" in out
    assert (
        "export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-ib0} NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-ib0}"
        in out
    )
    rank_sh = _rank_sh(out)
    assert "export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS" in rank_sh
    assert 'trap "" USR1' in rank_sh  # only the trainer acts on USR1, not the processes it starts
    launch = '"${RLCORE_SRUN[@]}" "${RLCORE_WRAP[@]}" bash -c "$RLCORE_RANK_SH" rlcore-rank "${RLCORE_DRIVER[@]}" &'
    assert launch in out
    assert out.index("export MASTER_ADDR") < out.index(launch)
    # USR1 goes on to srun (which hands it to every rank); TERM is not handed on.
    assert 'kill -s USR1 "$RLCORE_SRUN_PID"' in out
    assert "kill -s TERM" not in out
    fixed = render(slurm_launcher, launch_request, capsys, nodes=2, master_port=29500)
    assert "\"$RLCORE_RENDEZVOUS_PY\" '' 29500)" in fixed
    assert "GLOO_SOCKET_IFNAME" not in fixed


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_rank_wrapper_sets_the_variables_and_names_a_failed_rank(
    slurm_launcher, launch_request, capsys, tmp_path
):
    """The task wrapper, run as srun would run it (SLURM's variables set by hand)."""
    rank_sh = _rank_sh(render(slurm_launcher, launch_request, capsys, nodes=2, ranks_per_node=2))
    stopped = tmp_path / "job-7.stopped"
    slurm_env = {
        "PATH": "/usr/bin:/bin",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "4",
        "SLURM_NODEID": "1",
        "SLURMD_NODENAME": "node7",
        "RLCORE_STOPPED_FILE": str(stopped),
    }

    def task(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "-c", rank_sh, "rlcore-rank", *argv], env=slurm_env, capture_output=True, text=True
        )

    proc = task("bash", "-c", 'echo "$RANK $LOCAL_RANK $WORLD_SIZE $NODE_RANK"')
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "3 1 4 1\n", "")
    proc = task("bash", "-c", "kill -9 $$")
    assert proc.returncode == 137
    assert (
        "[rlcore] error: rank 3 (local rank 1 on node node7) exited with status 137 (signal 9)" in proc.stderr
    )
    assert not stopped.exists()
    # A rank that stopped for USR1 (checkpoint written, exit 138) is no failure for srun, which
    # would end the other ranks while they finish the same stop; the job reads the status back.
    proc = task("bash", "-c", "exit 138")
    assert (proc.returncode, proc.stderr) == (0, "")
    assert stopped.read_text() == "138\n"
    # USR1 (srun hands it to every process of the step) is ignored by the wrapper and by what it
    # starts, until a process installs a handler (the trainer does).
    proc = task(
        sys.executable,
        "-c",
        "import os, signal; os.kill(os.getppid(), signal.SIGUSR1); "
        "os.kill(os.getpid(), signal.SIGUSR1); print('alive')",
    )
    assert (proc.returncode, proc.stdout) == (0, "alive\n"), proc.stderr


def test_container_wraps_every_command(slurm_launcher, launch_request, capsys, tmp_path):
    out = render(
        slurm_launcher,
        launch_request,
        capsys,
        nodes=2,
        gpus_per_node=2,
        container="/images/rl.sif",
        container_binds=["/data", "/models:/models:ro"],
    )
    wrap = re.search(r"^RLCORE_WRAP=\((.*)\)$", out, re.M).group(1)
    assert shlex.split(wrap) == [
        "apptainer",
        "exec",
        "--nv",
        "--bind",
        str(tmp_path / "run"),
        "--bind",
        "/data",
        "--bind",
        "/models:/models:ro",
        "/images/rl.sif",
    ]
    assert "command -v apptainer" in out
    # The rendezvous and every rank run through the wrapper.
    assert 'in_job() { "${RLCORE_WRAP[@]}" "$@"; }' in out
    assert "RLCORE_RENDEZVOUS=$(in_job " in out
    assert '"${RLCORE_SRUN[@]}" "${RLCORE_WRAP[@]}" bash -c' in out
    no_gpu = render(slurm_launcher, launch_request, capsys, container="/images/rl.sif")
    assert "--nv" not in re.search(r"^RLCORE_WRAP=\((.*)\)$", no_gpu, re.M).group(1)
    plain = render(slurm_launcher, launch_request, capsys)
    assert "RLCORE_WRAP=()" in plain and "apptainer" not in plain


def test_env_and_extra_lines(slurm_launcher, launch_request, capsys):
    out = render(
        slurm_launcher,
        launch_request,
        capsys,
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
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"nodes": 3, "network_interface": "lo", "ranks_per_node": 2, "master_port": 29500},
        {"container": "/x.sif", "env": {"A": "b c"}},
    ],
)
def test_rendered_script_is_valid_bash(slurm_launcher, launch_request, capsys, tmp_path, options):
    script = tmp_path / "job.sh"
    script.write_text(
        render(slurm_launcher, launch_request, capsys, **options).split("[rlcore slurm] dry run")[0]
    )
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
        ({"nodes": 2, "ray": "off"}, "ray", "Extra inputs are not permitted"),  # no Ray cluster any more
        ({"gpus_per_node": 2, "ranks_per_node": 3}, "", "each rank needs a GPU of its own"),
        ({"ranks_per_node": 0}, "ranks_per_node", "greater than or equal to 1"),
        ({"master_port": 80}, "master_port", "greater than or equal to 1024"),
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

    assert [
        time_limit_seconds(t)
        for t in ("30", "2:30", "1:00:00", "1-2", "1-2:03", "1-0:0:5", "UNLIMITED", None)
    ] == [1800, 150, 3600, 93600, 93780, 86405, None, None]

    def script(**options):
        return script_module.render(
            SlurmOptions(**options),
            manifest={"run": {"name": "x"}},
            run_dir="/tmp/run",
            driver=["python", "-m", "rlcore"],
            python="python",
        )

    assert "#SBATCH --signal=B:USR1@120" in script(time="10")
    assert "#SBATCH --signal=B:USR1@120" in script()  # the partition's limit
    assert "--signal" not in script(time="1").replace("# No --signal", "")  # 60 s: no room for 120 s
    assert "--signal" not in script(time="10", stop_signal_s=0)
