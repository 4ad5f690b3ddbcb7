"""How ranks are laid out over nodes and GPUs, and what a cluster can hold (no cluster needed)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")
from rlcore_launcher_ray.options import RayOptions  # noqa: E402
from rlcore_launcher_ray.workers import RankInfo, check_capacity, rank_environment  # noqa: E402

from rlcore.errors import RlcoreError  # noqa: E402


def info(rank, node, gpus):
    return RankInfo(
        rank=rank, pid=100 + rank, node_id=node, node_ip=f"10.0.0.{node[-1]}", hostname=node, gpu_ids=gpus
    )


def test_ray_local_ranks_follow_gpu_ids_and_see_their_nodes_gpus():
    # Bundles landed out of GPU order: rank 0 got GPU 3 of node a, rank 2 GPU 1.
    infos = [
        info(0, "node1", ["3"]),
        info(1, "node2", ["0"]),
        info(2, "node1", ["1"]),
        info(3, "node2", ["5"]),
    ]
    envs = rank_environment(infos, "10.0.0.1", 29500, local=False)
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert all(e["WORLD_SIZE"] == "4" and e["LOCAL_WORLD_SIZE"] == "2" for e in envs)
    assert [e["NODE_RANK"] for e in envs] == ["0", "1", "0", "1"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["1,3", "0,5", "1,3", "0,5"]
    # cuda:LOCAL_RANK is each rank's own GPU within CUDA_VISIBLE_DEVICES.
    for e, i in zip(envs, infos):
        assert e["CUDA_VISIBLE_DEVICES"].split(",")[int(e["LOCAL_RANK"])] == i.gpu_ids[0]
    assert all(e["MASTER_ADDR"] == "10.0.0.1" and e["MASTER_PORT"] == "29500" for e in envs)
    assert all("GLOO_SOCKET_IFNAME" not in e for e in envs)  # several nodes: not loopback


def test_ray_cpu_ranks_on_one_node_stay_on_loopback(monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    envs = rank_environment([info(0, "node1", []), info(1, "node1", [])], "127.0.0.1", 1234, local=True)
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    assert all("CUDA_VISIBLE_DEVICES" not in e for e in envs)
    assert all(e.get("GLOO_SOCKET_IFNAME") == "lo" for e in envs)


NODES = [{"CPU": 8, "GPU": 4}, {"CPU": 8, "GPU": 4}]


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"workers": 9, "gpus_per_worker": 1},
            r"9 GPUs requested \(workers = 9 x gpus_per_worker = 1\), the cluster has 8",
        ),
        (
            {"workers": 1, "cpus_per_worker": 10},
            r"no node can hold one rank \(10 CPUs, 0 GPUs\); the largest node has 8 CPUs",
        ),
        (
            {"workers": 6, "gpus_per_worker": 1, "placement_strategy": "STRICT_PACK"},
            r"STRICT_PACK needs one node with 6 CPUs and 6 GPUs",
        ),
        (
            {"workers": 3, "placement_strategy": "STRICT_SPREAD"},
            r"STRICT_SPREAD needs 3 nodes that each hold one rank; the cluster has 2",
        ),
    ],
)
def test_ray_capacity_is_checked_before_waiting(options, message):
    with pytest.raises(RlcoreError, match=message):
        check_capacity(RayOptions(**options), {"CPU": 16, "GPU": 8}, NODES)


def test_ray_capacity_that_fits_passes():
    check_capacity(
        RayOptions(workers=8, gpus_per_worker=1, cpus_per_worker=2, placement_strategy="SPREAD"),
        {"CPU": 16, "GPU": 8},
        NODES,
    )
    check_capacity(
        RayOptions(workers=4, gpus_per_worker=1, placement_strategy="STRICT_PACK"),
        {"CPU": 16, "GPU": 8},
        NODES,
    )
