"""Reading verl launch scripts as bash would expand them, without running them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from rlcore_verl.shell import ScriptError, find_verl_command

SCRIPTS = Path(__file__).parent / "scripts"
ENV = {"HOME": "/home/u"}


def words(text: str, args=(), environ=ENV, cwd="/work") -> list[str]:
    return [w for w, _ in find_verl_command(text, name="run.sh", args=args, environ=environ, cwd=cwd).words]


def test_continuations_quotes_and_comments():
    text = (
        "set -x\n"
        "# a comment\n"
        "python3 -m verl.trainer.main_ppo \\\n"
        '    trainer.logger=\'["console","wandb"]\' \\\n'
        '    trainer.project_name="my project" \\\n'
        "    data.truncation='error' # trailing comment\n"
        "echo done\n"
    )
    assert words(text) == [
        'trainer.logger=["console","wandb"]',
        "trainer.project_name=my project",
        "data.truncation=error",
    ]


def test_variables_defaults_arithmetic_and_home():
    text = (
        "max_prompt_length=$((1024 * 2))\n"
        "max_response_length=$((1024 * 20))\n"
        "total=$(((max_prompt_length + max_response_length) * 3))\n"
        'DATA=${DATA:-"${HOME}/verl"}\n'
        "EMPTY=\n"
        "OTHER=${EMPTY:-fallback} KEEP=${EMPTY-kept}\n"
        "python3 -m verl.trainer.main_ppo a.len=${max_prompt_length} b.tokens=$total c.path=$DATA/x.parquet "
        'd.x=$OTHER e.y="$KEEP" f.half=$((7 / 2)) g.neg=$((-7 / 2))\n'
    )
    assert words(text) == [
        "a.len=2048",
        "b.tokens=67584",
        "c.path=/home/u/verl/x.parquet",
        "d.x=fallback",
        "e.y=",
        "f.half=3",
        "g.neg=-3",
    ]


def test_an_environment_value_wins_over_a_default():
    text = 'NNODES=${NNODES:-16}\npython3 -m verl.trainer.main_ppo trainer.nnodes="${NNODES}"\n'
    assert words(text, environ={"NNODES": "2"}) == ["trainer.nnodes=2"]
    assert words(text, environ={}) == ["trainer.nnodes=16"]


def test_arrays_positional_parameters_and_shift():
    text = (
        "ENGINE=${1:-vllm}\n"
        "shift\n"
        "DATA_CONFIG=(\n"
        "    # comments inside\n"
        '    data.train_files="$HOME/t.parquet"\n'
        "    data.max_prompt_length=$((512 * 2))\n"
        ")\n"
        "DATA_CONFIG+=(data.shuffle=False)\n"
        'python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.name=$ENGINE "${DATA_CONFIG[@]}" "$@"\n'
    )
    assert words(text, args=["sglang", "trainer.nnodes=2", "x.y=a b"]) == [
        "actor_rollout_ref.rollout.name=sglang",
        "data.train_files=/home/u/t.parquet",
        "data.max_prompt_length=1024",
        "data.shuffle=False",
        "trainer.nnodes=2",
        "x.y=a b",
    ]


def test_unquoted_expansions_split_into_words_as_bash_does():
    text = 'FLAGS="a.x=1 b.y=2"\npython3 -m verl.trainer.main_ppo $FLAGS "c.z=$FLAGS"\n'
    assert words(text) == ["a.x=1", "b.y=2", "c.z=a.x=1 b.y=2"]


def test_the_words_after_the_script_are_marked_as_the_command_line():
    text = "python3 -m verl.trainer.main_ppo a.b=1 $@\n"
    command = find_verl_command(text, name="run.sh", args=["c.d=2"], environ=ENV, cwd="/w")
    assert command.words == [("a.b=1", "run.sh:1"), ("c.d=2", "command line")]


def test_pipes_redirections_and_env_prefixes_are_not_overrides():
    text = "mkdir -p logs\nVLLM_USE_V1=1 python3 -m verl.trainer.main_ppo a.b=1 2>&1 | tee logs/run.log\n"
    assert words(text) == ["a.b=1"]


def test_pwd_and_dirname_are_read_other_command_substitutions_are_kept_and_reported():
    text = 'ROOT=$(pwd)\nHERE=$(dirname "$0")\nSTAMP=$(date +%s)\npython3 -m verl.trainer.main_ppo a=$ROOT b=$HERE c=run_$STAMP\n'
    command = find_verl_command(text, name="run.sh", script_path="/s/run.sh", environ=ENV, cwd="/work")
    assert [w for w, _ in command.words] == ["a=/work", "b=/s", "c=run_$(date +%s)"]
    assert any("$(date +%s) is not run" in note and "run.sh:3" in note for note in command.notes)


def test_a_variable_set_inside_an_if_block_and_used_is_reported():
    text = 'ENGINE=vllm\nif [ "$X" = 1 ]; then\n    ENGINE=sglang\nfi\npython3 -m verl.trainer.main_ppo a=$ENGINE\n'
    command = find_verl_command(text, name="run.sh", environ=ENV, cwd="/w")
    assert [w for w, _ in command.words] == ["a=sglang"]
    assert any("run.sh:3: ENGINE is set inside an if/for/while block" in note for note in command.notes)


def test_ray_job_submit_and_the_dapo_trainer_are_recognised():
    text = (
        'RAY_ADDRESS=${RAY_ADDRESS:-"http://localhost:8265"}\n'
        "ray job submit --no-wait --working-dir . -- python3 -m recipe.dapo.main_dapo a.b=1\n"
    )
    command = find_verl_command(text, name="run.sh", environ={}, cwd="/w")
    assert command.module == "recipe.dapo.main_dapo" and command.ray_job
    assert command.ray_job_address == "http://localhost:8265"
    assert [w for w, _ in command.words] == ["a.b=1"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("echo hello\n", "run.sh: no verl training command found"),
        ("X='unclosed\npython3 -m verl.trainer.main_ppo a=1\n", "run.sh:1: a single quote is never closed"),
        ('python3 -m verl.trainer.main_ppo a="open\n', "run.sh:1: a double quote is never closed"),
        ("X=$((1 +))\npython3 -m verl.trainer.main_ppo a=$X\n", "run.sh:1: $((1 +)) cannot be computed"),
        ("python3 -m verl.trainer.main_ppo a=${X:?set X}\n", "run.sh:1: ${X:?set X}: X is not set"),
    ],
)
def test_unreadable_scripts_are_refused_with_their_line(text, message):
    with pytest.raises(ScriptError) as info:
        find_verl_command(text, name="run.sh", environ={}, cwd="/w")
    assert message in str(info.value)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("*.sh")))
def test_each_fixture_script_expands_exactly_as_bash_runs_it(script, tmp_path):
    """bash runs the script with python3 and ray replaced by stubs that record their arguments."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name in ("python3", "ray"):
        stub = stubs / name
        stub.write_text('#!/bin/bash\nprintf \'%s\\0\' "$@" > "$STUB_OUT"\n')
        stub.chmod(0o755)
    (tmp_path / "logs").mkdir()
    out = tmp_path / "args"
    env = {"PATH": f"{stubs}:{os.environ['PATH']}", "HOME": "/home/u", "STUB_OUT": str(out)}
    args = ["trainer.nnodes=3", "trainer.save_freq=7"]
    subprocess.run(
        ["bash", str(SCRIPTS / script), *args], cwd=tmp_path, env=env, check=True, capture_output=True
    )
    ran = out.read_bytes().decode().split("\0")[:-1]
    command = find_verl_command(
        (SCRIPTS / script).read_text(),
        name=script,
        script_path=str(SCRIPTS / script),
        args=args,
        environ={"HOME": "/home/u"},
        cwd=str(tmp_path),
    )
    assert [w for w, _ in command.words] == ran[ran.index(command.module) + 1 :]
