"""Launch files for a replica that spans several nodes: launch.sh, docker-compose.yaml and a
LeaderWorkerSet.

Every node runs the engine's command for its role: node 0 (the leader) serves HTTP, the others
(workers) join it. The commands are shell text with placeholders that each file fills in its own
way: ``{leader}`` (the leader's address), ``{rank}`` (this node's index, 0 on the leader),
``{nodes}`` (how many nodes) and ``{workers}`` (the workers' addresses, space-separated: an engine
whose leader starts the processes of every node, as TensorRT-LLM's mpirun does), besides
``{model}`` and ``{config}`` (``files.Launch.argv``).

* ``launch.sh`` reads ``NODE_RANK`` and ``LEADER_ADDRESS`` from the environment of each machine, and
  the leader listens on ``publish_host`` (``LLMOPT_HOST`` when set); the API key is handed over as in
  files.py;
* ``docker-compose.yaml`` has a ``leader`` and a ``worker`` service with host networking (NCCL and
  the engine's rendezvous reach the other machines directly), run one per machine; compose
  interpolates ``$VAR`` itself, so a ``$`` of the shell text is written ``$$`` (compose
  specification, "Interpolation");
* ``kubernetes.yaml`` is a LeaderWorkerSet (leaderworkerset.x-k8s.io/v1, the LWS controller of
  kubernetes-sigs/lws): one group of ``size = nodes`` pods per replica, whose containers get
  ``LWS_LEADER_ADDRESS``, ``LWS_WORKER_INDEX`` and ``LWS_GROUP_SIZE`` from the controller
  (api/leaderworkerset/v1/leaderworkerset_types.go), used through Kubernetes' ``$(VAR)``
  expansion in ``args``; worker ``i`` is reachable as ``<leader host>-<i>.<subdomain>.<namespace>``
  (the pod webhook names the leader's hostname, ``<leader host>-<i>`` the workers', and puts all
  in the LWS's subdomain; pkg/webhooks/pod_webhook.go); and a Service that selects the leader pod (label
  ``leaderworkerset.sigs.k8s.io/worker-index: "0"``). The group restarts as a whole when a pod
  fails (``restartPolicy: RecreateGroupOnPodRestart``).
"""

from __future__ import annotations

import copy
import re
import shlex
from dataclasses import dataclass

from llmopt import apikey
from llmopt.deploy import files

LWS_API = "leaderworkerset.x-k8s.io/v1"
# the shell words of worker i's address, from the leader's (LWS_LEADER_ADDRESS = host.subdomain.namespace)
LWS_WORKER_ADDRESS = '"${{LWS_LEADER_ADDRESS%%.*}}-{index}.${{LWS_LEADER_ADDRESS#*.}}"'
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
SHELL = ["/bin/bash", "-c"]


def shell_join(parts: list[str]) -> str:
    """A command line of ``parts``, each quoted but those with a placeholder (filled in by each file)."""
    return " ".join(part if "{" in part else shlex.quote(part) for part in parts)


@dataclass
class NodeCommands:
    """The shell command of the leader (node 0) and of every worker node."""

    nodes: int
    leader: str
    worker: str
    notes: tuple[str, ...] = ()

    def fill(self, launch: files.Launch, root: str, model: str, leader: str, rank: str, nodes: str, workers: str,
             dollar: str = "$") -> tuple[str, str]:
        """Both commands with the placeholders filled; ``dollar``: how the file writes a shell ``$``."""
        config = f"{root}/deploy/{launch.engine}"
        values = {"model": model, "config": config, "draft": f"{root}/draft", "leader": leader, "rank": rank,
                  "nodes": nodes, "workers": workers}
        return (self.leader.replace("$", dollar).format(**values),
                self.worker.replace("$", dollar).format(**values))


def listening_on(text: str, host: str) -> str:
    """The command ``text`` with its server listening on ``host`` instead of every interface (outside a pod)."""
    return re.sub(r"--host 0\.0\.0\.0(?=\s|$)", lambda _: f"--host {host}", text)


def container_command(launch: files.Launch, text: str) -> dict[str, list[str]]:
    """The container fields that run ``text`` in bash: through the image's ENTRYPOINT when the launch keeps
    it (the NGC images set up CUDA there), else as the command itself."""
    if launch.keep_entrypoint:
        return {"args": [*SHELL, text]}
    return {"command": list(SHELL), "args": [text]}


def launch_script(launch: files.Launch, commands: NodeCommands) -> str:
    model, served = "./model", []
    if launch.served_dir:  # the engine names the model by its folder: the same folder on every node
        model = f"/tmp/llmopt-served/{launch.name}"
        served = ["mkdir -p /tmp/llmopt-served", f'ln -sfn "$PWD/model" {model}']
    leader, worker = commands.fill(launch, ".", model, '"$LEADER_ADDRESS"', '"$NODE_RANK"', str(commands.nodes),
                                   '${WORKER_ADDRESSES:?}')
    host = launch.deployment.publish_host
    leader, worker = (listening_on(text, f'"${{LLMOPT_HOST:-{host}}}"') for text in (leader, worker))
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# Starts node $NODE_RANK of {commands.nodes} of one {launch.engine} replica for the artifact two folders up.",
        f"# (written by llmopt) The leader listens on {host} (LLMOPT_HOST: another address); {files.key_note(launch)}.",
        "# Run it on every node: NODE_RANK=0 on the leader (it serves HTTP), 1..N-1 on the workers, and",
        "# LEADER_ADDRESS = the leader's address on the network the nodes share (workers start after the leader).",
        *[f"# {note}" for note in (*launch.notes, *commands.notes)],
        "set -euo pipefail",
        'cd "$(dirname "$0")/../.."',
        ': "${NODE_RANK:?set NODE_RANK: 0 on the leader, 1.. on the workers}"',
        ': "${LEADER_ADDRESS:?set LEADER_ADDRESS to the address of the leader node}"',  # no quote in the word
        *files.key_lines(launch),
        *served,
        'if [ "$NODE_RANK" = 0 ]; then',
        f"  {leader}",
        "else",
        f"  {worker}",
        "fi",
        "",
    ])


def compose(launch: files.Launch, commands: NodeCommands) -> dict:
    """A leader and a worker service, each started on its own machine (``docker compose up <service>``)."""
    leader, _ = commands.fill(launch, files.MOUNT, launch.container_model, "${LEADER_ADDRESS:?}", "0",
                              str(commands.nodes), "${WORKER_ADDRESSES:-}", "$$")
    _, worker = commands.fill(launch, files.MOUNT, launch.container_model, "${LEADER_ADDRESS:?}",
                              "${NODE_RANK:?}", str(commands.nodes), "", "$$")
    base = files.compose(launch)["services"][files.dns_name(launch.name)]
    services = {}
    # host networking: the leader listens on the host's publish_host itself (nothing is published)
    leader, worker = (listening_on(text, launch.deployment.publish_host) for text in (leader, worker))
    for role, text in (("leader", leader), ("worker", worker)):
        service = {k: copy.deepcopy(v) for k, v in base.items()
                   if k not in ("ports", "healthcheck", "command", "entrypoint")}
        run = container_command(launch, text)  # compose's entrypoint and command: Kubernetes' command and args
        service |= {"entrypoint": run["command"]} if "command" in run else {}
        service |= {"command": run["args"], "network_mode": "host"}
        if role == "leader":
            service["healthcheck"] = base["healthcheck"]
        services[role] = service
    return {"services": services}


def leader_worker_set(launch: files.Launch, commands: NodeCommands) -> list[dict]:
    """A LeaderWorkerSet (one group of ``nodes`` pods per replica) and a Service in front of the leaders."""
    name = files.dns_name(launch.name)
    workers = " ".join(LWS_WORKER_ADDRESS.format(index=i) for i in range(1, commands.nodes))
    leader, worker = commands.fill(launch, files.MOUNT, launch.container_model, "$(LWS_LEADER_ADDRESS)",
                                   "$(LWS_WORKER_INDEX)", "$(LWS_GROUP_SIZE)", workers)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": launch.engine}
    deployment = files.kubernetes(launch)[0]
    pod = deployment["spec"]["template"]["spec"]

    def template(role: str, text: str) -> dict:
        spec = copy.deepcopy(pod)  # each template its own objects (YAML without anchors)
        container = dict(spec["containers"][0], **container_command(launch, text), name=f"{launch.engine}-{role}")
        if role == "worker":  # workers serve no HTTP: no port, no HTTP probes (the group restarts as one)
            for key in ("ports", "startupProbe", "readinessProbe", "livenessProbe"):
                container.pop(key)
        return {"metadata": {"labels": {**labels, "role": role}}, "spec": dict(spec, containers=[container])}

    lws = {
        "apiVersion": LWS_API, "kind": "LeaderWorkerSet", "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"replicas": 1, "startupPolicy": "LeaderCreated",
                 "leaderWorkerTemplate": {"size": commands.nodes, "restartPolicy": "RecreateGroupOnPodRestart",
                                          "leaderTemplate": template("leader", leader),
                                          "workerTemplate": template("worker", worker)}},
    }
    selector = {**labels, "role": "leader", LWS_WORKER_INDEX_LABEL: "0"}
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"type": "ClusterIP", "selector": selector,
                 "ports": [{"name": "http", "port": launch.port, "targetPort": "http", "protocol": "TCP"}]},
    }
    return [lws, service]


def write_all(folder, launch: files.Launch, commands: NodeCommands) -> list[str]:
    """launch.sh for every node, and docker-compose.yaml + kubernetes.yaml when the launch has an image."""
    path = folder / "launch.sh"
    path.write_text(launch_script(launch, commands))
    path.chmod(0o755)
    if not launch.image:
        return ["launch.sh"]
    client = f'clients send model="{launch.name}" to the leader'
    notes = "".join(f"\n# {note}" for note in commands.notes)
    files.dump_yaml(compose(launch, commands), folder / "docker-compose.yaml",
                    f"# {launch.engine} for {launch.name} over {commands.nodes} nodes (written by llmopt): on the "
                    "leader `LEADER_ADDRESS=<its address> docker compose up leader`,\n# on each worker "
                    "`LEADER_ADDRESS=<leader address> NODE_RANK=<1..> docker compose up worker`; "
                    f"{client}.\n# The leader listens on {launch.deployment.publish_host} of its host; "
                    f"{files.key_note(launch)}.{notes}")
    secret = (f"\n# The API key comes from the Secret {apikey.SECRET!r} (key {apikey.SECRET_KEY!r}), "
              "which must exist." if launch.key_env else f"\n# {files.key_note(launch)}.")
    files.dump_yaml_all(leader_worker_set(launch, commands), folder / "kubernetes.yaml",
                        f"# {launch.engine} for {launch.name} over {commands.nodes} nodes (written by llmopt): a "
                        "LeaderWorkerSet (needs the LWS controller, kubernetes-sigs/lws);\n# "
                        f"{client}. Each pod mounts the artifact from the PersistentVolumeClaim "
                        f"'{files.dns_name(launch.name)}-artifact' (ReadOnlyMany across nodes).{secret}{notes}")
    return ["launch.sh", "docker-compose.yaml", "kubernetes.yaml"]
