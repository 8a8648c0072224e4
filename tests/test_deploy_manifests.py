"""docker-compose.yaml and kubernetes.yaml a platform team would accept: CPU and memory requests and
limits that count the memory-backed /dev/shm, a rollout that needs no spare GPU, tolerations and node
selection for GPU nodes, a non-root security context where the engine's image allows it, each engine's
readiness and liveness routes, and TensorRT-LLM's documented ulimits with the NGC entrypoint kept.
Issue 15, defects 7 and 8; every manifest is checked with kubernetes-validate (Kubernetes 1.37.0, strict)."""

from __future__ import annotations

import pytest
import yaml

from test_deploy_configs import onnx_model, render, render_ort


def manifests(folder):
    deployment, service = yaml.safe_load_all((folder / "kubernetes.yaml").read_text())
    compose = yaml.safe_load((folder / "docker-compose.yaml").read_text())
    return deployment, service, next(iter(compose["services"].values()))


def gib(quantity: str) -> int:
    assert quantity.endswith("Gi"), quantity
    return int(quantity[:-2])


@pytest.mark.parametrize("engine", ["vllm", "trtllm", "sglang"])
def test_manifests_are_valid_kubernetes(tmp_path, engine):
    import kubernetes_validate  # the dev extra installs it: a manifest test that could skip could not fail
    _, folder = render(tmp_path, engine, 'node_selector = { "nvidia.com/gpu.product" = "NVIDIA-H100-80GB-HBM3" }')
    for doc in yaml.safe_load_all((folder / "kubernetes.yaml").read_text()):
        kubernetes_validate.validate(doc, "1.37.0", strict=True)


@pytest.mark.parametrize("engine", ["vllm", "trtllm", "sglang"])
def test_resources_count_the_shared_memory_volume(tmp_path, engine):
    _, folder = render(tmp_path, engine, "tensor_parallel_size = 3\nshm_gib = 8")
    deployment, _, service = manifests(folder)
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    requests, limits = container["resources"]["requests"], container["resources"]["limits"]
    assert requests == limits  # Guaranteed QoS: the node cannot squeeze a serving pod
    assert limits["nvidia.com/gpu"] == 3 and limits["cpu"] == "12"  # 4 cores per GPU
    assert gib(limits["memory"]) == 16 + 8 * 3 + 8  # host memory + the memory-backed /dev/shm
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert service["shm_size"] == "8gb"
    assert service["deploy"]["resources"]["limits"] == {"cpus": "12", "memory": "48g"}


def test_resources_can_be_set(tmp_path):
    _, folder = render(tmp_path, "vllm", "cpus = 6\nmemory_gib = 100")
    container = manifests(folder)[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["cpu"] == "6" and container["resources"]["limits"]["memory"] == "116Gi"


@pytest.mark.parametrize("engine", ["vllm", "trtllm", "sglang"])
def test_rollout_needs_no_spare_gpu_and_lands_on_gpu_nodes(tmp_path, engine):
    _, folder = render(tmp_path, engine, 'node_selector = { "nvidia.com/gpu.product" = "NVIDIA-H100-80GB-HBM3" }')
    deployment = manifests(folder)[0]
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def test_vllm_runs_as_the_images_non_root_user(tmp_path):
    _, folder = render(tmp_path, "vllm")
    deployment, _, service = manifests(folder)
    pod = deployment["spec"]["template"]["spec"]
    context = pod["containers"][0]["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] == 2000 and context["runAsGroup"] == 0
    assert context["allowPrivilegeEscalation"] is False and context["capabilities"] == {"drop": ["ALL"]}
    assert service["user"] == "2000:0"


@pytest.mark.parametrize("engine", ["trtllm", "sglang"])
def test_images_without_a_non_root_user_still_drop_privilege_escalation(tmp_path, engine):
    _, folder = render(tmp_path, engine)
    deployment, _, service = manifests(folder)
    context = deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert context["allowPrivilegeEscalation"] is False and "runAsNonRoot" not in context
    assert "user" not in service


@pytest.mark.parametrize("engine, ready, live", [
    ("vllm", "/health", "/health"),
    ("trtllm", "/health", "/health"),
    # SGLang's /ready wants the API key (only /health* and /metrics are open), so /health, which generates a
    # token, is the readiness route too, with a timeout that lets it
    ("sglang", "/health", "/health"),
])
def test_each_engine_gets_its_readiness_and_liveness_routes(tmp_path, engine, ready, live):
    _, folder = render(tmp_path, engine)
    deployment, _, service = manifests(folder)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == ready
    assert container["startupProbe"]["httpGet"]["path"] == ready
    assert container["livenessProbe"]["httpGet"]["path"] == live
    assert ready in " ".join(service["healthcheck"]["test"])
    if engine == "sglang":  # a /health generation may wait up to SGLANG_HEALTH_CHECK_TIMEOUT (20 s)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["timeoutSeconds"] > 20
        assert int(service["healthcheck"]["timeout"].rstrip("s")) > 20


def test_trtllm_compose_keeps_the_ngc_entrypoint_and_nvidias_ulimits(tmp_path):
    _, folder = render(tmp_path, "trtllm")
    deployment, _, service = manifests(folder)
    assert "entrypoint" not in service and service["command"][0] == "trtllm-serve"
    assert service["ulimits"] == {"memlock": -1, "stack": 67108864}
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in container and container["args"][0] == "trtllm-serve"


def test_the_service_selects_the_pods_and_the_model_name_is_documented(tmp_path):
    _, folder = render(tmp_path, "vllm")
    text = (folder / "kubernetes.yaml").read_text()
    assert 'model="demo"' in text or "model=demo" in text
    deployment, service, _ = manifests(folder)
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_a_cpu_replica_rolls_without_a_gap(tmp_path):
    import kubernetes_validate  # the dev extra installs it: a manifest test that could skip could not fail
    _, folder = render_ort(tmp_path, onnx_model(tmp_path, []), 'image = "registry.example/llmopt-ort:1"')
    for doc in yaml.safe_load_all((folder / "kubernetes.yaml").read_text()):
        kubernetes_validate.validate(doc, "1.37.0", strict=True)
    deployment, _, service = manifests(folder)
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pod = deployment["spec"]["template"]["spec"]
    assert "tolerations" not in pod and "nvidia.com/gpu" not in pod["containers"][0]["resources"]["limits"]
    assert "reservations" not in service["deploy"]["resources"]
