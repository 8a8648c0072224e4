"""``--executor ray``: each variant a Ray task, on a local Ray cluster or one at ``--address``.

Each task runs the function it is given (``execute.run_variant``): it plans its variant again
from the recipe's text and runs it against the sweep's cache, which must be a path every worker reaches (a shared
filesystem: NFS, a mounted bucket, the same disk on one machine), and writes its artifact
to the sweep's folder, which must be shared the same way. A task asks for
``sweep.cpus_per_variant`` CPUs and ``sweep.gpus_per_variant`` GPUs. Without an address,
``ray.init()`` starts a local cluster on this machine and stops it at the end; with one, it
joins that cluster (``auto``: the cluster this machine belongs to) and leaves it running; a
cluster that asks for a token is checked first (``ray_auth``), so a missing or wrong token is an
error at once, not a minute of retries. Workers must have llmopt and the recipe's extras installed.

Needs: ray (the ``ray`` extra).
"""

from __future__ import annotations

from typing import Callable

from llmopt.libraries import require
from llmopt.sweep import ray_auth


class RayTasks:
    def __init__(self, run_variant: Callable[[dict], dict], address: str | None, jobs: int, cpus: float, gpus: float):
        self.ray = require("ray", "ray", "--executor ray")
        self.started = not self.ray.is_initialized()
        self.token_mode = False
        if self.started:
            self.token_mode = ray_auth.prepare(address)
            try:
                self.ray.init(address=address or None, include_dashboard=False, log_to_driver=True,
                              logging_level="WARNING")
            except BaseException:
                ray_auth.restore(self.token_mode)
                raise
        self.task = self.ray.remote(run_variant).options(num_cpus=cpus, num_gpus=gpus, max_retries=0)
        total = self.ray.cluster_resources()
        fits = int(total.get("CPU", 1) // cpus) if cpus else 1
        if gpus:
            if total.get("GPU", 0) < gpus:
                self.close()
                from llmopt.errors import UsageError

                raise UsageError(f"each variant asks for {gpus:g} GPU(s) but the Ray cluster has "
                                 f"{total.get('GPU', 0):g}", fix="set sweep.gpus_per_variant = 0, or use a cluster "
                                 "with GPUs (--address)")
            fits = min(fits, int(total["GPU"] // gpus))
        self.slots = max(1, jobs if jobs > 1 else fits)

    def submit(self, variant, spec: dict):
        return self.task.remote(spec)

    def wait(self, handles: list) -> list[tuple]:
        done, _ = self.ray.wait(handles, num_returns=1)
        return [(ref, self.ray.get(ref)) for ref in done]

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()
            ray_auth.restore(self.token_mode)
