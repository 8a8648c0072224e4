"""Deployment files for an engine's launch: docker-compose.yaml, kubernetes.yaml, launch.sh.

Every file runs the same command. The artifact folder is mounted read-only at
``/artifact`` (compose: the folder two levels above the compose file; Kubernetes: a
PersistentVolumeClaim holding a copy of the artifact), so the model is at
``/artifact/model`` and the engine's config at ``/artifact/deploy/<engine>/``; an engine that
names the model by its folder (trtllm-serve) gets the model folder again at
``/models/<served name>``. No secret is written: the Hugging Face token is a reference
(``${HF_TOKEN}`` from the shell that runs compose; a Secret ``hf-token`` in Kubernetes, optional), and
so is the API key clients must send (``Authorization: Bearer``): ``${LLMOPT_API_KEY}`` from the shell
that runs compose or launch.sh, the Secret ``llmopt-api-key`` (key ``api-key``, required) in
Kubernetes, handed to each engine the way it reads one (``Launch.key_env``, ``Launch.key_flag``;
TensorRT-LLM checks none). Inside a container the engine listens on every interface; compose publishes
the port on ``publish_host`` only (127.0.0.1 unless the recipe says otherwise), and launch.sh listens
there too unless ``LLMOPT_HOST`` says otherwise.

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

import ipaddress
import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field, field_validator

from llmopt import apikey
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
    publish_host: str = Field("127.0.0.1", description="Host address clients reach the server on: docker-compose.yaml "
                              "publishes the port there and launch.sh listens there (LLMOPT_HOST overrides it when it "
                              "runs). 127.0.0.1: this machine only; 0.0.0.0: every interface, then set LLMOPT_API_KEY "
                              "(TensorRT-LLM checks no key: put an authenticating proxy in front; docs/deploy.md).")

    @field_validator("publish_host")
    @classmethod
    def _an_address(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address: use 127.0.0.1 (this machine only), 0.0.0.0 (every "
                             "interface) or one address of this machine") from None
        return value


@dataclass
class Launch:
    """One engine launch as every deployment file runs it."""

    engine: str  # vllm | trtllm | sglang | ort
    name: str  # served model name (the recipe's name)
    image: str | None  # container image with tag; None: no container files (launch.sh only)
    entrypoint: list[str]  # the program: ["vllm", "serve"]
    args: list[str]  # its arguments, with {model}, {config} and {draft} placeholders for paths (other braces doubled)
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
    key_env: str | None = None  # the variable the engine reads its API key from; None: it checks no key
    key_flag: str | None = None  # the option that takes the key, for an engine that reads no variable (SGLang)
    ready_timeout: int = 5  # seconds a readiness answer may take

    def argv(self, root: str, model: str | None = None) -> list[str]:
        """The full command with paths under ``root`` (the artifact folder): {model}, {config} and {draft} (the
        draft model the artifact carries)."""
        model = model or f"{root}/model"
        config = f"{root}/deploy/{self.engine}"
        return [*self.entrypoint, *(a.format(model=model, config=config, draft=f"{root}/draft") for a in self.args)]

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


def published(host: str, port: int) -> str:
    """compose's ``ports`` entry: ``port`` published on ``host`` only."""
    return f"[{host}]:{port}:{port}" if ":" in host else f"{host}:{port}:{port}"


def key_lines(launch: Launch) -> list[str]:
    """launch.sh lines that hand ``$LLMOPT_API_KEY`` to the engine's own variable, when it has one."""
    if launch.key_env and launch.key_env != apikey.ENV:
        return [f'if [ -n "${{{apikey.ENV}:-}}" ]; then export {launch.key_env}="${apikey.ENV}"; fi']
    return []


def key_words(launch: Launch) -> str:
    """Shell words that pass ``$LLMOPT_API_KEY`` to the engine's key option, when it is set ('' without one)."""
    return f'${{{apikey.ENV}:+{launch.key_flag} "${apikey.ENV}"}}' if launch.key_flag else ""


def key_note(launch: Launch) -> str:
    """What protects the server, for the files' headers."""
    if not launch.key_env:
        return (f"{launch.engine} checks no API key: keep it on 127.0.0.1 or behind an authenticating proxy "
                "(docs/deploy.md)")
    return f"clients send the key in {apikey.ENV} as `Authorization: Bearer` (docs/deploy.md)"


def local_host(argv: list[str], host: str) -> list[str]:
    """``argv`` with the value of its ``--host`` replaced by ``host`` (launch.sh: outside a container)."""
    return [host if i and argv[i - 1] == "--host" else part for i, part in enumerate(argv)]


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
    if launch.key_flag:  # compose puts the key of the shell that runs it there; empty: no key
        argv += [launch.key_flag, f"${{{apikey.ENV}:-}}"]
    service = {"image": launch.image}
    if launch.keep_entrypoint:
        service["command"] = argv
    else:
        service |= {"entrypoint": launch.entrypoint, "command": argv[len(launch.entrypoint):]}
    volumes = [f"../..:{MOUNT}:ro"] + ([f"../../model:{launch.container_model}:ro"] if launch.served_dir else [])
    environment = {"HF_TOKEN": "${HF_TOKEN:-}", **launch.env}
    if launch.key_env:
        environment[launch.key_env] = f"${{{apikey.ENV}:-}}"
    service |= {
        "ports": [published(launch.deployment.publish_host, launch.port)],
        "volumes": volumes,
        "environment": environment,
        "shm_size": f"{launch.deployment.shm_gib}gb",
        "healthcheck": {"test": health_check_command(launch.port, launch.ready_path), "interval": "30s",
                        "timeout": f"{max(10, launch.ready_timeout)}s", "retries": 3,
                        "start_period": f"{STARTUP_SECONDS}s"},
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
    if launch.key_env:  # required: a pod without the Secret does not start, rather than serve everyone
        env.append({"name": launch.key_env, "valueFrom": {"secretKeyRef": {"name": apikey.SECRET,
                                                                             "key": apikey.SECRET_KEY}}})
    env += [{"name": k, "value": v} for k, v in launch.env.items()]
    if launch.key_flag:  # Kubernetes expands $(VAR) in args from the container's environment
        argv += [launch.key_flag, f"$({launch.key_env})"]
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
        "startupProbe": _probe(launch.ready_path, 10, STARTUP_SECONDS // 10, launch.ready_timeout),
        "readinessProbe": _probe(launch.ready_path, 10, 3, launch.ready_timeout),
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
        f"# It listens on {launch.deployment.publish_host} (LLMOPT_HOST: another address); {key_note(launch)}.",
        *[f"# {note}" for note in launch.notes],
        "set -euo pipefail",
        'cd "$(dirname "$0")/../.."',
    ]
    model = None
    if launch.served_dir:  # the engine names the model by its folder: a folder named like the recipe
        lines += ['served="${LLMOPT_RUN_DIR:-$(mktemp -d)}"', f'ln -sfn "$PWD/model" "$served/{launch.name}"']
        model = f"$served/{launch.name}"
    host = f'"${{LLMOPT_HOST:-{launch.deployment.publish_host}}}"'
    argv = local_host(launch.argv(".", model), host)
    parts = [part if part == host else f'"{part}"' if model and part == model else shlex.quote(part) for part in argv]
    lines += key_lines(launch)
    lines += [" ".join(["exec", *parts, *filter(None, [key_words(launch)]), '"$@"']), ""]
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
                  f" {client}.\n# Published on {launch.deployment.publish_host}; {key_note(launch)}.")
        claim = f"{dns_name(launch.name)}-artifact"
        secret = (f"\n# The API key comes from the Secret {apikey.SECRET!r} (key {apikey.SECRET_KEY!r}), which must "
                  "exist: `kubectl create secret generic llmopt-api-key --from-literal=api-key=...`."
                  if launch.key_env else f"\n# {key_note(launch)}.")
        dump_yaml_all(kubernetes(launch), folder / "kubernetes.yaml",
                      f"# {launch.engine} for {launch.name} (written by llmopt); {client}. The Deployment mounts the "
                      f"artifact folder\n# from the PersistentVolumeClaim {claim!r}; the token comes from the optional "
                      f"Secret {HF_TOKEN_SECRET!r} (key \"token\").{secret}")
        written += ["docker-compose.yaml", "kubernetes.yaml"]
    return written
