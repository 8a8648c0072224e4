"""Deployment files for an engine's launch: docker-compose.yaml, kubernetes.yaml, launch.sh.

Every file runs the same command. The artifact folder is mounted read-only at
``/artifact`` (compose: the folder two levels above the compose file; Kubernetes: a
PersistentVolumeClaim holding a copy of the artifact), so the model is at
``/artifact/model`` and the engine's config at ``/artifact/deploy/<engine>/``.
No secret is written: the Hugging Face token is a reference (``${HF_TOKEN}`` from the
shell that runs compose; a Secret ``hf-token`` in Kubernetes, optional).

YAML is written with pyyaml (the ``deploy`` extra).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from llmopt.libraries import require

MOUNT = "/artifact"
SHM_GIB = 16  # /dev/shm for NCCL and the engines' worker processes
STARTUP_SECONDS = 1200  # loading weights, compiling and capturing graphs can take minutes
HF_TOKEN_SECRET = "hf-token"  # a Secret the cluster may hold (key "token"); optional


@dataclass
class Launch:
    """One engine launch as every deployment file runs it."""

    engine: str  # vllm | trtllm | sglang | ort
    name: str  # served model name (the recipe's name)
    image: str | None  # container image with tag; None: no container files (launch.sh only)
    entrypoint: list[str]  # the program: ["vllm", "serve"]
    args: list[str]  # its arguments, with {model} and {config} placeholders for paths
    port: int
    gpus: int  # GPUs one replica needs (tp x pp x dp)
    health_path: str = "/health"
    env: dict[str, str] = field(default_factory=dict)  # plain, non-secret variables

    def argv(self, root: str) -> list[str]:
        """The full command with paths under ``root`` (the artifact folder)."""
        model = f"{root}/model"
        config = f"{root}/deploy/{self.engine}"
        return [*self.entrypoint, *(a.format(model=model, config=config) for a in self.args)]

    def command(self, root: str = ".") -> str:
        return " ".join(shlex.quote(part) for part in self.argv(root))


def dns_name(name: str) -> str:
    """A Kubernetes object name (RFC 1123 label) from a recipe name."""
    text = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    return (text or "llmopt")[:63].rstrip("-")


def dump_yaml(doc, path: Path, header: str = "") -> None:
    yaml = require("yaml", "deploy", "writing deployment files", package="pyyaml")
    text = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
    path.write_text((header + "\n" if header else "") + text)


def dump_yaml_all(docs: list, path: Path, header: str = "") -> None:
    yaml = require("yaml", "deploy", "writing deployment files", package="pyyaml")
    text = yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False)
    path.write_text((header + "\n" if header else "") + text)


def health_check_command(port: int, path: str) -> list[str]:
    probe = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}{path}', timeout=5)"
    return ["CMD", "python3", "-c", probe]


def compose(launch: Launch) -> dict:
    service = {
        "image": launch.image,
        "entrypoint": launch.entrypoint,
        "command": launch.argv(MOUNT)[len(launch.entrypoint):],
        "ports": [f"{launch.port}:{launch.port}"],
        "volumes": [f"../..:{MOUNT}:ro"],
        "environment": {"HF_TOKEN": "${HF_TOKEN:-}", **launch.env},
        "shm_size": f"{SHM_GIB}gb",
        "healthcheck": {"test": health_check_command(launch.port, launch.health_path), "interval": "30s",
                        "timeout": "10s", "retries": 3, "start_period": f"{STARTUP_SECONDS}s"},
        "restart": "unless-stopped",
    }
    if launch.gpus:
        service["deploy"] = {"resources": {"reservations": {"devices": [
            {"driver": "nvidia", "count": launch.gpus, "capabilities": ["gpu"]}]}}}
    return {"services": {dns_name(launch.name): service}}


def _probe(launch: Launch, period: int, failures: int) -> dict:
    return {"httpGet": {"path": launch.health_path, "port": "http"}, "periodSeconds": period,
            "timeoutSeconds": 5, "failureThreshold": failures}


def kubernetes(launch: Launch) -> list[dict]:
    """A Deployment and a Service; GPU requests = tp x pp x dp of one replica."""
    name = dns_name(launch.name)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": launch.engine}
    env = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": HF_TOKEN_SECRET, "key": "token",
                                                               "optional": True}}}]
    env += [{"name": k, "value": v} for k, v in launch.env.items()]
    container = {
        "name": launch.engine, "image": launch.image, "command": launch.entrypoint,
        "args": launch.argv(MOUNT)[len(launch.entrypoint):],
        "ports": [{"name": "http", "containerPort": launch.port, "protocol": "TCP"}],
        "env": env,
        "startupProbe": _probe(launch, 10, STARTUP_SECONDS // 10),
        "readinessProbe": _probe(launch, 10, 3),
        "livenessProbe": _probe(launch, 30, 3),
        "volumeMounts": [{"name": "artifact", "mountPath": MOUNT, "readOnly": True},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if launch.gpus:
        gpus = {"nvidia.com/gpu": launch.gpus}
        container["resources"] = {"limits": dict(gpus), "requests": dict(gpus)}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"replicas": 1, "selector": {"matchLabels": dict(labels)}, "template": {
            "metadata": {"labels": dict(labels)},
            "spec": {"containers": [container], "volumes": [
                {"name": "artifact", "persistentVolumeClaim": {"claimName": f"{name}-artifact", "readOnly": True}},
                {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{SHM_GIB}Gi"}}]}}},
    }
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"type": "ClusterIP", "selector": dict(labels),
                 "ports": [{"name": "http", "port": launch.port, "targetPort": "http", "protocol": "TCP"}]},
    }
    return [deployment, service]


def launch_script(launch: Launch) -> str:
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# Starts {launch.engine} on this machine for the artifact two folders up (written by llmopt).",
        "set -euo pipefail",
        'cd "$(dirname "$0")/../.."',
        f"exec {launch.command('.')} \"$@\"",
        "",
    ])


def write_all(folder: Path, launch: Launch, script: str | None = None) -> list[str]:
    """Write launch.sh (``script``, else the launch's command), and docker-compose.yaml +
    kubernetes.yaml when the launch has an image."""
    written = []
    path = folder / "launch.sh"
    path.write_text(script or launch_script(launch))
    path.chmod(0o755)
    written.append(path.name)
    if launch.image:
        dump_yaml(compose(launch), folder / "docker-compose.yaml",
                  f"# {launch.engine} for {launch.name}: `docker compose up` in this folder (written by llmopt).")
        claim = f"{dns_name(launch.name)}-artifact"
        dump_yaml_all(kubernetes(launch), folder / "kubernetes.yaml",
                      f"# {launch.engine} for {launch.name} (written by llmopt). The Deployment mounts the artifact "
                      f"folder from the\n# PersistentVolumeClaim {claim!r}; the token comes from the optional Secret "
                      f"{HF_TOKEN_SECRET!r} (key \"token\").")
        written += ["docker-compose.yaml", "kubernetes.yaml"]
    return written
