"""deploy/: the image, the compose file, the Kubernetes manifests, HAProxy and Prometheus, checked statically and
against the code, since containers cannot run here.

Every command a container runs is a command of the product with options it accepts; every setting the files set
is one the code reads; the ports and probe paths they name are served (the gateway and web commands are started
for real, as the manifests start them, and probed); the system packages the Dockerfile installs, with the base
image's, cover every shared library the code loads on a Debian machine like the image's.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import CommandError, get_commands, load_command_class

from tests.support.gateway_process import PYTHON, REPO_ROOT, gateway_env, manage
from tests.support.servers import free_port

DEPLOY = REPO_ROOT / "deploy"
SETTINGS_SOURCE = REPO_ROOT / "carbonledger" / "settings.py"
K8S = DEPLOY / "k8s"
WORKLOADS = ("Deployment", "StatefulSet", "Job", "DaemonSet")
# Variables of the process, not of the product, that the files may set.
PROCESS_VARIABLES = frozenset(
    {"PORT", "OPENBLAS_NUM_THREADS", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PIP_NO_CACHE_DIR"}
    | {"PIP_DISABLE_PIP_VERSION_CHECK"}
)


# -- reading the files ---------------------------------------------------------------------------------------


def k8s_documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc is not None:
                docs.append((path.name, doc))
    return docs


def k8s_containers() -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(workload name, its manifest, a container) for every container of every workload."""
    for _, doc in k8s_documents():
        if doc["kind"] in WORKLOADS:
            for container in doc["spec"]["template"]["spec"]["containers"]:
                yield doc["metadata"]["name"], doc, container


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))
    return doc


def app_services() -> dict[str, dict[str, Any]]:
    """The compose services that run the product's image."""
    return {
        name: svc for name, svc in compose()["services"].items() if svc.get("image") == "carbonledger:latest"
    }


def dockerfile() -> str:
    return (DEPLOY / "Dockerfile").read_text(encoding="utf-8")


def dockerfile_cmd() -> list[str]:
    match = re.search(r"^CMD (\[.*\])$", dockerfile(), re.M)
    assert match, "the Dockerfile has no CMD in exec form"
    return list(yaml.safe_load(match.group(1)))


def every_command() -> list[tuple[str, list[str]]]:
    commands = [("Dockerfile CMD", dockerfile_cmd())]
    commands += [(f"k8s {name}/{c['name']}", list(c["command"])) for name, _, c in k8s_containers()]
    commands += [(f"compose {name}", list(svc["command"])) for name, svc in app_services().items()]
    return commands


def settings_read_by_the_code() -> set[str]:
    names: set[str] = set()
    for path in (REPO_ROOT / "carbonledger").glob("*.py"):
        names |= set(
            re.findall(
                r"\b(?:env_\w+|secret_key|database_from_url)\(\s*\"([A-Z][A-Z0-9_]+)\"", path.read_text()
            )
        )
    return names


def role_command(argv: list[str], port: int) -> list[str]:
    """A container's ``manage.py serve`` command, run here: this checkout's Python, the loopback address."""
    assert argv[:3] == ["python", "manage.py", "serve"], argv
    args = argv[3:]
    if "--host" in args:
        args[args.index("--host") + 1] = "127.0.0.1"
    return [PYTHON, "manage.py", "serve", *args, "--port", str(port)]


# -- the files parse and hang together ------------------------------------------------------------------------


def test_every_file_parses_and_the_kustomization_lists_every_manifest() -> None:
    docs = k8s_documents()
    kinds = {doc["kind"] for _, doc in docs}
    assert {"StatefulSet", "Deployment", "Job", "Service", "ConfigMap", "Secret"} <= kinds
    assert {"PodDisruptionBudget", "HorizontalPodAutoscaler"} <= kinds
    kustomization = next(doc for _, doc in docs if doc["kind"] == "Kustomization")
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == manifests
    assert compose()["services"]
    assert yaml.safe_load((DEPLOY / "prometheus.yml").read_text())["scrape_configs"]


def test_every_workload_uses_the_configmap_and_secret_it_names() -> None:
    names = {(doc["kind"], doc["metadata"]["name"]) for _, doc in k8s_documents() if "metadata" in doc}
    for workload, _, container in k8s_containers():
        for source in container.get("envFrom", []):
            if "configMapRef" in source:
                assert ("ConfigMap", source["configMapRef"]["name"]) in names, workload
            if "secretRef" in source:
                assert ("Secret", source["secretRef"]["name"]) in names, workload


def test_each_role_runs_in_its_own_workload_with_exactly_one_beat() -> None:
    roles: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for name, doc, container in k8s_containers():
        argv = container["command"]
        role = (
            argv[argv.index("--role") + 1]
            if "--role" in argv
            else argv[2]
            if argv[0] == "python"
            else argv[3]
        )
        roles.setdefault(role, []).append((name, doc))
    assert set(roles) == {"gateway", "web", "worker", "beat", "setup"}
    ((_, beat),) = roles["beat"]
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"
    ((_, gateway),) = roles["gateway"]
    resources = gateway["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 1
    # Each gateway keeps its own spool on a volume of its own.
    assert gateway["kind"] == "StatefulSet" and gateway["spec"]["volumeClaimTemplates"]
    compose_beats = [
        n for n, s in app_services().items() if s["command"][:3] == ["python", "manage.py", "beat"]
    ]
    assert compose_beats == ["beat"]


def test_the_autoscalers_target_workloads_and_metrics_that_exist() -> None:
    docs = k8s_documents()
    workloads = {(doc["kind"], doc["metadata"]["name"]) for _, doc in docs if "metadata" in doc}
    gateway_metrics = (REPO_ROOT / "inference" / "stats.py").read_text()
    for _, doc in docs:
        if doc["kind"] != "HorizontalPodAutoscaler":
            continue
        target = doc["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) in workloads
        for metric in doc["spec"]["metrics"]:
            if metric["type"] == "Pods":  # scraped from our own /metrics
                assert metric["pods"]["metric"]["name"] in gateway_metrics


# -- commands and settings -----------------------------------------------------------------------------------


@pytest.mark.parametrize("where,argv", every_command(), ids=[w for w, _ in every_command()])
def test_every_command_is_a_command_of_the_product_with_options_it_accepts(
    where: str, argv: list[str]
) -> None:
    if argv[0] == "python":
        assert argv[1] == "manage.py", where
        name = argv[2]
        commands = get_commands()
        assert name in commands, f"{where}: manage.py has no command {name!r}"
        command = load_command_class(commands[name], name)
        parser = command.create_parser("manage.py", name)
        try:
            parser.parse_args(argv[3:])
        except (SystemExit, CommandError) as exc:  # argparse's way of refusing, and Django's
            pytest.fail(f"{where}: manage.py {name} refuses {argv[3:]} ({exc})")
    else:
        assert argv[:4] == ["celery", "-A", "carbonledger", "worker"], where
        done = subprocess.run(
            [str(Path(PYTHON).parent / "celery"), *argv[1:], "--help"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"{where}: {done.stderr[-800:]}"


def test_every_setting_the_files_set_is_read_by_the_code() -> None:
    known = settings_read_by_the_code() | PROCESS_VARIABLES | {"CARBONLEDGER_VAR_DIR"}
    set_here: dict[str, set[str]] = {}
    for _, doc in k8s_documents():
        if doc["kind"] == "ConfigMap":
            set_here.setdefault("configmap.yaml", set()).update(doc["data"])
        if doc["kind"] == "Secret":
            set_here.setdefault("secret.yaml", set()).update(doc["stringData"])
    for workload, _, container in k8s_containers():
        set_here.setdefault(workload, set()).update(e["name"] for e in container.get("env", []))
    for name, svc in app_services().items():
        set_here.setdefault(f"compose {name}", set()).update(svc.get("environment", {}))
    set_here["Dockerfile"] = set(re.findall(r"^\s+([A-Z][A-Z0-9_]+)=", dockerfile(), re.M))
    for where, names in set_here.items():
        unknown = names - known
        assert not unknown, f"{where} sets {sorted(unknown)}, which the code does not read"


def test_the_image_is_slim_and_runs_as_a_user_without_privileges() -> None:
    text = dockerfile()
    assert re.search(r"^FROM python:3\.11-slim-bookworm$", text, re.M)
    user = re.findall(r"^USER (\S+)$", text, re.M)
    assert user and user[-1] not in ("root", "0")
    for workload, doc, _ in k8s_containers():
        assert doc["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True, workload


# -- ports and probes, served for real ------------------------------------------------------------------------


def _get(port: int, path: str, timeout_s: float = 5.0) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout_s) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _probe_paths(container: dict[str, Any]) -> set[str]:
    return {
        container[probe]["httpGet"]["path"]
        for probe in ("livenessProbe", "readinessProbe", "startupProbe")
        if probe in container
    }


@pytest.fixture(scope="module")
def set_up_var(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An installation made by the setup Job's own command (SQLite, under a fresh var folder)."""
    var = tmp_path_factory.mktemp("deploy-var")
    (var / "models").mkdir()
    shutil.copytree(REPO_ROOT / "inference" / "demo_repository" / "linear", var / "models" / "linear")
    env = gateway_env(var)
    (job,) = [c for _, doc, c in k8s_containers() if doc["kind"] == "Job"]
    done = manage(env, *job["command"][2:], timeout_s=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return env


@pytest.mark.parametrize("role", ["gateway", "web"])
def test_the_ports_and_probe_paths_of_each_role_are_served(role: str, set_up_var: dict[str, str]) -> None:
    ((container),) = [c for _, _, c in k8s_containers() if role in c["command"]]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    # The HTTP port is the serve command's default, so the image needs no PORT to match its manifest.
    assert ports["http"] == 8000
    serve = load_command_class("carbonledger", "serve").create_parser("manage.py", "serve")
    assert serve.parse_args(["--role", role]).port in (None, 8000)
    if "grpc" in ports:  # the gRPC port is the setting's default
        grpc_default = re.search(r'env_int\("CARBONLEDGER_GRPC_PORT", (\d+)', SETTINGS_SOURCE.read_text())
        assert grpc_default and ports["grpc"] == int(grpc_default.group(1))
    port = free_port()
    env = dict(set_up_var, PORT=str(port), CARBONLEDGER_GRPC_PORT=str(free_port()))
    proc = subprocess.Popen(
        role_command(list(container["command"]), port),
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        answers: dict[str, int] = {}
        paths = _probe_paths(container)
        assert paths, f"{role} has no probes"
        while time.monotonic() < deadline:
            try:
                answers = {path: _get(port, path) for path in paths}
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.3)
                continue
            if all(status == 200 for status in answers.values()):
                break
            time.sleep(0.5)
        assert proc.poll() is None, f"{role} exited ({proc.returncode})"
        assert answers and all(status == 200 for status in answers.values()), answers
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_the_balancer_checks_a_path_the_gateway_serves_and_its_config_is_valid(tmp_path: Path) -> None:
    text = (DEPLOY / "haproxy.cfg").read_text()
    (gateway,) = [c for _, _, c in k8s_containers() if "gateway" in c["command"]]
    checked = set(re.findall(r"option httpchk GET (\S+)", text))
    assert checked and checked <= _probe_paths(gateway)
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        pytest.skip("haproxy is not installed (apt-get install haproxy)")
    # The compose service names do not resolve here; the syntax and the semantics are what is checked.
    local = re.sub(r"gateway-\d+:", "127.0.0.1:", text)
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(local)
    done = subprocess.run(
        [haproxy, "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_prometheus_scrapes_each_gateway_directly_on_its_metrics_path() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    services = compose()["services"]
    gateways = {name for name, svc in app_services().items() if "gateway" in svc["command"]}
    scraped: set[str] = set()
    for job in config["scrape_configs"]:
        assert job["metrics_path"] == "/metrics"
        for group in job["static_configs"]:
            for target in group["targets"]:
                host, _, port = target.partition(":")
                assert host in services and port == "8000", target
                scraped.add(host)
    assert gateways <= scraped
    # Only processes that serve /metrics: the gateways (the web role answers 404 there).
    assert scraped <= gateways


# -- system libraries ---------------------------------------------------------------------------------------


def _dpkg_package_of(path: str) -> str | None:
    candidates = [path, path.replace("/usr/lib/", "/lib/", 1), "*/" + Path(path).name]
    for candidate in candidates:
        done = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True, check=False)
        if done.returncode == 0:
            return done.stdout.split(":", 1)[0].split(",")[0].strip()
    return None


def _apt_closure(packages: set[str]) -> set[str]:
    done = subprocess.run(
        ["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
         "--no-breaks", "--no-replaces", "--no-enhances", *sorted(packages)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return {line.strip().split(":")[0] for line in done.stdout.splitlines() if not line.startswith(" ")}


def _loaded_system_libraries() -> set[str]:
    """Shared objects a child process maps after doing what the product does: render a PDF report, run an
    ONNX model, connect to PostgreSQL's client library, serve HTTP and gRPC."""
    script = """
import glob, sys
import weasyprint
weasyprint.HTML(string="<h1>Report</h1><table><tr><td>1 kg</td></tr></table>").write_pdf()
import onnxruntime, numpy, pandas, psycopg, orjson, httptools, grpc, uvicorn
for model in glob.glob("inference/demo_repository/*/1/model.onnx"):
    onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
for line in open("/proc/self/maps"):
    fields = line.split()
    if len(fields) >= 6 and ".so" in fields[5] and not fields[5].startswith((sys.prefix, sys.base_prefix)):
        print(fields[5])
"""
    done = subprocess.run(
        [PYTHON, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    return set(done.stdout.split())


def _base_image_packages() -> set[str]:
    """What python:3.11-slim-bookworm holds, before the dependencies they pull: Debian's required packages
    (bookworm-slim, apt among them) and the packages of the libraries the Python build links, which that image
    keeps (it marks them manual after building Python)."""
    listed = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package} ${Priority}\\n"], capture_output=True, text=True, check=True
    ).stdout
    required = {line.split()[0] for line in listed.splitlines() if line.endswith(" required")}
    python_libs = subprocess.run(
        ["ldd", sys.executable, *map(str, Path(sys.base_prefix, "lib", "python3.11", "lib-dynload").glob("*.so"))],
        capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    linked = {m for m in re.findall(r"=> (/\S+)", python_libs)}
    return (
        required | {pkg for path in linked if (pkg := _dpkg_package_of(path))} | {"ca-certificates", "tzdata"}
    )


@pytest.mark.skipif(shutil.which("dpkg") is None or shutil.which("apt-cache") is None, reason="needs Debian")
def test_the_image_installs_every_system_library_the_code_loads() -> None:
    installed = set(re.findall(r"^\s{8}([a-z0-9][a-z0-9.+-]+) \\$", dockerfile(), re.M))
    assert "libpango-1.0-0" in installed, "the apt-get list was not found in the Dockerfile"
    provided = _apt_closure(installed | _base_image_packages())
    missing: dict[str, str] = {}
    for path in sorted(_loaded_system_libraries()):
        package = _dpkg_package_of(path)
        assert package is not None, f"{path} belongs to no Debian package"
        if package not in provided:
            missing[path] = package
    assert not missing, f"the image lacks the packages of {missing}"
