"""The public worker-group API (rlcore_launcher_ray.group) on a real Ray cluster on loopback:
every dispatch mode, rank-zero calls, non-blocking calls, a dead worker, colocated roles.
(Two nodes: test_ray_two_nodes.py.)"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray import cloudpickle  # noqa: E402
from rlcore_launcher_ray.group import (  # noqa: E402
    Dispatch,
    GroupCall,
    ResourcePool,
    Worker,
    WorkerFailure,
    WorkerGroup,
    _join,
    colocated,
    group_method,
    with_args,
)

from rlcore.errors import RlcoreError  # noqa: E402
from rlcore.testing.runs import process_gone, wait_for  # noqa: E402

# The worker classes below travel to the Ray workers by value: this test module is not importable there.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def every_other(n, items):
    """A custom split: worker i gets items i, i + n, i + 2n, ..."""
    return [((items[i::n],), {}) for i in range(n)]


class Counter(Worker):
    def __init__(self, start: int = 0):
        self.count = start
        self.rank_zero_calls = 0
        self.env_at_init = {
            k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "EXTRA")
        }

    @group_method()  # broadcast, the default
    def whoami(self) -> dict:
        return {
            "rank": self.rank,
            "world": self.world_size,
            "local_rank": self.local_rank,
            "pid": os.getpid(),
            "env_at_init": self.env_at_init,
            "master": (self.master_addr, self.master_port),
            "count": self.count,
        }

    @group_method(dispatch="broadcast")
    def add(self, amount: int) -> int:
        self.count += amount
        return self.count

    @group_method(dispatch="scatter")
    def add_each(self, amount: int, label: str = "") -> str:
        self.count += amount
        return f"{label}{self.rank}:{self.count}"

    @group_method(dispatch="split")
    def tag(self, items, scale):
        return [(self.rank, x * s) for x, s in zip(items, scale)]

    @group_method(dispatch=Dispatch(split=every_other, gather=lambda results: sum(results, [])))
    def picked(self, items):
        return [(self.rank, x) for x in items]

    @group_method(execute="rank_zero")
    def summary(self, prefix: str) -> str:
        self.rank_zero_calls += 1
        return f"{prefix} from rank {self.rank}"

    @group_method()
    def rank_zero_counts(self) -> int:
        return self.rank_zero_calls

    @group_method()
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return os.getpid()

    @group_method()
    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"rank {rank} fails on purpose")
        return self.rank

    def not_a_group_method(self):
        return "private"


@pytest.fixture(scope="module")
def connected(ray_cluster):
    ray.init(address=ray_cluster.address, logging_level="ERROR")
    yield ray_cluster
    ray.shutdown()


@pytest.fixture(scope="module")
def counters(connected):
    pool = ResourcePool(workers=2, cpus_per_worker=0.5)
    with WorkerGroup(
        pool, with_args(Counter, start=100), name="counter", env={"EXTRA": "group-env"}
    ) as group:
        yield group
    assert pool.placement_group is None  # the group reserved the pool, and released it


def test_group_broadcast_gives_every_worker_its_rank_and_torchrun_environment(counters):
    seen = counters.whoami()
    assert [w["rank"] for w in seen] == [0, 1] and {w["world"] for w in seen} == {2}
    assert [w["local_rank"] for w in seen] == [0, 1]
    assert seen[0]["pid"] != seen[1]["pid"] != os.getpid()
    for rank, worker in enumerate(seen):  # set before __init__ ran
        assert worker["env_at_init"] == {
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(seen[0]["master"][1]),
            "EXTRA": "group-env",
        }
    assert seen[0]["master"] == seen[1]["master"]
    assert [i.pid for i in counters.workers] == [w["pid"] for w in seen]
    before = [w["count"] for w in seen]
    assert counters.add(5) == [before[0] + 5, before[1] + 5]


def test_group_scatter_sends_entry_i_to_worker_i(counters):
    before = [w["count"] for w in counters.whoami()]
    assert counters.add_each([1, 10], label=["a", "b"]) == [f"a0:{before[0] + 1}", f"b1:{before[1] + 10}"]
    with pytest.raises(
        ValueError,
        match=r"Counter.add_each uses dispatch='scatter': argument 'amount' must be a list of 2 \(one per worker\), got a list of 3",
    ):
        counters.add_each([1, 2, 3])
    with pytest.raises(ValueError, match=r"argument 'amount' must be a list of 2 .*got int"):
        counters.add_each(1)


def test_group_split_cuts_contiguous_slices_and_joins_the_results(counters):
    assert counters.tag(list(range(5)), scale=[2] * 5) == [(0, 0), (0, 2), (1, 4), (1, 6), (1, 8)]
    assert counters.tag([7], [1]) == [(1, 7)]  # fewer items than workers: rank 0 gets an empty slice
    with pytest.raises(
        TypeError,
        match=r"Counter.tag uses dispatch='split': argument 'scale' \(float\) is not a sequence to split",
    ):
        counters.tag([1, 2], 0.5)
    with pytest.raises(ValueError, match=r"the arguments' lengths differ \(\{'items': 2, 'scale': 3\}\)"):
        counters.tag([1, 2], [1, 2, 3])
    with pytest.raises(TypeError, match=r"Counter.tag\(\): missing a required argument: 'scale'"):
        counters.tag([1, 2])


def test_group_split_joins_tensors_and_refuses_what_it_cannot_join():
    torch = pytest.importorskip("torch")
    joined = _join("W.m", [torch.tensor([1, 2]), torch.tensor([3])])
    assert joined.tolist() == [1, 2, 3]
    assert _join("W.m", [None, None]) is None
    with pytest.raises(TypeError, match=r"W.m uses dispatch='split': cannot join results of type int"):
        _join("W.m", [1, 2])


def test_group_custom_dispatch(counters):
    assert counters.picked([10, 11, 12, 13, 14]) == [(0, 10), (0, 12), (0, 14), (1, 11), (1, 13)]


def test_group_rank_zero_runs_on_rank_zero_only(counters):
    before = counters.rank_zero_counts()
    assert counters.summary("hello") == "hello from rank 0"  # one value, not a list
    assert counters.rank_zero_counts() == [before[0] + 1, before[1]]


def test_group_non_blocking_call_returns_refs(counters):
    call = counters.sleep.remote(0.5)
    assert isinstance(call, GroupCall) and len(call.refs) == 2
    assert all(isinstance(ref, ray.ObjectRef) for ref in call.refs)
    pids = [i.pid for i in counters.workers]
    assert ray.get(call.refs) == pids
    assert call.result() == pids
    # Two calls in flight at once; each worker runs its calls one at a time, in order.
    first, second = counters.add.remote(1), counters.add.remote(1)
    a, b = first.result(), second.result()
    assert [y - x for x, y in zip(a, b)] == [1, 1]
    with pytest.raises(
        TimeoutError, match=r"Counter.sleep did not finish within 0.2 s \(2 worker\(s\) still running\)"
    ):
        counters.sleep.remote(2).result(timeout=0.2)


def test_group_worker_that_raises_fails_the_call_and_names_it(counters):
    with pytest.raises(WorkerFailure) as caught:
        counters.fail_on(1)
    message = str(caught.value)
    assert message.startswith("Counter.fail_on: counter 1 (pid ")
    assert (
        f"pid {counters.workers[1].pid} on " in message
        and "raised ValueError: rank 1 fails on purpose" in message
    )
    assert isinstance(caught.value.failures[0].error, ValueError)
    assert caught.value.results == {0: 0}
    assert counters.whoami()[1]["rank"] == 1  # the others finished: the group goes on


def test_group_misuse_is_explained(counters):
    with pytest.raises(
        AttributeError,
        match=r"group 'counter' has no group method 'not_a_group_method'; group methods: add, add_each",
    ):
        counters.not_a_group_method()
    with pytest.raises(
        ValueError,
        match=r"group_method\(dispatch='one_to_many'\): expected one of 'broadcast', 'scatter', 'split'",
    ):
        group_method(dispatch="one_to_many")
    with pytest.raises(
        ValueError,
        match=r"execute='rank_zero'\) sends the arguments to rank 0 alone: use dispatch='broadcast'",
    ):
        group_method(dispatch="split", execute="rank_zero")
    with pytest.raises(TypeError, match=r"a worker class must subclass rlcore_launcher_ray.group.Worker"):
        WorkerGroup(ResourcePool(workers=1), with_args(dict))
    with pytest.raises(ValueError, match=r"either workers=N or workers_per_node"):
        ResourcePool()
    with pytest.raises(RuntimeError, match=r"Counter was not started by a WorkerGroup"):
        _ = Counter().rank


def test_group_without_ray_says_to_connect():
    script = (
        "from rlcore_launcher_ray.group import ResourcePool, Worker, WorkerGroup\n"
        "try:\n    WorkerGroup(ResourcePool(workers=1), Worker)\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n"
        "import ray; print('initialized' if ray.is_initialized() else 'not initialized')\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120).stdout
    assert "RlcoreError connect to Ray before starting a WorkerGroup: ray.init(address=...)" in out, out
    assert "not initialized" in out  # no Ray instance was started behind the user's back


def test_group_too_large_for_the_cluster_is_refused_at_once(connected):
    with pytest.raises(
        RlcoreError,
        match=r"the Ray cluster cannot hold the requested workers: 10 CPUs requested \(workers = 5 x cpus_per_worker = 2\), the cluster has 4",
    ):
        WorkerGroup(ResourcePool(workers=5, cpus_per_worker=2), Counter)


def test_group_dead_worker_fails_the_call_naming_it_and_shuts_the_group_down(connected):
    pool = ResourcePool(workers=2, cpus_per_worker=0.5)
    group = WorkerGroup(pool, Counter, failure_grace=1)
    victim, other = group.workers[1], group.workers[0]
    pg = pool.placement_group
    threading.Timer(1.0, os.kill, [victim.pid, signal.SIGKILL]).start()
    started = time.monotonic()
    with pytest.raises(WorkerFailure) as caught:
        group.sleep(300)
    assert time.monotonic() - started < 60  # worker 0's sleep was cut short
    message = str(caught.value)
    assert (
        f"Counter.sleep: worker 1 (pid {victim.pid} on {victim.hostname} ({victim.node_ip}, node {victim.node_id[:8]})) died: "
        in message
    )
    assert message.endswith("The group was shut down."), message
    assert caught.value.stopped == [0]
    wait_for(lambda: process_gone(other.pid), 15, "worker 0 to be stopped")
    assert pool.placement_group is None  # released at once
    assert ray.util.placement_group_table(pg)["state"] == "REMOVED"
    with pytest.raises(
        RlcoreError, match=r"Counter.whoami: group 'worker' was shut down \(workers \[1\] died\)"
    ):
        group.whoami()
    group.shutdown()  # again: nothing to do


class Policy(Worker):
    def __init__(self):
        self.weights = [0.0, 0.0]

    @group_method()
    def pid(self) -> int:
        return os.getpid()

    @group_method(dispatch="scatter")
    def set_weights(self, weights: list[float]) -> None:
        self.weights = weights

    @group_method()
    def weights_now(self) -> list[float]:
        return self.weights


class Critic(Worker):
    def __init__(self, offset: float):
        self.offset = offset

    @group_method()
    def pid(self) -> int:
        return os.getpid()

    @group_method()
    def value_of_policy(self) -> tuple:
        policy = self.colocated["policy"]  # the other role's object itself, in this process
        policy.weights = [w + self.offset for w in policy.weights]
        return self.role, sorted(self.colocated), id(policy), policy.weights


def test_group_colocated_roles_share_one_process_and_its_state(connected):
    with WorkerGroup(
        ResourcePool(workers=2, cpus_per_worker=0.5), colocated(policy=Policy, critic=with_args(Critic, 0.5))
    ) as group:
        assert group.policy.pid() == group.critic.pid() == [i.pid for i in group.workers]
        group.policy.set_weights([[1.0, 2.0], [3.0, 4.0]])
        seen = group.critic.value_of_policy()
        assert [s[0] for s in seen] == ["critic", "critic"] and [s[1] for s in seen] == [
            ["policy"],
            ["policy"],
        ]
        assert [s[3] for s in seen] == [[1.5, 2.5], [3.5, 4.5]]
        assert group.policy.weights_now() == [
            [1.5, 2.5],
            [3.5, 4.5],
        ]  # the critic changed the policy's own list
        with pytest.raises(
            AttributeError, match=r"group 'worker' has roles critic, policy: call group.ROLE.pid\(...\)"
        ):
            group.pid()
        with pytest.raises(
            AttributeError, match=r"role 'critic' \(Critic\) has no group method 'set_weights'"
        ):
            group.critic.set_weights([1, 2])


def test_group_example_script_runs(ray_cluster):
    """plugins/launcher_ray/examples/worker_group.py, as a user runs it (here on the test cluster)."""
    script = Path(__file__).resolve().parents[1] / "examples" / "worker_group.py"
    env = {**os.environ, "RAY_ADDRESS": ray_cluster.address}
    proc = subprocess.run(
        [sys.executable, str(script), "--workers", "3"], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert re.search(r"^3 scorers, rendezvous at 127\.0\.0\.1:\d+$", lines[0]), lines
    rows = [line.split() for line in lines[1:8]]
    # 7 texts over 3 workers: slices of 2, 2 and 3, in order; alpha = 1+12+16+8+1 = 38, + 0.5.
    assert [r[0] for r in rows] == ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"]
    assert [r[3].rstrip(",") for r in rows] == ["0", "0", "1", "1", "2", "2", "2"]
    assert rows[0][1] == "38.5"
    assert "omega 41.5" in lines  # 15+13+5+7+1
    assert "texts per worker: [2, 2, 4]" in lines  # the last scorer also got omega


class BrokenOnRankOne(Worker):
    def __init__(self):
        if self.rank == 1:
            raise OSError("no such model file on this node")


def test_group_worker_that_fails_to_start_names_itself_and_releases_the_pool(connected):
    pool = ResourcePool(workers=2, cpus_per_worker=0.5)
    with pytest.raises(
        WorkerFailure,
        match=r"^starting BrokenOnRankOne: builder 1 \(pid \d+ on .*\) raised OSError: no such model file on this node\.",
    ):
        WorkerGroup(pool, BrokenOnRankOne, name="builder")
    assert pool.placement_group is None
