"""deploy/: every file parses, names only what exists, and agrees with loomfs.config.

No sockets, no cluster: the manifests, TOML examples and systemd units are read as data and
checked against the real config loader, the real ``loomfs`` argument parser and each other.
The checks are functions returning a list of problems, so a test can also show that a
broken copy is caught. Schema check: ``kubernetes_validate`` (offline Kubernetes JSON
schemas, strict: unknown fields are errors); rendering: ``kubectl kustomize`` when installed.
"""

from __future__ import annotations

import copy
import functools
import importlib
import os
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from loomfs.cli import service as service_cli
from loomfs.cli.main import build_parser
from loomfs.common.routing import parse_addresses
from loomfs.config import MetaConfig, MgmtdConfig, StorageConfig, load
from loomfs.mgmtd.server import check_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
SYSTEMD = DEPLOY / "systemd"
CONFIGS: dict[str, type[Any]] = {"mgmtd": MgmtdConfig, "meta": MetaConfig, "storage": StorageConfig}
K8S_VERSION = "1.31.0"  # the oldest the manifests support (StatefulSet ordinals, pod-index label)
POD_IP = "10.1.2.3"  # what status.podIP stands for when the effective config is computed
POD_INDEX = "1"


# ---- reading ---------------------------------------------------------------------------------
def kustomization() -> dict[str, Any]:
    return dict(yaml.safe_load((K8S / "kustomization.yaml").read_text()))


def resources() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for name in kustomization()["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return docs


def workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("StatefulSet", "Deployment")]


def one_container(w: dict[str, Any]) -> dict[str, Any]:
    (c,) = w["spec"]["template"]["spec"]["containers"]
    return dict(c)


@functools.cache
def parser() -> Any:
    return build_parser()


def service_kind(command: list[str]) -> str:
    """``loomfs service KIND --config F`` -> KIND, through the real CLI parser."""
    args = parser().parse_args(command[1:])
    assert args.func is service_cli.run, command
    return str(args.kind)


def effective_config(w: dict[str, Any], docs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> Any:
    """What the pod's process would load: its ConfigMap file plus the env the manifest sets."""
    c = one_container(w)
    kind = service_kind(c["command"])
    for key in [k for k in os.environ if k.startswith("LOOMFS_")]:
        monkeypatch.delenv(key)
    secrets = dict(line.split("=", 1) for line in (K8S / "metastore.env").read_text().split())
    for e in c.get("env", []):
        if "value" in e:
            monkeypatch.setenv(e["name"], e["value"])
            continue
        ref = e["valueFrom"]
        if "secretKeyRef" in ref:
            monkeypatch.setenv(e["name"], secrets[ref["secretKeyRef"]["key"]])
        elif ref["fieldRef"]["fieldPath"] == "status.podIP":
            monkeypatch.setenv(e["name"], POD_IP)
        elif ref["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']":
            monkeypatch.setenv(e["name"], POD_INDEX)
        else:
            raise AssertionError(f"unexpected env source {e}")
    config_path = c["command"][c["command"].index("--config") + 1]
    return load(CONFIGS[kind], K8S / "config" / Path(config_path).name, env_prefix=kind.upper())


# ---- checks (each returns its problems) ------------------------------------------------------
def port_problems(w: dict[str, Any], cfg: Any, docs: list[dict[str, Any]]) -> list[str]:
    name = w["metadata"]["name"]
    c = one_container(w)
    kind = service_kind(c["command"])
    out: list[str] = []
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    default_port = CONFIGS[kind]().port
    if not (ports.get("rpc") == cfg.port == default_port):
        out.append(f"{name}: rpc port {ports.get('rpc')} vs config {cfg.port} (default {default_port})")
    if not (cfg.metrics_port > 0 and ports.get("metrics") == cfg.metrics_port):
        out.append(f"{name}: metrics port {ports.get('metrics')} vs config {cfg.metrics_port}")
    ann = w["spec"]["template"]["metadata"].get("annotations", {})
    if ann.get("prometheus.io/port") != str(cfg.metrics_port):
        out.append(f"{name}: prometheus.io/port {ann.get('prometheus.io/port')} vs {cfg.metrics_port}")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        if probe in c and c[probe]["httpGet"] != {"path": "/metrics", "port": "metrics"}:
            out.append(f"{name}: {probe} is not GET /metrics on the metrics port")
    if "readinessProbe" not in c or "livenessProbe" not in c:
        out.append(f"{name}: readiness and liveness probes wanted")
    labels = w["spec"]["template"]["metadata"]["labels"]
    svcs = [d for d in docs if d["kind"] == "Service"
            and d["spec"]["selector"].items() <= labels.items()]
    if not svcs:
        out.append(f"{name}: no Service selects its pods")
    for s in svcs:
        for p in s["spec"]["ports"]:
            if ports.get(p["targetPort"]) != p["port"]:
                out.append(f"{name}: Service {s['metadata']['name']} port {p['name']}={p['port']} "
                           f"but the container's {p['targetPort']} is {ports.get(p['targetPort'])}")
    return out


def mgmtd_address_problems(cfg: Any, docs: list[dict[str, Any]]) -> list[str]:
    """Every mgmtd address is ``<statefulset>-<ordinal>.<headless service>:<rpc port>`` of a
    pod that the mgmtd StatefulSet creates."""
    out: list[str] = []
    sets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "StatefulSet"}
    svcs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for addr in parse_addresses(cfg.mgmtd):
        pod, _, svc_name = addr.host.partition(".")
        sts_name, _, ordinal = pod.rpartition("-")
        sts, svc = sets.get(sts_name), svcs.get(svc_name)
        if sts is None or svc is None or not ordinal.isdigit():
            out.append(f"mgmtd address {addr} names no StatefulSet pod behind a Service")
            continue
        start = sts["spec"].get("ordinals", {}).get("start", 0)
        if sts["spec"]["serviceName"] != svc_name or svc["spec"].get("clusterIP") != "None":
            out.append(f"{addr}: {svc_name} is not the headless Service of {sts_name}")
        if not start <= int(ordinal) < start + sts["spec"]["replicas"]:
            out.append(f"{addr}: {sts_name} has no pod {ordinal}")
        if service_kind(one_container(sts)["command"]) != "mgmtd":
            out.append(f"{addr}: {sts_name} does not run mgmtd")
        rpc = {p["name"]: p["port"] for p in svc["spec"]["ports"]}.get("rpc")
        if addr.port != rpc or addr.port != MgmtdConfig().port:
            out.append(f"{addr}: port is not the mgmtd Service's rpc port {rpc}")
    return out


def every_mgmtd_pod(docs: list[dict[str, Any]]) -> set[str]:
    """``host:port`` of every pod of the StatefulSet that runs mgmtd."""
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"
              and service_kind(one_container(d)["command"]) == "mgmtd"]
    start = sts["spec"].get("ordinals", {}).get("start", 0)
    name, svc = sts["metadata"]["name"], sts["spec"]["serviceName"]
    return {f"{name}-{i}.{svc}:{MgmtdConfig().port}" for i in range(start, start + sts["spec"]["replicas"])}


def target_problems(w: dict[str, Any], cfg: StorageConfig) -> list[str]:
    """One volumeClaimTemplate per target, mounted exactly at the target's directory."""
    claims = {t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])}
    mounts = {m["mountPath"]: m["name"] for m in one_container(w)["volumeMounts"]}
    out = [f"target {t} is not a volumeClaimTemplate mount" for t in cfg.targets if mounts.get(t) not in claims]
    if len(cfg.targets) != len(claims):
        out.append(f"{len(cfg.targets)} targets but {len(claims)} volumeClaimTemplates")
    return out


# ---- tests -----------------------------------------------------------------------------------
def test_every_yaml_parses_and_names_its_object() -> None:
    files = sorted(DEPLOY.rglob("*.yaml"))
    assert files
    for f in files:
        for d in yaml.safe_load_all(f.read_text()):
            assert d["apiVersion"] and d["kind"], f
            if d["kind"] != "Kustomization":
                assert d["metadata"]["name"], f


def test_kustomization_lists_existing_files_and_every_manifest() -> None:
    k = kustomization()
    listed = [K8S / r for r in k["resources"]]
    listed += [K8S / f for g in k.get("configMapGenerator", []) for f in g["files"]]
    listed += [K8S / f for g in k.get("secretGenerator", []) for f in g["envs"]]
    assert [p for p in listed if not p.is_file()] == []
    unlisted = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", *k["resources"]}
    assert unlisted == set(), "manifests that kubectl apply -k would skip"
    keys = {Path(f).name for g in k["configMapGenerator"] for f in g["files"]}
    assert keys == {f"{kind}.toml" for kind in CONFIGS}


def test_manifests_pass_the_kubernetes_schema_strictly() -> None:
    import kubernetes_validate as kv  # a test dependency (pyproject): never skipped
    for d in resources():
        kv.validate(d, K8S_VERSION, strict=True)
    bad = copy.deepcopy(next(d for d in resources() if d["kind"] == "StatefulSet"))
    bad["spec"]["volumeClaimTemplate"] = []  # a typo: must be refused, not ignored
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S_VERSION, strict=True)


def test_container_commands_are_loomfs_service_commands() -> None:
    docs = resources()
    assert {service_kind(one_container(w)["command"]) for w in workloads(docs)} == set(CONFIGS)
    gen_keys = {Path(f).name for g in kustomization()["configMapGenerator"] for f in g["files"]}
    for w in workloads(docs):
        c = one_container(w)
        assert c["command"][0] == "loomfs"
        kind = service_kind(c["command"])
        assert callable(importlib.import_module(f"loomfs.{kind}.server").main)
        config = Path(c["command"][c["command"].index("--config") + 1])
        mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
        assert str(config.parent) == mount["mountPath"] and config.name in gen_keys
        vols = {v["name"]: v for v in w["spec"]["template"]["spec"]["volumes"]}
        assert vols["config"]["configMap"]["name"] == "loomfs-config"


def test_manifests_agree_with_the_config_their_pods_load(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = resources()
    for w in workloads(docs):
        cfg = effective_config(w, docs, monkeypatch)
        assert cfg.host == POD_IP, "the process must bind and advertise its pod IP"
        assert port_problems(w, cfg, docs) == []
        if isinstance(cfg, StorageConfig):
            assert cfg.node_id == int(POD_INDEX) and w["spec"]["ordinals"]["start"] >= 1
            assert target_problems(w, cfg) == []
        if isinstance(cfg, MetaConfig):
            assert cfg.store_url.startswith("postgresql://")  # N stateless meta need a database
        assert mgmtd_address_problems(cfg, docs) == []
        # services, clients and the mgmtd themselves all name every mgmtd pod
        assert {f"{a.host}:{a.port}" for a in parse_addresses(cfg.mgmtd)} == every_mgmtd_pod(docs)
        if isinstance(cfg, MgmtdConfig):  # several mgmtd: a shared PostgreSQL, a short primary lease
            assert check_config(cfg) is True


def test_the_checks_catch_a_broken_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = resources()
    sts = next(w for w in workloads(docs) if service_kind(one_container(w)["command"]) == "storage")
    cfg = effective_config(sts, docs, monkeypatch)
    broken = copy.deepcopy(sts)
    one = broken["spec"]["template"]["spec"]["containers"][0]
    one["ports"] = [{**p, "containerPort": p["containerPort"] + 1} for p in one["ports"]]
    assert len(port_problems(broken, cfg, docs)) >= 2
    broken["spec"]["volumeClaimTemplates"].pop()
    assert target_problems(broken, cfg)
    wrong = StorageConfig(mgmtd="loomfs-mgmtd-3.loomfs-mgmtd:8000,loomfs-meta-0.loomfs-meta:8000")
    assert len(mgmtd_address_problems(wrong, docs)) == 2


@pytest.mark.parametrize("path", sorted([*DEPLOY.glob("config/*.toml"), *K8S.glob("config/*.toml")]),
                         ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_toml_example_loads_with_the_real_loader(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("LOOMFS_")]:
        monkeypatch.delenv(key)
    cls = CONFIGS[path.stem]
    cfg = load(cls, path)  # an unknown or misspelled setting raises ValueError
    assert cfg.port == cls().port and cfg.metrics_port > 0
    assert cfg.host != "0.0.0.0", "host is also the advertised address"


def systemd_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """[Section] -> key -> values (keys may repeat, as systemd allows)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            out.setdefault(section, {})
            continue
        key, _, value = line.partition("=")
        out[section].setdefault(key.strip(), []).append(value.strip())
    return out


def test_systemd_units_run_real_entry_points_on_the_example_configs() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["loomfs"] == "loomfs.cli.main:main"
    units = sorted(SYSTEMD.glob("loomfs-*@.service"))
    assert {u.name for u in units} == {f"loomfs-{k}@.service" for k in CONFIGS}
    assert systemd_unit(SYSTEMD / "loomfs.target")["Install"]["WantedBy"]
    for unit in units:
        u = systemd_unit(unit)
        kind = unit.name.removeprefix("loomfs-").removesuffix("@.service")
        (exec_start,) = u["Service"]["ExecStart"]
        argv = shlex.split(exec_start)
        assert Path(argv[0]).name == "loomfs" and Path(argv[0]).is_absolute()
        assert service_kind(argv) == kind
        assert argv[argv.index("--config") + 1] == f"/etc/loomfs/{kind}-%i.toml"
        assert u["Install"]["WantedBy"] == ["loomfs.target"] and u["Unit"]["PartOf"] == ["loomfs.target"]
        example = load(CONFIGS[kind], DEPLOY / "config" / f"{kind}.toml")
        writable = [Path(p) for v in u["Service"]["ReadWritePaths"] for p in v.split()]
        dirs = [example.data_dir, *getattr(example, "targets", [])]
        assert all(any(Path(d).is_relative_to(w) for w in writable) for d in dirs), unit.name
        if kind == "storage":
            mounts = u["Unit"]["RequiresMountsFor"][0].split()
            assert mounts == example.targets  # never start on an unmounted disk
