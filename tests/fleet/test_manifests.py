"""The fleet's compose service and Kubernetes manifest, checked offline: they load, their commands
parse with `tokenrouter fleet`'s own parser and name files that exist, and the pieces that make a
fleet (discovery, request plane, GPUs, drain time, probes) are where they must be."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from tokenrouter.fleet import launcher

ROOT = Path(__file__).resolve().parents[2]


def fleet_args(command: list[str]) -> argparse.Namespace:
    assert command[:2] == ["tokenrouter", "fleet"]
    parser = argparse.ArgumentParser()
    launcher.configure(parser)
    return parser.parse_args(command[2:])


@pytest.fixture(scope="module")
def kubernetes() -> dict[str, dict]:
    documents = list(yaml.safe_load_all((ROOT / "docker/kubernetes/fleet.yaml").read_text()))
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in documents}


def container(deployment: dict) -> dict:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def test_every_deployment_selects_its_pods_and_has_a_service(kubernetes):
    deployments = {k: d for k, d in kubernetes.items() if k.startswith("Deployment/")}
    for deployment in deployments.values():
        assert deployment["apiVersion"] == "apps/v1"
        assert deployment["spec"]["selector"]["matchLabels"].items() <= \
            deployment["spec"]["template"]["metadata"]["labels"].items()
    services = {name.split("/")[1] for name in kubernetes if name.startswith("Service/")}
    assert services == {"tokenrouter-etcd", "tokenrouter-nats", "tokenrouter-frontend"}


def test_frontend_and_workers_share_etcd_and_nats(kubernetes):
    frontend = container(kubernetes["Deployment/tokenrouter-frontend"])
    worker = container(kubernetes["Deployment/tokenrouter-worker"])
    for part in (frontend, worker):
        env = {e["name"]: e["value"] for e in part["env"]}
        assert env == {"ETCD_ENDPOINTS": "http://tokenrouter-etcd:2379", "NATS_SERVER": "nats://tokenrouter-nats:4222"}
        args = fleet_args(part["command"])
        assert args.discovery == "etcd" and (ROOT / args.config).is_file()
    front_args, worker_args = fleet_args(frontend["command"]), fleet_args(worker["command"])
    assert front_args.no_workers and front_args.host == "0.0.0.0" and front_args.migration_limit > 0
    assert frontend["ports"][0]["containerPort"] == front_args.http_port
    assert worker_args.no_frontend and worker_args.replicas == 1
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert worker["readinessProbe"]["httpGet"]["port"] == worker_args.worker_status_port


def test_compose_fleet_service_serves_the_openai_port_with_one_gpu_per_replica():
    compose = yaml.safe_load((ROOT / "docker/docker-compose.yml").read_text())
    service = compose["services"]["tokenrouter-fleet"]
    assert service["build"]["args"]["NO_DEPS_PACKAGES"].split() == ["ai-dynamo==1.6.1", "ai-dynamo-runtime==1.6.1"]
    command = [part.replace("${TOKENROUTER_REPLICAS:-2}", "2") for part in service["command"]]
    command = [part.replace("${TOKENROUTER_GPU_CONFIG:-configs/qwen2.5-coder-gpu.yaml}",
                            "configs/qwen2.5-coder-gpu.yaml") for part in command]
    args = fleet_args(command)
    assert args.gpus_per_replica == 1 and args.host == "0.0.0.0" and service["ports"] == [f"{args.http_port}:9000"]
    assert "NO_DEPS_PACKAGES" in (ROOT / "docker/Dockerfile").read_text()


def test_install_pins_match_the_image():
    install = (ROOT / "tools/install.sh").read_text()
    assert "--no-deps ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1" in install


def test_worker_environment_gives_each_replica_its_port_and_gpus():
    assert launcher.worker_environment(1, 9090, 2) == {"DYN_SYSTEM_PORT": "9091", "CUDA_VISIBLE_DEVICES": "2,3"}
    assert launcher.worker_environment(0, -1, 0) == {}
