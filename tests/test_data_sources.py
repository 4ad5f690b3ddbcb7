"""The data-source kind: ``[data] train = "NAME:ARGS?key=value"`` or a ``[data.train]`` table picks a
registered source, whose options are validated with the manifest and whose rows the trainer reads
by role (train/val)."""

from __future__ import annotations

from typing import Literal

import pytest

import rlcore
from rlcore.components import Component, Options
from rlcore.data.prompts import check_data_spec, read_source
from rlcore.data.sources import source_spec
from rlcore.errors import ManifestError, RlcoreError
from rlcore.manifest.loader import load_manifest

VALID = """\
[model]
path = "org/model"

[run]
name = "t"

[data]
train = "synthetic:addition"

[rollout]
engine = "toy"
samples_per_prompt = 2

[reward]
function = "match"

[algorithm]
advantage = "group"
policy_loss = "clipped"

[trainer]
steps = 3
"""


class CountingOptions(Options):
    word: str = "x"
    size: int = 3
    split: Literal["train", "test"] | None = None


class CountingSource:
    def __init__(self, options):
        self.options = options

    def rows(self, role):
        split = self.options.split or ("test" if role == "val" else "train")
        return [
            {"prompt": f"{self.options.word} {split} {i}", "data_source": "counting"}
            for i in range(self.options.size)
        ]


class SourcePlugin:
    @rlcore.hookimpl
    def rlcore_data_sources(self):
        return [
            Component(
                "counting",
                factory=lambda options, context: CountingSource(options),
                options=CountingOptions,
                target_option="word",
                description="rows that count",
            )
        ]


@pytest.fixture
def registry(toy_registry):
    toy_registry.register(SourcePlugin(), name="counting", distribution="rlcore-counting")
    return toy_registry


def test_a_spec_names_a_source_or_a_file():
    assert source_spec("data/train.parquet") is None
    assert source_spec("/abs/x.jsonl") is None
    assert source_spec("package:mypkg/data.jsonl") is None  # a path scheme, resolved by the loader
    parsed = source_spec("counting:hello?size=2&split=test")
    assert (parsed.name, parsed.target, parsed.query) == ("counting", "hello", {"size": "2", "split": "test"})
    table = source_spec({"source": "counting", "size": 2})
    assert (table.name, table.target, table.query) == ("counting", "", {"size": 2})
    with pytest.raises(RlcoreError, match="needs source"):
        source_spec({"size": 2})
    with pytest.raises(RlcoreError, match="given twice"):
        source_spec("counting:a?size=1&size=2")


def test_rows_come_by_role_and_options_are_typed(registry):
    train, name = read_source("counting:hi?size=2", registry=registry)
    assert name == "counting:hi?size=2"
    assert [r["prompt"] for r in train] == ["hi train 0", "hi train 1"]
    val, _ = read_source("counting:hi?size=1", role="val", registry=registry)
    assert [r["prompt"] for r in val] == ["hi test 0"]
    table, _ = read_source({"source": "counting", "word": "t", "size": 1}, registry=registry)
    assert table[0]["prompt"] == "t train 0"


def test_bad_specs_are_explained(registry):
    assert "unknown data source 'countin'" in check_data_spec("countin:x", registry=registry)
    assert "did you mean 'counting'" in check_data_spec("countin:x", registry=registry)
    bad = check_data_spec("counting:x?size=many", registry=registry)
    assert (
        "size" in bad and "integer" in bad and "options of data source 'counting': word, size, split" in bad
    )
    assert "unknown option" in check_data_spec("counting:x?colour=red", registry=registry)
    assert check_data_spec("synthetic:addition?size=3") is None  # the builtin source


def test_a_source_spec_is_validated_with_the_manifest_and_located(tmp_path, registry):
    path = tmp_path / "m.toml"
    path.write_text(
        VALID.replace('train = "synthetic:addition"', 'train = "counting:x?size=0x"\nval = "counting:y"')
    )
    with pytest.raises(ManifestError) as err:
        load_manifest(path, registry=registry)
    text = str(err.value)
    assert "m.toml:8: [data.train]" in text and "size" in text and "data.val" not in text
    text = VALID.replace(
        '[data]\ntrain = "synthetic:addition"', '[data.train]\nsource = "counting"\nsize = 2'
    )
    path.write_text(text)
    manifest = load_manifest(path, registry=registry)
    assert manifest.core.data.train == {"source": "counting", "size": 2}
    # The source is recorded with its distribution, as every selected component is.
    assert manifest.data_sources["data.train"].options.size == 2
    assert manifest.resolved_dict()["plugins"]["data.train"]["distribution"] == "rlcore-counting"
    assert manifest.resolved_dict()["data"]["train"] == {"source": "counting", "size": 2}
    path.write_text(text.replace("size = 2", "size = 2\nshape = 1"))
    with pytest.raises(ManifestError, match=r"\[data.train\].*shape: unknown option"):
        load_manifest(path, registry=registry)


class FileOptions(Options):
    file: str

    @classmethod
    def _where(cls, value: str, info) -> str:
        from pathlib import Path

        base = (info.context or {}).get("manifest_dir") if isinstance(info.context, dict) else None
        path = Path(value) if Path(value).is_absolute() or base is None else Path(base) / value
        if not path.is_file():
            raise ValueError(f"no file {str(path)!r}")
        return str(path)

    from pydantic import field_validator

    _check = field_validator("file")(_where)


class FileSourcePlugin:
    @rlcore.hookimpl
    def rlcore_data_sources(self):
        def build(options, context):
            class Rows:
                def rows(self, role):
                    from pathlib import Path

                    return [
                        {"prompt": line, "data_source": "lines"}
                        for line in Path(options.file).read_text().split()
                    ]

            return Rows()

        return [
            Component(
                "lines",
                factory=build,
                options=FileOptions,
                target_option="file",
                description="a file's words",
            )
        ]


def test_a_source_naming_a_file_reads_it_relative_to_the_manifest(tmp_path, registry, monkeypatch):
    """The manifest's directory reaches a source's options as the validation context manifest_dir,
    at `rlcore validate` and when the trainer reads the rows (base_dir), whatever the working directory."""
    registry.register(FileSourcePlugin(), name="lines", distribution="rlcore-lines")
    (tmp_path / "words.txt").write_text("alpha beta")
    path = tmp_path / "m.toml"
    path.write_text(VALID.replace('train = "synthetic:addition"', 'train = "lines:words.txt"'))
    monkeypatch.chdir("/")
    manifest = load_manifest(path, registry=registry)
    assert manifest.data_sources["data.train"].options.file == str(tmp_path / "words.txt")
    rows, _ = read_source("lines:words.txt", tmp_path, registry=registry)
    assert [r["prompt"] for r in rows] == ["alpha", "beta"]
    assert "no file" in check_data_spec(
        "lines:words.txt", registry=registry
    )  # no manifest: the working directory
    assert check_data_spec("lines:words.txt", tmp_path, registry=registry) is None
