"""Deployment files for an engine's launch: docker-compose.yaml, kubernetes.yaml, launch.sh.

Every file runs the same command. The artifact folder is mounted read-only at
``/artifact`` (compose: the folder two levels above the compose file; Kubernetes: a
PersistentVolumeClaim holding a copy of the artifact), so the model is at
``/artifact/model`` and the engine's config at ``/artifact/deploy/<engine>/``; an engine that
names the model by its folder (trtllm-serve) gets the model folder again at
``/models/<served name>``. No secret is written: the Hugging Face token is a reference
(``${HF_TOKEN}`` from the shell that runs compose; a Secret ``hf-token`` in Kubernetes, optional).

What a platform team expects of the manifests:

* CPU and memory requests equal to limits (Guaranteed QoS), the memory-backed ``/dev/shm``
  counted in the memory (its pages are charged to the container), GPUs as ``nvidia.com/gpu``;
* a rollout that needs no spare GPU (``Recreate``: the old pod frees its GPUs first);
* a toleration for the ``nvidia.com/gpu`` taint GPU nodes carry, and an optional node selector;
* no privilege escalation, and a non-root user where the engine's image has one;
* the engine's own readiness and liveness routes.

YAML is written with pyyaml (the ``deploy`` extra).
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field

from llmopt.recipe.schema import Options
from llmopt.libraries import require

MOUNT = "/artifact"
STARTUP_SECONDS = 1200  # loading weights, compiling and capturing graphs can take minutes
HF_TOKEN_SECRET = "hf-token"  # a Secret the cluster may hold (key "token"); optional
GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}  # what GPU node pools carry


class DeploymentOptions(Options):
    """Resources and placement of docker-compose.yaml and kubernetes.yaml (every serve backend's options)."""

    cpus: float | None = Field(None, gt=0, description="CPU cores of the container (requests = limits); default 4 "
                               "per GPU, at least 4.")
    memory_gib: int | None = Field(None, ge=1, description="Memory of the container besides /dev/shm, in GiB "
                                   "(requests = limits, plus shm_gib); default 16 + 8 per GPU.")
    shm_gib: int = Field(16, ge=1, description="Size of the memory-backed /dev/shm (NCCL, worker processes); "
                         "counted in the container's memory.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Kubernetes nodeSelector of the pod, "
                                          "e.g. {\"nvidia.com/gpu.product\" = \"NVIDIA-H100-80GB-HBM3\"}.")


@dataclass
class Launch:
    """One engine launch as every deployment file runs it."""

    engine: str  # vllm | trtllm | sglang | ort
    name: str  # served model name (the recipe's name)
    image: str | None  # container image with tag; None: no container files (launch.sh only)
    entrypoint: list[str]  # the program: ["vllm", "serve"]
    args: list[str]  # its arguments, with {model} and {config} placeholders for paths
    port: int
    gpus: int  # GPUs one replica reserves (the product of the config's parallel sizes)
    deployment: DeploymentOptions = field(default_factory=DeploymentOptions)
    ready_path: str = "/health"  # readiness and startup probes, compose health check
    live_path: str = "/health"  # liveness probe
    live_timeout: int = 5  # seconds a liveness answer may take
    env: dict[str, str] = field(default_factory=dict)  # plain, non-secret variables
    keep_entrypoint: bool = False  # the image's ENTRYPOINT wraps the command (NGC images): pass it as arguments
    user: tuple[int, int] | None = None  # (uid, gid) of the image's non-root user; None: the image's default
    ulimits: dict[str, int] = field(default_factory=dict)  # docker ulimits (Kubernetes has no ulimit field)
    served_dir: bool = False  # the engine names the model by its folder: serve it from a folder named `name`
    host_memory_gib: int = 0  # memory the process holds besides the engine's own (a CPU-served model)
    notes: list[str] = field(default_factory=list)  # comment lines of launch.sh (why an argument has its value)

    def argv(self, root: str, model: str | None = None) -> list[str]:
        """The full command with paths under ``root`` (the artifact folder)."""
        model = model or f"{root}/model"
        config = f"{root}/deploy/{self.engine}"
        return [*self.entrypoint, *(a.format(model=model, config=config) for a in self.args)]

    def command(self, root: str = ".") -> str:
        return " ".join(shlex.quote(part) for part in self.argv(root))

    @property
    def container_model(self) -> str:
        return f"/models/{self.name}" if self.served_dir else f"{MOUNT}/model"

    @property
    def cpus(self) -> str:
        cpus = self.deployment.cpus or max(4, 4 * self.gpus)
        return str(int(cpus)) if float(cpus).is_integer() else str(cpus)

    @property
    def memory_gib(self) -> int:
        """Container memory: the engine's host memory plus the memory-backed /dev/shm."""
        host = self.deployment.memory_gib or 16 + 8 * self.gpus + self.host_memory_gib
        return host + self.deployment.shm_gib


def gib_of(nbytes: int) -> int:
    return math.ceil(nbytes / 2**30)


def dns_name(name: str) -> str:
    """A Kubernetes object name (RFC 1123 label) from a recipe name."""
    text = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    return (text or "llmopt")[:63].rstrip("-")


def dump_yaml(doc, path: Path, header: str = "", comments: dict[str, str] | None = None) -> None:
    """Write ``doc`` as YAML under ``header``, with a comment line above each top-level key of ``comments``."""
    yaml = require("yaml", "deploy", "writing deployment files", package="pyyaml")
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    if comments:
        lines = []
        for line in text.splitlines(keepends=True):
            key = line.split(":", 1)[0] if line[:1] not in (" ", "-") else None
            if key in comments:
                lines.append(f"# {comments[key]}\n")
            lines.append(line)
        text = "".join(lines)
    path.write_text((header + "\n" if header else "") + text)


def dump_yaml_all(docs: list, path: Path, header: str = "") -> None:
    yaml = require("yaml", "deploy", "writing deployment files", package="pyyaml")
    text = yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False)
    path.write_text((header + "\n" if header else "") + text)


def health_check_command(port: int, path: str) -> list[str]:
    probe = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}{path}', timeout=5)"
    return ["CMD", "python3", "-c", probe]


def compose(launch: Launch) -> dict:
    argv = launch.argv(MOUNT, launch.container_model)
    service = {"image": launch.image}
    if launch.keep_entrypoint:
        service["command"] = argv
    else:
        service |= {"entrypoint": launch.entrypoint, "command": argv[len(launch.entrypoint):]}
    volumes = [f"../..:{MOUNT}:ro"] + ([f"../../model:{launch.container_model}:ro"] if launch.served_dir else [])
    service |= {
        "ports": [f"{launch.port}:{launch.port}"],
        "volumes": volumes,
        "environment": {"HF_TOKEN": "${HF_TOKEN:-}", **launch.env},
        "shm_size": f"{launch.deployment.shm_gib}gb",
        "healthcheck": {"test": health_check_command(launch.port, launch.ready_path), "interval": "30s",
                        "timeout": "10s", "retries": 3, "start_period": f"{STARTUP_SECONDS}s"},
        "restart": "unless-stopped",
    }
    if launch.user:
        service["user"] = f"{launch.user[0]}:{launch.user[1]}"
    if launch.ulimits:
        service["ulimits"] = dict(launch.ulimits)
    resources: dict = {"limits": {"cpus": launch.cpus, "memory": f"{launch.memory_gib}g"}}
    if launch.gpus:
        resources["reservations"] = {"devices": [{"driver": "nvidia", "count": launch.gpus, "capabilities": ["gpu"]}]}
    service["deploy"] = {"resources": resources}
    return {"services": {dns_name(launch.name): service}}


def _probe(path: str, period: int, failures: int, timeout: int = 5) -> dict:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "timeoutSeconds": timeout,
            "failureThreshold": failures}


def security_context(launch: Launch) -> dict:
    context: dict = {"allowPrivilegeEscalation": False, "seccompProfile": {"type": "RuntimeDefault"}}
    if launch.user:
        context |= {"runAsNonRoot": True, "runAsUser": launch.user[0], "runAsGroup": launch.user[1],
                    "capabilities": {"drop": ["ALL"]}}
    return context


def container(launch: Launch) -> dict:
    argv = launch.argv(MOUNT, launch.container_model)
    env = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": HF_TOKEN_SECRET, "key": "token",
                                                               "optional": True}}}]
    env += [{"name": k, "value": v} for k, v in launch.env.items()]
    quantities = {"cpu": launch.cpus, "memory": f"{launch.memory_gib}Gi"}
    if launch.gpus:
        quantities["nvidia.com/gpu"] = launch.gpus
    mounts = [{"name": "artifact", "mountPath": MOUNT, "readOnly": True}, {"name": "dshm", "mountPath": "/dev/shm"}]
    if launch.served_dir:
        mounts.append({"name": "artifact", "mountPath": launch.container_model, "subPath": "model", "readOnly": True})
    out = {"name": launch.engine, "image": launch.image}
    if launch.keep_entrypoint:
        out["args"] = argv
    else:
        out |= {"command": launch.entrypoint, "args": argv[len(launch.entrypoint):]}
    return out | {
        "ports": [{"name": "http", "containerPort": launch.port, "protocol": "TCP"}],
        "env": env,
        "resources": {"requests": dict(quantities), "limits": dict(quantities)},
        "securityContext": security_context(launch),
        "startupProbe": _probe(launch.ready_path, 10, STARTUP_SECONDS // 10),
        "readinessProbe": _probe(launch.ready_path, 10, 3),
        "livenessProbe": _probe(launch.live_path, 30, 3, launch.live_timeout),
        "volumeMounts": mounts,
    }


def kubernetes(launch: Launch) -> list[dict]:
    """A Deployment and a Service; GPU requests = the GPUs one replica reserves."""
    name = dns_name(launch.name)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": launch.engine}
    pod: dict = {"containers": [container(launch)], "volumes": [
        {"name": "artifact", "persistentVolumeClaim": {"claimName": f"{name}-artifact", "readOnly": True}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{launch.deployment.shm_gib}Gi"}}]}
    if launch.gpus:
        pod["tolerations"] = [dict(GPU_TAINT)]
    if launch.deployment.node_selector:
        pod["nodeSelector"] = dict(launch.deployment.node_selector)
    # a GPU replica frees its GPUs before the next one starts; a CPU one is replaced without a gap
    strategy = {"type": "Recreate"} if launch.gpus else {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"replicas": 1, "strategy": strategy, "selector": {"matchLabels": dict(labels)},
                 "template": {"metadata": {"labels": dict(labels)}, "spec": pod}},
    }
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"type": "ClusterIP", "selector": dict(labels),
                 "ports": [{"name": "http", "port": launch.port, "targetPort": "http", "protocol": "TCP"}]},
    }
    return [deployment, service]


def launch_script(launch: Launch) -> str:
    lines = [
        "#!/usr/bin/env bash",
        f"# Starts {launch.engine} on this machine for the artifact two folders up (written by llmopt).",
        *[f"# {note}" for note in launch.notes],
        "set -euo pipefail",
        'cd "$(dirname "$0")/../.."',
    ]
    model = None
    if launch.served_dir:  # the engine names the model by its folder: a folder named like the recipe
        lines += ['served="${LLMOPT_RUN_DIR:-$(mktemp -d)}"', f'ln -sfn "$PWD/model" "$served/{launch.name}"']
        model = f"$served/{launch.name}"
    parts = [f'"{part}"' if model and part == model else shlex.quote(part) for part in launch.argv(".", model)]
    lines += [f'exec {" ".join(parts)} "$@"', ""]
    return "\n".join(lines)


def write_all(folder: Path, launch: Launch, script: str | None = None) -> list[str]:
    """Write launch.sh (``script``, else the launch's command), and docker-compose.yaml +
    kubernetes.yaml when the launch has an image."""
    written = []
    path = folder / "launch.sh"
    path.write_text(script or launch_script(launch))
    path.chmod(0o755)
    written.append(path.name)
    if launch.image:
        client = f'clients send model="{launch.name}"'
        dump_yaml(compose(launch), folder / "docker-compose.yaml",
                  f"# {launch.engine} for {launch.name}: `docker compose up` in this folder (written by llmopt);"
                  f" {client}.")
        claim = f"{dns_name(launch.name)}-artifact"
        dump_yaml_all(kubernetes(launch), folder / "kubernetes.yaml",
                      f"# {launch.engine} for {launch.name} (written by llmopt); {client}. The Deployment mounts the "
                      f"artifact folder\n# from the PersistentVolumeClaim {claim!r}; the token comes from the optional "
                      f"Secret {HF_TOKEN_SECRET!r} (key \"token\").")
        written += ["docker-compose.yaml", "kubernetes.yaml"]
    return written
