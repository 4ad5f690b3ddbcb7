"""docs/plugins.md, the plugin author's guide: one section per kind of rlcore/kinds.py naming its
hook and kit, and its two complete examples (an advantage estimator, a batch filter) work as
written: written out from the page, they import only the plugin API, pass their kits, install
through their entry points and train a step of a tiny model."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

from rlcore.kinds import KINDS
from rlcore.testing.api import check_plugin_imports, describe_violations

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "plugins.md"
FILE_BLOCK = re.compile(r"<!-- guide-file: (\S+) -->\n```\w*\n(.*?)```", re.S)
EXAMPLES = {"rlcore-median": "rlcore_median", "rlcore-spread": "rlcore_spread"}


def guide() -> str:
    return GUIDE.read_text(encoding="utf-8")


def sections() -> dict[str, str]:
    parts = re.split(r"^## ", guide(), flags=re.M)[1:]
    return {part.split("\n", 1)[0].strip(): part for part in parts}


def test_one_section_per_kind_naming_its_hook_and_kit():
    found = sections()
    for kind in KINDS:
        assert kind.name in found, f"docs/plugins.md has no '## {kind.name}' section"
        text = found[kind.name]
        assert f"`{kind.hook}`" in text, f"section {kind.name} does not name its hook {kind.hook}"
        if kind.kit is not None:
            module, function = kind.kit.split(":")
            assert f"{module}.{function}" in text, f"section {kind.name} does not name its kit {kind.kit}"
        else:
            assert "Kit:** none yet" in text, (
                f"section {kind.name} names no kit and does not say there is none"
            )
        assert "```python" in text, f"section {kind.name} has no example"


def test_the_readme_links_the_guide():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Write your own plugin", 1)[1].split("\n## ", 1)[0]
    assert "docs/plugins.md" in section


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The guide's example distributions, installed into a site directory as pip would leave them:
    the packages, and a dist-info with each pyproject's entry points."""
    files = FILE_BLOCK.findall(guide())
    assert {path.split("/")[0] for path, _ in files} == set(EXAMPLES), [path for path, _ in files]
    root = tmp_path_factory.mktemp("guide")
    site = root / "site"
    site.mkdir()
    for path, body in files:
        target = root / "projects" / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body, encoding="utf-8")
    for distribution, package in EXAMPLES.items():
        project = root / "projects" / distribution
        meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
        assert meta["name"] == distribution
        (site / package).mkdir()
        (site / package / "__init__.py").write_text("")
        for source in (project / "src" / package).glob("*.py"):
            (site / package / source.name).write_text(source.read_text())
        info = site / f"{package}-{meta['version']}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {meta['version']}\n"
        )
        entries = meta["entry-points"]["rlcore"]
        (info / "entry_points.txt").write_text(
            "[rlcore]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items())
        )
    return root


@pytest.fixture
def importable(site, monkeypatch):
    monkeypatch.syspath_prepend(str(site / "site"))
    yield site
    for name in list(sys.modules):
        if name.split(".")[0] in EXAMPLES.values():
            del sys.modules[name]


def test_the_examples_import_only_the_plugin_api(site):
    for distribution, package in EXAMPLES.items():
        files = sorted((site / "projects" / distribution).rglob("*.py"))
        assert len(files) == 3, files  # plugin.py, the implementation, the test
        violations = check_plugin_imports(files, own={package}, root=site)
        assert not violations, describe_violations(violations)
        for file in files:  # rlcore and rlcore.testing, the standard library, pydantic, torch
            for line in file.read_text().splitlines():
                if line.startswith(("import ", "from ")):
                    top = line.split()[1].split(".")[0]
                    assert top in {"rlcore", package, "pydantic", "torch", "__future__"}, (
                        f"{file.name}: {line}"
                    )


def test_the_examples_pass_their_kits(importable, rlcore_registry, rlcore_register):
    pytest.importorskip("torch")
    import rlcore_median.plugin
    import rlcore_spread.plugin

    from rlcore.testing import isolated_registry, register
    from rlcore.testing.algorithms import check_advantage_estimator
    from rlcore.testing.shaping import check_batch_filter

    rlcore_register(rlcore_median.plugin, name="median")
    rlcore_register(rlcore_spread.plugin, name="spread")
    check_advantage_estimator(rlcore_registry.get("advantage_estimator", "median_baseline"), {"scale": 2.0})
    check_batch_filter(rlcore_registry.get("batch_filter", "spread"), {"min_spread": 0.5})
    # The examples' own tests, as the guide writes them, pass too.
    for distribution in EXAMPLES:
        test_file = next((importable / "projects" / distribution / "tests").glob("test_*.py"))
        namespace: dict = {}
        exec(compile(test_file.read_text(), str(test_file), "exec"), namespace)  # noqa: S102
        for name, function in namespace.items():
            if name.startswith("test_"):  # with the fixtures it asks for, fresh
                fresh = isolated_registry()
                function(fresh, lambda plugin, name=None, _r=fresh: register(_r, plugin, name=name))


def test_a_broken_estimator_fails_the_kit(importable, rlcore_registry, rlcore_register):
    """The kit the guide points to catches the mistake the example avoids: a baseline leaking
    onto padding."""
    pytest.importorskip("torch")
    import rlcore_median.estimator as estimator
    import torch

    from rlcore.components import Component
    from rlcore.testing.algorithms import check_advantage_estimator

    def leaky(options, context):
        median = estimator.MedianBaseline(1.0)

        def call(batch):
            advantages, returns = median(batch)
            return advantages + 0.1 * (1 - batch.response_mask.to(torch.float32)), returns

        return call

    component = Component("leaky", leaky, description="")
    with pytest.raises(AssertionError, match="not 0 outside the response mask"):
        check_advantage_estimator(component)


@pytest.mark.slow
def test_the_examples_install_by_entry_point_and_train_a_step(site, tmp_path, tiny_model):
    from rlcore.testing import require_plugins
    from rlcore.testing.runs import TINY_RUN_PLUGINS, run_cli, train_rows, write_run_manifest

    require_plugins(*TINY_RUN_PLUGINS)
    import os

    env = {"PYTHONPATH": os.pathsep.join([str(site / "site"), os.environ.get("PYTHONPATH", "")])}
    listed = run_cli("plugins", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert '"rlcore-median"' in listed.stdout and '"rlcore-spread"' in listed.stdout
    manifest = write_run_manifest(
        tmp_path,
        tiny_model,
        trainer={"steps": 1},
        algorithm={"advantage": "median_baseline", "scale": 2.0},
        filters={"spread": {"min_spread": 0.0}},
    )
    run_dir = tmp_path / "run"
    proc = run_cli("run", str(manifest), "--run-dir", str(run_dir), env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = train_rows(run_dir)
    assert len(rows) == 1
    plugins = tomllib.loads((run_dir / "manifest.resolved.toml").read_text())["plugins"]
    assert plugins["algorithm.advantage"] == {
        "name": "median_baseline",
        "distribution": "rlcore-median",
        "version": "0.1.0",
    }
    assert plugins["filters.spread"] == {
        "name": "spread",
        "distribution": "rlcore-spread",
        "version": "0.1.0",
    }
