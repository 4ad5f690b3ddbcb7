"""Worker-group mode on a real local Ray cluster: placement, torchrun's variables, output, failures."""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import socket
import sys
import threading
import time

import pytest

ray = pytest.importorskip("ray")
from ray import cloudpickle  # noqa: E402
from rlcore_launcher_ray.launcher import WORKERS_FILE, RayLauncher  # noqa: E402
from rlcore_launcher_ray.options import RayOptions  # noqa: E402

from rlcore.errors import RlcoreError  # noqa: E402
from rlcore.testing.runs import process_gone, wait_for  # noqa: E402

# The targets below travel to the Ray workers by value: this test module is not importable there.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

TORCHRUN_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def report(marker: str) -> dict:
    """Print a marker, then all-reduce over the launcher's MASTER_ADDR/PORT with torch.distributed."""
    import torch
    import torch.distributed as dist

    print(f"{marker} from rank {os.environ['RANK']}", flush=True)
    dist.init_process_group("gloo")
    try:
        total = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(total)
    finally:
        dist.destroy_process_group()
    env = {k: os.environ.get(k) for k in TORCHRUN_VARS + ("EXTRA",)}
    return {"pid": os.getpid(), "all_reduce": float(total.item()), **env}


def print_lines(count: int) -> int:
    for i in range(count):
        print(f"line {i} of rank {os.environ['RANK']}")
    return 0


def print_a_line_in_two_writes(pause: float) -> int:
    """Half a line reaches the log file, waits there while Ray's log monitor reads it, then the rest."""
    sys.stdout.write(f"the first half of rank {os.environ['RANK']}'s line ")
    sys.stdout.flush()
    time.sleep(pause)
    print("and its second half")
    return 0


def fail_on_rank(bad: int) -> int:
    if int(os.environ["RANK"]) == bad:
        raise ValueError(f"rank {bad} fails on purpose")
    time.sleep(300)  # the others would wait for it forever in a collective
    return 0


def usage_error_on_rank_0() -> int:
    from rlcore.errors import UsageError

    if os.environ["RANK"] == "0":
        raise UsageError("the manifest says something this rank cannot do")
    time.sleep(300)
    return 0


def exit_code_by_rank(codes: list[int]) -> int:
    return codes[int(os.environ["RANK"])]


def sleep_long() -> int:
    time.sleep(300)
    return 0


def launcher(cluster, **options) -> RayLauncher:
    options.setdefault("address", cluster.address)
    options.setdefault("cpus_per_worker", 1)
    return RayLauncher(RayOptions.model_validate(options))


@pytest.mark.slow
def test_ray_ranks_get_torchrun_environment_and_prefixed_output(ray_cluster, launch_request, tmp_path, capfd):
    run = launcher(ray_cluster, workers=2, runtime_env={"env_vars": {"EXTRA": "from-manifest"}})
    request = launch_request(run_dir=tmp_path / "run")
    assert run.run_workers(request, target=report, kwargs={"marker": "hello-xyz"}) == 0
    by_rank = run.results
    assert sorted(by_rank) == [0, 1]
    for rank, env in by_rank.items():
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "2"
        assert env["LOCAL_RANK"] == str(rank) and env["LOCAL_WORLD_SIZE"] == "2" and env["NODE_RANK"] == "0"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["EXTRA"] == "from-manifest"
        assert env["all_reduce"] == 3.0  # 1 + 2: the ranks found each other
    assert by_rank[0]["MASTER_PORT"] == by_rank[1]["MASTER_PORT"]
    assert by_rank[0]["pid"] != by_rank[1]["pid"] != os.getpid()
    info = json.loads((tmp_path / "run" / "launch" / WORKERS_FILE).read_text())
    assert [(i["rank"], i["pid"]) for i in info] == [(0, by_rank[0]["pid"]), (1, by_rank[1]["pid"])]
    # Ray forwards each rank's output a moment after it is written; the launcher waited for the
    # last lines before it returned, so they are all here now.
    seen = re.sub(r"\x1b\[[0-9;]*m", "", capfd.readouterr().out)  # Ray colours the prefixes
    lines = [line for line in seen.splitlines() if "hello-xyz from rank" in line]
    assert any(line.lstrip().startswith("(rank0 pid=") and line.endswith("rank 0") for line in lines), seen[
        -2000:
    ]
    assert any(line.lstrip().startswith("(rank1 pid=") and line.endswith("rank 1") for line in lines), seen[
        -2000:
    ]


@pytest.mark.slow
def test_ray_ranks_last_lines_all_arrive_before_the_launcher_returns(
    ray_cluster, launch_request, tmp_path, capfd
):
    run = launcher(ray_cluster, workers=2)
    assert (
        run.run_workers(launch_request(run_dir=tmp_path / "run"), target=print_lines, kwargs={"count": 3000})
        == 0
    )
    seen = capfd.readouterr().out
    for rank in (0, 1):
        assert len(re.findall(rf"line \d+ of rank {rank}\b", seen)) == 3000, seen[-1000:]


def test_ray_a_line_the_log_monitor_reads_half_written_is_printed_whole(
    ray_cluster, launch_request, tmp_path, capfd
):
    """Ray's log monitor publishes what it finds of a line not yet ended as a line of its own;
    the launcher joins the rest to it."""
    run = launcher(ray_cluster, workers=2)
    request = launch_request(run_dir=tmp_path / "run")
    assert run.run_workers(request, target=print_a_line_in_two_writes, kwargs={"pause": 1.0}) == 0
    seen = capfd.readouterr().out
    for rank in (0, 1):
        assert f"the first half of rank {rank}'s line and its second half" in seen, seen[-2000:]
        assert seen.count(f"rank {rank}'s line") == 1, seen[-2000:]


def test_ray_too_many_gpus_is_refused_at_once(ray_cluster, launch_request):
    run = launcher(ray_cluster, workers=2, gpus_per_worker=1)
    started = time.monotonic()
    with pytest.raises(
        RlcoreError, match=r"2 GPUs requested \(workers = 2 x gpus_per_worker = 1\), the cluster has 0"
    ):
        run.run_workers(launch_request(), target=report, kwargs={"marker": "never"})
    assert time.monotonic() - started < 30
    assert not ray.is_initialized()  # the launcher disconnected after the failure


def test_ray_too_many_cpus_is_refused_at_once(ray_cluster, launch_request):
    run = launcher(ray_cluster, workers=3, cpus_per_worker=2)
    with pytest.raises(
        RlcoreError, match=r"6 CPUs requested \(workers = 3 x cpus_per_worker = 2\), the cluster has 4"
    ):
        run.run_workers(launch_request(), target=report, kwargs={"marker": "never"})


def test_ray_placement_that_never_frees_times_out_clearly(ray_cluster, launch_request):
    from ray.util.placement_group import placement_group, remove_placement_group

    ray.init(address=ray_cluster.address, logging_level="ERROR")
    holder = placement_group([{"CPU": 3}])
    try:
        ray.get(holder.ready(), timeout=60)
        run = launcher(ray_cluster, workers=2, placement_timeout=2)
        with pytest.raises(
            RlcoreError,
            match=r"did not reserve 2 x \{'CPU': 1.0\} \(PACK\) within placement_timeout = 2 s; free now",
        ):
            run.run_workers(launch_request(), target=report, kwargs={"marker": "never"})
        assert ray.is_initialized()  # not the launcher's connection: left alone
    finally:
        remove_placement_group(holder)
        ray.shutdown()


def test_ray_unreachable_address_fails_fast_naming_it(launch_request):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
    run = RayLauncher(RayOptions(address=address, connect_timeout=3))
    started = time.monotonic()
    with pytest.raises(RlcoreError, match=rf"cannot reach the Ray cluster at {address} \(.*refused"):
        run.launch(launch_request())
    assert time.monotonic() - started < 5


def test_ray_address_from_environment(monkeypatch, launch_request):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")
    with pytest.raises(RlcoreError, match=r"cannot reach the Ray cluster at 127.0.0.1:9"):
        RayLauncher(RayOptions(connect_timeout=2)).launch(launch_request())


def test_ray_rank_that_raises_stops_the_others(ray_cluster, launch_request):
    run = launcher(ray_cluster, workers=2, failure_grace=1)
    started = time.monotonic()
    with pytest.raises(
        RlcoreError,
        match=r"rank 1 \(pid \d+ on .*\) raised ValueError: rank 1 fails on purpose. The other ranks were stopped.",
    ):
        run.run_workers(launch_request(), target=fail_on_rank, kwargs={"bad": 1})
    assert time.monotonic() - started < 60  # rank 0's five-minute sleep was cut short


def test_ray_rank_expected_error_keeps_its_message_and_exit_code(ray_cluster, launch_request):
    run = launcher(ray_cluster, workers=2, failure_grace=1)
    with pytest.raises(
        RlcoreError, match=r"^rank 0: the manifest says something this rank cannot do$"
    ) as caught:
        run.run_workers(launch_request(), target=usage_error_on_rank_0, kwargs={})
    assert caught.value.exit_code == 2


def test_ray_exit_code_is_zero_only_when_every_rank_is(ray_cluster, launch_request, capsys):
    run = launcher(ray_cluster, workers=2, failure_grace=5)
    assert run.run_workers(launch_request(), target=exit_code_by_rank, kwargs={"codes": [0, 3]}) == 3
    assert "rank 1 exited with 3" in capsys.readouterr().out


def test_ray_killed_rank_fails_the_run_and_names_it(ray_cluster, launch_request, tmp_path):
    run_dir = tmp_path / "run"
    run = launcher(ray_cluster, workers=2, failure_grace=1)
    killed: list[int] = []

    def kill_rank_1():
        info_file = run_dir / "launch" / WORKERS_FILE
        deadline = time.monotonic() + 120
        while not info_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        pid = json.loads(info_file.read_text())[1]["pid"]
        time.sleep(1)
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    killer = threading.Thread(target=kill_rank_1, daemon=True)
    killer.start()
    started = time.monotonic()
    with pytest.raises(RlcoreError) as caught:
        run.run_workers(launch_request(run_dir=run_dir), target=sleep_long, kwargs={})
    killer.join(5)
    message = str(caught.value)
    assert f"rank 1 (pid {killed[0]} on" in message and " died: " in message, message
    assert "The other ranks were stopped." in message
    assert f"No checkpoint was written in {run_dir} yet" in message
    assert time.monotonic() - started < 90
    rank0 = json.loads((run_dir / "launch" / WORKERS_FILE).read_text())[0]["pid"]
    wait_for(lambda: process_gone(rank0), 15, "rank 0 to be stopped")


def test_ray_ctrl_c_stops_the_ranks(ray_cluster, launch_request, tmp_path, capsys):
    run_dir = tmp_path / "run"
    run = launcher(ray_cluster, workers=2)

    def interrupt_when_started():
        deadline = time.monotonic() + 120
        while not (run_dir / "launch" / WORKERS_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)
        os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C does

    threading.Thread(target=interrupt_when_started, daemon=True).start()
    started = time.monotonic()
    assert run.run_workers(launch_request(run_dir=run_dir), target=sleep_long, kwargs={}) == 130
    assert time.monotonic() - started < 60
    assert "interrupted: the ranks were stopped. No checkpoint was written" in capsys.readouterr().out
    for worker in json.loads((run_dir / "launch" / WORKERS_FILE).read_text()):
        wait_for(
            functools.partial(process_gone, worker["pid"]),
            15,
            f"rank {worker['rank']} (pid {worker['pid']}) to end",
        )


@pytest.mark.slow
def test_ray_without_an_address_starts_and_stops_a_local_instance(launch_request, capsys):
    run = RayLauncher(RayOptions(workers=2, cpus_per_worker=0.5))
    assert run.run_workers(launch_request(), target=report, kwargs={"marker": "local"}) == 0
    assert "starting a local Ray instance on 127.0.0.1" in capsys.readouterr().out
    assert [run.results[r]["all_reduce"] for r in (0, 1)] == [3.0, 3.0]
    assert {run.results[r]["MASTER_ADDR"] for r in (0, 1)} == {"127.0.0.1"}
    assert not ray.is_initialized()  # the launcher's own instance was shut down
