"""A worker group over two Ray nodes: a head and a second raylet on this host, both on loopback
(the ``ray_two_nodes`` fixture). The training run over the same two nodes is in test_ray_training.py."""

from __future__ import annotations

import os
import re
import sys
import uuid

import pytest

ray = pytest.importorskip("ray")
from ray import cloudpickle  # noqa: E402
from rlcore_launcher_ray.group import ResourcePool, Worker, WorkerGroup, group_method  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Where(Worker):
    @group_method()
    def node(self) -> dict:
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_rank": self.node_rank,
            "local": (self.local_rank, self.local_world_size),
            "world": os.environ["WORLD_SIZE"],
        }

    @group_method(dispatch="split")
    def double(self, numbers):
        return [2 * n for n in numbers]


class Talker(Worker):
    @group_method()
    def talk(self, tag: str) -> int:
        for i in range(5):
            print(f"{tag} talker{self.rank} out {i}", flush=True)
        for _ in range(2):  # a line printed twice must still appear twice
            print(f"{tag} talker{self.rank} twice", flush=True)
        print(f"{tag} talker{self.rank} err", file=sys.stderr, flush=True)
        return os.getpid()


@pytest.fixture
def two_nodes_connected(ray_two_nodes):
    ray.init(address=ray_two_nodes.address, logging_level="ERROR")
    yield ray_two_nodes
    ray.shutdown()


@pytest.mark.parametrize(
    "pool",
    [
        {"workers": 2, "strategy": "STRICT_SPREAD"},
        {"workers_per_node": [1, 1]},
        {"workers": 2, "strategy": "SPREAD"},
    ],
    ids=["strict_spread", "workers_per_node", "spread"],
)
def test_group_spreads_over_two_nodes(two_nodes_connected, pool):
    with WorkerGroup(ResourcePool(cpus_per_worker=1, **pool), Where) as group:
        seen = group.node()
        assert len({s["node_id"] for s in seen}) == 2, seen
        assert [s["node_rank"] for s in seen] == [0, 1]
        assert [s["local"] for s in seen] == [(0, 1), (0, 1)] and {s["world"] for s in seen} == {"2"}
        assert [i.node_id for i in group.workers] == [s["node_id"] for s in seen]
        # One worker on the node with resource node_a, one on node_b.
        resources = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
        assert sorted(
            r for s in seen for r in resources[s["node_id"]] if r.startswith("node_") and ":" not in r
        ) == ["node_a", "node_b"]
        assert group.double(list(range(5))) == [0, 2, 4, 6, 8]


def test_group_that_needs_a_third_node_is_refused_at_once(two_nodes_connected):
    from rlcore.errors import RlcoreError

    with pytest.raises(
        RlcoreError, match=r"STRICT_SPREAD needs 3 nodes that each hold one worker; the cluster has 2"
    ):
        WorkerGroup(ResourcePool(workers=3, strategy="STRICT_SPREAD", cpus_per_worker=0.5), Where)
    with pytest.raises(RlcoreError, match=r"workers_per_node = \[1, 1, 1\] needs 3 distinct nodes"):
        WorkerGroup(ResourcePool(workers_per_node=[1, 1, 1], cpus_per_worker=0.5), Where)


def test_each_workers_line_reaches_the_driver_once(two_nodes_connected, capfd):
    """Both raylets of the fixture watch one session directory (one --temp-dir on one host), so
    Ray's two log monitors each publish every worker's lines. The group's output filter lets each
    line through once, and only once, however many monitors publish it."""
    tag = uuid.uuid4().hex[:8]
    capfd.readouterr()
    with WorkerGroup(
        ResourcePool(workers=2, strategy="STRICT_SPREAD", cpus_per_worker=1), Talker, name="talker"
    ) as group:
        pids = group.talk(tag)
    captured = capfd.readouterr()
    plain = re.sub(r"\x1b\[[0-9;]*m", "", captured.out + captured.err)
    assert "\x1b]" not in plain  # no marker is left in what the driver prints
    for rank, pid in enumerate(pids):
        lines = [line for line in plain.splitlines() if f"{tag} talker{rank} " in line]
        assert all(line.startswith(f"(talker{rank} pid={pid}") for line in lines), lines
        said = [line.split(f"{tag} talker{rank} ", 1)[1] for line in lines]
        assert sorted(said) == sorted([f"out {i}" for i in range(5)] + ["twice", "twice", "err"]), lines
        assert [s for s in said if s.startswith("out")] == [f"out {i}" for i in range(5)]  # in order
