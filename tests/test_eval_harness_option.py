"""`rlcore eval --harness NAME`: the harness is a registered component of kind eval_harness, built
from --tasks and --harness-option before any model loads; mistakes are one located message."""

from __future__ import annotations

import argparse

import pytest
from pydantic import Field

import rlcore
from rlcore.components import Component, Options
from rlcore.errors import UsageError
from rlcore.evaluation import _harness, configure


class CountingOptions(Options):
    tasks: list[str] = Field(..., min_length=1)
    shots: int = 0


class Harnesses:
    @rlcore.hookimpl
    def rlcore_eval_harnesses(self):
        return [
            Component(
                "counting", factory=lambda options, context: ("built", options), options=CountingOptions
            )
        ]


@pytest.fixture
def registry(toy_registry):
    toy_registry.register(Harnesses(), name="harnesses", distribution="rlcore-harnesses")
    return toy_registry


def parse(*argv):
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(["m.toml", *argv])


def test_tasks_and_options_reach_the_harness(registry):
    component, (built, options) = _harness(
        parse("--harness", "counting", "--tasks", "a, b", "--harness-option", "shots=5"), registry
    )
    assert component.name == "counting" and built == "built"
    assert options.tasks == ["a", "b"] and options.shots == 5


@pytest.mark.parametrize(
    ("argv", "phrase"),
    [
        (
            ("--harness", "countin", "--tasks", "a"),
            "unknown eval harness 'countin' (did you mean 'counting'?)",
        ),
        (("--harness", "counting"), "--tasks: Field required"),
        (
            ("--harness", "counting", "--tasks", "a", "--harness-option", "shots=many"),
            "--harness-option shots: Input should be a valid integer",
        ),
        (
            ("--harness", "counting", "--tasks", "a", "--harness-option", "colour=1"),
            "--harness-option colour: unknown option",
        ),
        (("--harness", "counting", "--tasks", "a", "--harness-option", "shots"), "expects KEY=VALUE"),
    ],
)
def test_mistakes_are_one_message(registry, argv, phrase):
    with pytest.raises(UsageError) as err:
        _harness(parse(*argv), registry)
    assert phrase in str(err.value)
