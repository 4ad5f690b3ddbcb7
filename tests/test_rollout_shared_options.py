"""rlcore.engine_kit.options: the engine_args / servers / mode checks every engine's options share,
and that importing it stays light enough for ``rlcore validate``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlcore.engine_kit.options import (
    check_engine_args,
    check_mode,
    check_server_urls,
    read_names,
    unknown_name_message,
)

KNOWN = frozenset({"max_num_seqs", "swap_space", "block_size"})
OWN = {"tp_size": "tensor_parallel_size"}


def test_known_engine_args_pass():
    check_engine_args({"swap_space": 4, "block_size": 16}, known=KNOWN, own_fields=OWN, where="Eng 1.0")


def test_unknown_engine_arg_suggests_the_close_name_and_lists_the_valid_ones():
    with pytest.raises(ValueError) as info:
        check_engine_args({"swap_spase": 4}, known=KNOWN, own_fields=OWN, where="Eng 1.0 (Args)")
    msg = str(info.value)
    assert msg.startswith("'swap_spase' is not an argument of Eng 1.0 (Args); did you mean 'swap_space'?")
    assert msg.endswith("Valid names: block_size, max_num_seqs, swap_space")


def test_a_key_with_its_own_option_is_refused_naming_the_option_and_all_problems_are_reported():
    with pytest.raises(ValueError) as info:
        check_engine_args({"tp_size": 2, "zzz": 1}, known=KNOWN | {"tp_size"}, own_fields=OWN, where="Eng")
    first, second = str(info.value).split("; ", 1)
    assert first == "'tp_size' has its own option: set rollout.tensor_parallel_size instead"
    assert second.startswith("'zzz' is not an argument of Eng.") and "did you mean" not in second


def test_unknown_name_message_without_a_close_name():
    assert unknown_name_message("qqq", {"a", "b"}, "X") == "'qqq' is not an argument of X. Valid names: a, b"


def test_server_urls_are_normalised_and_checked():
    assert check_server_urls(["http://h:1/", "https://h:2"], "http://127.0.0.1:8000") == [
        "http://h:1",
        "https://h:2",
    ]
    with pytest.raises(ValueError, match="server 'h:1' must be a base URL such as http://127.0.0.1:8000"):
        check_server_urls(["h:1"], "http://127.0.0.1:8000")
    with pytest.raises(ValueError, match="a server is listed twice"):
        check_server_urls(["http://h:1", "http://h:1"], "x")


def test_mode_and_servers_go_together():
    check_mode("server", ["http://h:1"])
    check_mode("colocated", [])
    with pytest.raises(ValueError, match="mode = 'server' needs servers"):
        check_mode("server", [])
    with pytest.raises(ValueError, match="servers are only used with mode = 'server'"):
        check_mode("colocated", ["http://h:1"])


def test_read_names_skips_comments_and_blank_lines(tmp_path, monkeypatch):
    pkg = tmp_path / "names_pkg_for_test"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "data" / "x.txt").write_text("# read from somewhere\nalpha\n\n  beta  \n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert read_names("names_pkg_for_test", "x.txt") == frozenset({"alpha", "beta"})


def test_the_module_imports_neither_torch_nor_httpx():
    code = "import sys, rlcore.engine_kit.options; print('torch' in sys.modules, 'httpx' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["False", "False"]
