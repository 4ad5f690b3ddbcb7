"""The rendered SkyPilot task (what `rlcore run --dry-run` prints), checked with SkyPilot's own
task parser: resources, nodes, envs, setup and run parse and survive a round trip. Needs no cloud."""

from __future__ import annotations

import copy
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from rlcore_launcher_skypilot.options import SkyPilotOptions
from rlcore_launcher_skypilot.states import EXIT_CODE_NAMES, outcome, state_of_exit_code
from rlcore_launcher_skypilot.task import MANIFEST_EOF

from rlcore.errors import UsageError
from rlcore.testing import require_plugins
from rlcore.testing.runs import TINY_RUN, deep_update

REPO = Path(__file__).resolve().parents[3]  # this repository: rlcore at its root, plugins/*

sky = pytest.importorskip("sky", reason="SkyPilot is this plugin's dependency: pip install skypilot")


def dry_run(launcher, request, capsys) -> tuple[str, dict]:
    assert launcher.launch(request) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("[rlcore skypilot] dry run: nothing was launched")
    text = "".join(line + "\n" for line in out.splitlines() if not line.startswith("[rlcore skypilot]"))
    return text, yaml.safe_load(text)


def node_manifest(config: dict) -> dict:
    """The driver manifest the run script writes on each node (between its heredoc markers)."""
    run = config["run"]
    start = run.index(f"<<'{MANIFEST_EOF}'\n") + len(f"<<'{MANIFEST_EOF}'\n")
    return tomllib.loads(run[start : run.index(f"\n{MANIFEST_EOF}\n", start)])


def test_the_task_parses_with_skypilot_and_round_trips(sky_launcher, launch_request, capsys, tmp_path):
    launcher = sky_launcher(
        accelerators="H100:8",
        nodes=4,
        cloud="aws",
        region="us-east-1",
        cpus="32+",
        memory="256+",
        disk_size=512,
        use_spot=True,
        env={"HF_HOME": "/scratch/hf cache", "NCCL_DEBUG": "INFO"},
    )
    text, config = dry_run(launcher, launch_request(dry_run=True), capsys)
    assert text.startswith("# rlcore run gsm8k grpo: rendered by rlcore-launcher-skypilot.\n")
    assert config["name"] == "rlcore-gsm8k-grpo"
    task = sky.Task.from_yaml_config(copy.deepcopy(config))  # it pops what it reads
    assert task.num_nodes == 4
    (resources,) = list(task.resources)
    assert resources.accelerators == {"H100": 8}
    assert str(resources.cloud).lower() == "aws" and resources.region == "us-east-1"
    assert resources.use_spot and resources.disk_size == 512
    assert (resources.cpus, resources.memory) == ("32+", "256+")
    assert task.envs == {"HF_HOME": "/scratch/hf cache", "NCCL_DEBUG": "INFO"}
    assert task.setup == config["setup"] and task.run == config["run"]
    # SkyPilot's own YAML of the task parses back to the same task.
    again = sky.Task.from_yaml_config(yaml.safe_load(yaml.safe_dump(task.to_yaml_config())))
    assert (again.num_nodes, again.envs, again.setup, again.run) == (4, task.envs, task.setup, task.run)
    assert list(again.resources)[0].accelerators == {"H100": 8}
    # Nothing was written by a dry run.
    assert not (tmp_path / "run").exists()


def test_setup_installs_rlcore_and_the_runs_plugins_at_their_versions(sky_launcher, launch_request, capsys):
    import rlcore

    _, config = dry_run(
        sky_launcher(pip_extra=["flash-attn==2.8.0"], setup_extra=["nvidia-smi"]),
        launch_request(dry_run=True),
        capsys,
    )
    setup = config["setup"].splitlines()
    install = next(line for line in setup if "-m pip install" in line)
    assert install == (
        f"\"$RLCORE_PYTHON\" -m pip install 'rlcore[train]=={rlcore.__version__}' "
        "rlcore-algo-grpo==0.1.0 rlcore-reward-rule==0.2.0 rlcore-rollout-hf==0.3.1 flash-attn==2.8.0"
    )
    # Not the core's own components, and not this launcher: the nodes run the `local` one.
    assert "rlcore-launcher-skypilot" not in config["setup"]
    assert setup.index("nvidia-smi") > setup.index(install)
    assert setup[-1] == '"$RLCORE_PYTHON" -m rlcore --version'
    _, none = dry_run(sky_launcher(install="none"), launch_request(dry_run=True), capsys)
    assert "pip install" not in none["setup"]


def test_install_from_the_workdir_finds_each_distributions_directory(sky_launcher, launch_request, capsys):
    _, config = dry_run(
        sky_launcher(install="workdir", workdir=str(REPO)), launch_request(dry_run=True), capsys
    )
    assert config["workdir"] == str(REPO)
    assert 'cd "$HOME/sky_workdir"' in config["setup"]
    assert (
        "\"$RLCORE_PYTHON\" -m pip install -e '.[train]' -e ./plugins/algo_grpo -e ./plugins/reward_rule "
        "-e ./plugins/rollout_hf"
    ) in config["setup"]
    sky.Task.from_yaml_config(copy.deepcopy(config))  # it pops what it reads
    launcher = sky_launcher(
        install="workdir",
        workdir=str(REPO),
        plugins={"tools.x": {"name": "x", "distribution": "rlcore-tool-x", "version": "1"}},
    )
    with pytest.raises(UsageError, match=r"no pyproject.toml in workdir .* names rlcore-tool-x"):
        launcher.launch(launch_request(dry_run=True))


def test_manifest_paths_point_at_the_nodes_copies(sky_launcher, launch_request, capsys, tmp_path):
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "train.jsonl").write_text("{}\n")
    (project / "reward.py").write_text("def f(item):\n    return 0.0\n")
    models = tmp_path / "models"
    (models / "tiny").mkdir(parents=True)
    manifest = {
        "run": {"name": "paths", "output_dir": str(tmp_path / "outputs")},
        "model": {"path": str(models / "tiny")},
        "data": {"train": str(project / "data" / "train.jsonl"), "val": "synthetic:addition?size=8"},
        "reward": {"function": f"python:{project / 'reward.py'}:f"},
        "launcher": {"name": "local"},
    }
    launcher = sky_launcher(
        workdir=str(project),
        file_mounts={"/models": str(models), "/ckpt": {"name": "b", "mode": "MOUNT"}},
        remote_run_dir="/ckpt/paths",
        nodes=2,
    )
    _, config = dry_run(launcher, launch_request(manifest=manifest, dry_run=True), capsys)
    node = node_manifest(config)
    assert node["model"]["path"] == "/models/tiny"
    # The workdir's files at the node's copy; the run script puts the node's $HOME for @RLCORE_HOME@.
    assert node["data"] == {
        "train": "@RLCORE_HOME@/sky_workdir/data/train.jsonl",
        "val": "synthetic:addition?size=8",
    }
    assert node["reward"]["function"] == "python:@RLCORE_HOME@/sky_workdir/reward.py:f"
    assert node["run"] == {"name": "paths", "output_dir": "/ckpt"}
    assert node["launcher"] == {"name": "local"}
    assert config["file_mounts"] == {"/models": str(models), "/ckpt": {"name": "b", "mode": "MOUNT"}}
    task = sky.Task.from_yaml_config(copy.deepcopy(config))  # it pops what it reads
    assert task.workdir == str(project)
    # The driver runs that manifest in the node's run directory.
    assert 'RLCORE_RUN_DIR="/ckpt/paths"' in config["run"]
    assert (
        'RLCORE_DRIVER=("$RLCORE_PYTHON" -m rlcore run "$RLCORE_MANIFEST" --run-dir "$RLCORE_RUN_DIR")'
        in config["run"]
    )
    # A path on this machine only is refused, named by its key.
    with pytest.raises(UsageError, match=r"model\.path = '.*/models/tiny': .* is on this machine only"):
        sky_launcher(workdir=str(project)).launch(launch_request(manifest=manifest, dry_run=True))


def test_ranks_default_to_the_gpus_and_resume_reaches_the_driver(sky_launcher, launch_request, capsys):
    _, config = dry_run(
        sky_launcher(accelerators="A100:4"), launch_request(dry_run=True, resume=True), capsys
    )
    assert "RLCORE_RANKS=${SKYPILOT_NUM_GPUS_PER_NODE:-0}" in config["run"]
    assert '--run-dir "$RLCORE_RUN_DIR" --resume)' in config["run"]
    assert 'RLCORE_RUN_DIR="$HOME/rlcore-runs/gsm8k grpo"' in config["run"]
    _, fixed = dry_run(
        sky_launcher(ranks_per_node=2, master_port=29600), launch_request(dry_run=True), capsys
    )
    assert "RLCORE_RANKS=2" in fixed["run"] and "MASTER_PORT=29600" in fixed["run"]


@pytest.mark.parametrize("options", [{}, {"accelerators": "H100:8", "nodes": 2, "workdir": "/tmp"}])
def test_setup_and_run_are_valid_bash(sky_launcher, launch_request, capsys, tmp_path, options):
    _, config = dry_run(sky_launcher(**options), launch_request(dry_run=True), capsys)
    for part in ("setup", "run"):
        script = tmp_path / f"{part}.sh"
        script.write_text(config[part])
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, (part, proc.stderr)


def test_a_multi_node_run_without_a_shared_run_directory_is_warned_about(
    sky_launcher, launch_request, capsys
):
    sky_launcher(nodes=2).launch(launch_request(dry_run=True))
    assert (
        "warning: 2 nodes and the run directory ~/rlcore-runs/gsm8k grpo is on no file mount"
        in capsys.readouterr().out
    )
    sky_launcher(nodes=2, remote_run_dir="/ckpt/x", file_mounts={"/ckpt": "gs://bucket"}).launch(
        launch_request(dry_run=True)
    )
    assert "warning" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "options, key, words",
    [
        ({"accelerators": "H100:x"}, "accelerators", '"NAME:COUNT"'),
        ({"accelerators": "H100:0"}, "accelerators", "at least 1"),
        ({"nodes": 0}, "nodes", "greater than or equal to 1"),
        ({"cpus": "many"}, "cpus", '"32+"'),
        ({"region": "us east"}, "region", "no spaces"),
        ({"cluster_name": "1abc"}, "cluster_name", "a letter first"),
        ({"env": {"RANK": "3"}}, "env", "set for each rank"),
        ({"env": {"1BAD": "x"}}, "env", "environment variable names"),
        ({"install": "conda"}, "install", "'pip', 'workdir' or 'none'"),
        ({"install": "workdir"}, "", "set workdir too"),
        ({"accelerators": "L4:2", "ranks_per_node": 3}, "", "each rank needs a GPU of its own"),
        ({"managed": True, "down": True}, "", "cluster mode"),
        ({"setup_extra": ["a\nb"]}, "setup_extra", "one non-empty line"),
        ({"num_nodes": 2}, "num_nodes", "Extra inputs are not permitted"),
    ],
)
def test_bad_options_are_rejected_clearly(options, key, words):
    with pytest.raises(ValidationError) as info:
        SkyPilotOptions.model_validate(options)
    error = info.value.errors()[0]
    assert ".".join(str(p) for p in error["loc"]).startswith(key)
    assert words in str(info.value)


def test_bad_options_are_located_in_the_manifest(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text(
        '[run]\nname = "x"\n\n[launcher]\nname = "skypilot"\naccelerators = "H100:eight"\nnodez = 2\n'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore", "validate", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert f"{path}:6: [launcher.accelerators]" in out and '"NAME:COUNT"' in out
    assert f"{path}:7: [launcher.nodez]" in out
    assert "Traceback" not in out


def test_final_states_map_to_exit_codes():
    from sky import exceptions
    from sky.jobs.state import ManagedJobStatus
    from sky.skylet.job_lib import JobStatus

    assert outcome(JobStatus.SUCCEEDED) == (0, "the job succeeded")
    assert outcome(JobStatus.FAILED)[0] == 1
    assert "setup failed" in outcome(JobStatus.FAILED_SETUP)[1]
    assert outcome(JobStatus.CANCELLED)[0] == 1
    # Every final state of SkyPilot's has an outcome; no state that is still under way has one.
    for status in list(JobStatus) + list(ManagedJobStatus):
        assert (outcome(status) is not None) == status.is_terminal(), status
    # tail_logs' return values, by SkyPilot's own names.
    assert {int(c): c.name for c in exceptions.JobExitCode} == EXIT_CODE_NAMES
    assert outcome(state_of_exit_code(int(exceptions.JobExitCode.SUCCEEDED)))[0] == 0
    assert outcome(state_of_exit_code(int(exceptions.JobExitCode.FAILED)))[0] == 1
    assert outcome(state_of_exit_code(int(exceptions.JobExitCode.NOT_FINISHED))) is None


def test_listing_and_validating_import_neither_sky_nor_torch(tmp_path):
    path = tmp_path / "m.toml"
    path.write_text('[run]\nname = "x"\n[launcher]\nname = "skypilot"\naccelerators = "H100:8"\n')
    code = (
        "import sys\n"
        "from rlcore.registry import Registry\n"
        "registry = Registry.discover()\n"
        "component = registry.get('launcher', 'skypilot')\n"
        "assert component.distribution == 'rlcore-launcher-skypilot', component.distribution\n"
        "from rlcore.cli import main\n"
        f"try:\n    main(['validate', {str(path)!r}])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('sky', 'torch', 'yaml') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "HEAVY [" in proc.stdout, proc.stdout + proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("HEAVY"))
    assert "'sky'" not in line and "'torch'" not in line, line


def test_rlcore_run_dry_run_prints_a_task_skypilot_parses(tmp_path, request):
    """The whole path through the CLI: the manifest's own components, their installed versions."""
    require_plugins("rlcore_rollout_hf", "rlcore_reward_rule", "rlcore_algo_grpo")
    tiny_model = request.getfixturevalue("tiny_model")
    doc = deep_update(TINY_RUN, {"model": {"path": str(tiny_model)}})
    doc["launcher"] = {
        "name": "skypilot",
        "accelerators": "L4:1",
        "file_mounts": {str(tiny_model): str(tiny_model)},
    }
    path = tmp_path / "manifest.toml"
    import tomli_w

    path.write_text(tomli_w.dumps(doc))
    proc = subprocess.run(
        [sys.executable, "-m", "rlcore", "run", str(path), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = "".join(line + "\n" for line in proc.stdout.splitlines() if not line.startswith("[rlcore"))
    config = yaml.safe_load(text)
    task = sky.Task.from_yaml_config(copy.deepcopy(config))
    assert list(task.resources)[0].accelerators == {"L4": 1}
    for dist in ("rlcore-rollout-hf", "rlcore-reward-rule", "rlcore-algo-grpo"):
        assert f"{dist}=={version(dist)}" in config["setup"]
    assert node_manifest(config)["model"]["path"] == str(tiny_model)
    assert node_manifest(config)["launcher"] == {"name": "local"}
    assert not Path(tmp_path / "outputs").exists()
