"""Split a custom worker's work across a pool of Ray workers and gather the results.

    python plugins/launcher_ray/examples/worker_group.py              # a local Ray instance on 127.0.0.1
    RAY_ADDRESS=10.0.0.1:6379 python .../worker_group.py --workers 8  # an existing cluster

Each worker loads a "model" once (here: a table of letter scores, scaled by the worker's rank to
show which worker did what), then scores its slice of the texts; the controller gets the scores
back in the texts' order, and a summary computed on rank 0 alone.
"""

from __future__ import annotations

import argparse
import os

import ray
from rlcore_launcher_ray.group import ResourcePool, Worker, WorkerGroup, group_method, with_args


class Scorer(Worker):
    def __init__(self, bonus: float):
        # Runs once in every worker, after RANK, WORLD_SIZE, MASTER_ADDR... were set.
        self.bonus = bonus
        self.table = {c: i + 1 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")}
        self.scored = 0

    @group_method(dispatch="split")  # each worker gets a contiguous slice; the results are joined in order
    def score(self, texts: list[str]) -> list[dict]:
        self.scored += len(texts)
        return [
            {
                "text": t,
                "score": sum(self.table.get(c, 0) for c in t.lower()) + self.bonus,
                "rank": self.rank,
                "pid": os.getpid(),
            }
            for t in texts
        ]

    @group_method()  # every worker, same arguments; a list of results in rank order
    def how_many(self) -> int:
        return self.scored

    @group_method(execute="rank_zero")  # rank 0 alone; its result comes back
    def describe(self) -> str:
        return f"{self.world_size} scorers, rendezvous at {self.master_addr}:{self.master_port}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if os.environ.get("RAY_ADDRESS"):
        ray.init(logging_level="ERROR")  # the cluster RAY_ADDRESS names
    else:
        ray.init(
            address="local", _node_ip_address="127.0.0.1", include_dashboard=False, logging_level="ERROR"
        )
    texts = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"]
    try:
        pool = ResourcePool(workers=args.workers, cpus_per_worker=0.5, strategy="PACK")
        with WorkerGroup(pool, with_args(Scorer, bonus=0.5), name="scorer") as group:
            print(group.describe())
            for row in group.score(texts):  # blocking: the joined results
                print(f"{row['text']:>8} {row['score']:6.1f}  (rank {row['rank']}, pid {row['pid']})")
            pending = group.score.remote(["omega"])  # non-blocking: refs now, the result later
            print("omega", pending.result()[0]["score"])
            print("texts per worker:", group.how_many())
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
