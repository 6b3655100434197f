"""deploy/k8s: every manifest is valid Kubernetes (validated offline against the API
schemas by kubernetes-validate), and the pieces fit together: probes hit latgate's real
health routes, selectors match, the ConfigMap is a config latgate loads with the
Secret's keys, and the HPA, PDB and drain timings agree."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import kubernetes_validate
import pytest
import yaml
from replay import ReplayScript, replay_server
from stack import gateway

from latgate.foundation.config import load_config_text

K8S = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
KUBERNETES_VERSION = "1.30.0"
MANIFESTS = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def documents() -> list[dict]:
    out = []
    for name in MANIFESTS:
        out.extend(doc for doc in yaml.safe_load_all((K8S / name).read_text()) if doc)
    return out


def find(kind: str, name: str) -> dict:
    matches = [d for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}"
    return matches[0]


def gateway_pod() -> dict:
    return find("Deployment", "latgate")["spec"]["template"]


def container() -> dict:
    (only,) = gateway_pod()["spec"]["containers"]
    return only


def labels_match(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("name", MANIFESTS)
def test_manifest_is_valid_kubernetes_in_strict_mode(name: str) -> None:
    for doc in yaml.safe_load_all((K8S / name).read_text()):
        if doc:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == MANIFESTS


def test_every_kind_the_deployment_needs_is_there() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in documents()}
    assert kinds >= {
        ("Deployment", "latgate"),
        ("Service", "latgate"),
        ("ConfigMap", "latgate-config"),
        ("Secret", "latgate-keys"),
        ("HorizontalPodAutoscaler", "latgate"),
        ("PodDisruptionBudget", "latgate"),
        ("Deployment", "latgate-redis"),
        ("Service", "latgate-redis"),
    }


def test_probes_hit_latgates_health_routes_which_answer_on_a_running_gateway() -> None:
    c = container()
    port_names = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["port"] in port_names
    config = load_config_text(configmap_config(), source="configmap", env=secret_env())
    assert port_names["http"] == config.server.port and config.server.host == "0.0.0.0"
    with (
        replay_server(ReplayScript.json_response(200, {"object": "list", "data": []})) as upstream,
        gateway(f'[providers.p]\napi_base = "{upstream.base_url}"\n') as gw,
    ):
        assert httpx.get(gw.url + c["livenessProbe"]["httpGet"]["path"]).status_code == 200
        assert httpx.get(gw.url + c["readinessProbe"]["httpGet"]["path"]).status_code == 200


def test_service_pdb_and_hpa_point_at_the_gateway_pods() -> None:
    pod_labels = gateway_pod()["metadata"]["labels"]
    deployment = find("Deployment", "latgate")
    assert labels_match(deployment["spec"]["selector"]["matchLabels"], pod_labels)
    service = find("Service", "latgate")
    assert labels_match(service["spec"]["selector"], pod_labels)
    assert service["spec"]["ports"][0]["targetPort"] in {p["name"] for p in container()["ports"]}
    pdb = find("PodDisruptionBudget", "latgate")
    assert labels_match(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    hpa = find("HorizontalPodAutoscaler", "latgate")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "latgate"}
    assert (
        pdb["spec"]["minAvailable"]
        < hpa["spec"]["minReplicas"]
        <= deployment["spec"]["replicas"]
        <= hpa["spec"]["maxReplicas"]
    )
    redis_labels = find("Deployment", "latgate-redis")["spec"]["template"]["metadata"]["labels"]
    assert not labels_match(
        service["spec"]["selector"], redis_labels
    )  # the gateway Service never picks Redis


def configmap_config() -> str:
    return find("ConfigMap", "latgate-config")["data"]["config.toml"]


def secret_env() -> dict[str, str]:
    return dict(find("Secret", "latgate-keys")["stringData"])


def test_configmap_is_a_config_latgate_loads_with_the_secrets_keys() -> None:
    text = configmap_config()
    referenced = set(re.findall(r"\$\{(?:env:)?([A-Z0-9_]+)", text))
    config = load_config_text(text, source="configmap", env=secret_env())
    referenced |= {p.api_key_env for p in config.providers.values() if p.api_key_env}
    assert referenced <= set(secret_env())
    assert config.auth is not None and any(k.admin for k in config.auth.keys)
    assert all(key.key in secret_env().values() for key in config.auth.keys)


def test_state_is_redis_through_the_redis_service() -> None:
    config = load_config_text(configmap_config(), source="configmap", env=secret_env())
    redis_service = find("Service", "latgate-redis")
    assert (
        config.state.redis_url
        == f"redis://{redis_service['metadata']['name']}:{redis_service['spec']['ports'][0]['port']}/0"
    )
    redis_pod = find("Deployment", "latgate-redis")["spec"]["template"]
    assert labels_match(redis_service["spec"]["selector"], redis_pod["metadata"]["labels"])
    policy = find("NetworkPolicy", "latgate-redis")
    assert labels_match(policy["spec"]["podSelector"]["matchLabels"], redis_pod["metadata"]["labels"])
    (allowed,) = policy["spec"]["ingress"][0]["from"]
    assert labels_match(allowed["podSelector"]["matchLabels"], gateway_pod()["metadata"]["labels"])


def test_config_is_mounted_where_latgate_reads_it_and_keys_come_from_the_secret() -> None:
    c = container()
    env = {e["name"]: e["value"] for e in c["env"]}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in gateway_pod()["spec"]["volumes"]}
    config_path = Path(env["LATGATE_CONFIG"])
    (volume_name,) = [
        name for name, v in volumes.items() if v.get("configMap", {}).get("name") == "latgate-config"
    ]
    assert Path(mounts[volume_name]) == config_path.parent
    assert config_path.name in find("ConfigMap", "latgate-config")["data"]
    assert {"secretRef": {"name": "latgate-keys"}} in c["envFrom"]


def test_pods_run_unprivileged_and_drain_within_the_grace_period() -> None:
    pod = gateway_pod()["spec"]
    c = container()
    assert pod["securityContext"]["runAsNonRoot"] and c["securityContext"]["readOnlyRootFilesystem"]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    args = c["args"]
    drain = float(args[args.index("--drain-timeout") + 1])
    pre_stop = 5
    assert drain + pre_stop < pod["terminationGracePeriodSeconds"]
