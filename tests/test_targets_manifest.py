"""build/targets.toml is the single source of the per-target and per-service facts.

The Dockerfile, docker-compose.yml and deploy/kubernetes stay plain files that
people edit and the linters read; they are checked against the manifest here
rather than generated. Each check is run on the real files (no drift) and on a
drifted copy (it must notice)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline import targets
from pipeline.errors import PipelineError

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = (REPO / "Dockerfile").read_text()
COMPOSE = (REPO / "docker-compose.yml").read_text()
KUBERNETES = {p.stem: p.read_text() for p in sorted((REPO / "deploy/kubernetes").glob("*.yaml"))}
UNITS = {"s": 1, "m": 60, "h": 3600}


def seconds(value: str | int) -> int:
    """Compose/Docker durations ("15s", "60m", "1h30m") in seconds."""
    if isinstance(value, int):
        return value
    parts = re.findall(r"(\d+)([smh])", value)
    assert parts and "".join(n + u for n, u in parts) == value, value
    return sum(int(n) * UNITS[u] for n, u in parts)


def _stages(dockerfile: str) -> dict[str, str]:
    stages = {}
    for part in re.split(r"(?m)^(?=FROM )", dockerfile)[1:]:
        name = re.match(r"FROM \S+ AS (\S+)", part)
        if name:
            stages[name.group(1)] = part
    return stages


def dockerfile_drift(dockerfile: str, manifest: targets.Manifest) -> list[str]:
    problems = []
    stages = _stages(dockerfile)
    for target in manifest.targets.values():
        text = stages.get(target.name)
        if text is None:
            problems.append(f"Dockerfile has no stage {target.name}")
            continue
        checks = re.findall(r"(?m)^HEALTHCHECK (.*?)\\?$", text)
        if len(checks) != 1:
            problems.append(f"{target.name}: {len(checks)} HEALTHCHECKs")
            continue
        found = {k: seconds(v) if k != "retries" else int(v) for k, v in
                 re.findall(r"--([a-z-]+)=(\S+)", checks[0])}  # fmt: skip
        if found != target.healthcheck:
            problems.append(
                f"{target.name}: HEALTHCHECK {found} != targets.toml {target.healthcheck}"
            )
        if f"${{{target.base_arg}}}" not in dockerfile:
            problems.append(f"{target.name}: base argument {target.base_arg} is not used")
    return problems


def compose_drift(compose: dict, manifest: targets.Manifest) -> list[str]:
    problems = []
    services = compose.get("services", {})
    composed = {name for name, svc in manifest.services.items() if svc.compose}
    for name in sorted(set(services) ^ composed):
        problems.append(f"service {name} is in only one of docker-compose.yml and targets.toml")
    for svc in manifest.services.values():
        entry = services.get(svc.name) if svc.compose else None
        if entry is None:
            continue
        target = manifest.target(svc.target)
        image = re.fullmatch(r"\$\{[A-Z0-9_]+:-([^}]+)\}", entry.get("image", ""))
        if not image or image.group(1) != target.tags[0]:
            problems.append(f"{svc.name}: image {entry.get('image')} is not {target.tags[0]}")
        health = entry.get("healthcheck", {})
        found = {
            key.replace("_", "-"): seconds(value) if key != "retries" else value
            for key, value in health.items()
            if key not in ("test", "start_period")
        }
        if found != svc.compose_probe:
            problems.append(f"{svc.name}: healthcheck {found} != targets.toml {svc.compose_probe}")
        if seconds(health.get("start_period", "0s")) != svc.start_budget:
            problems.append(
                f"{svc.name}: start_period {health.get('start_period')} != start-budget "
                f"{svc.start_budget} s"
            )
        port = f"${{{svc.port_env}:-{svc.port}}}"
        published = [p for p in entry.get("ports", []) if port in p]
        environment = entry.get("environment", {})
        if not published and environment.get("SERVE_PORT") != port:
            problems.append(f"{svc.name}: neither its ports nor SERVE_PORT use {port}")
        devices = entry.get("deploy", {}).get("resources", {}).get("reservations", {})
        count = sum(d.get("count", 0) for d in devices.get("devices", []))
        if count != svc.gpus:
            problems.append(f"{svc.name}: reserves {count} GPUs, targets.toml says {svc.gpus}")
    return problems


def pod_specs(doc: dict) -> list[tuple[str, dict]]:
    """(label, pod spec) of a Deployment, or of both templates of a LeaderWorkerSet."""
    if doc.get("kind") == "Deployment":
        return [("", doc["spec"]["template"]["spec"])]
    if doc.get("kind") == "LeaderWorkerSet":
        templates = doc["spec"]["leaderWorkerTemplate"]
        return [(f" {role}", templates[f"{role}Template"]["spec"]) for role in ("leader", "worker")]
    return []


def _pod_drift(
    name: str, spec: dict, svc: targets.Service, manifest: targets.Manifest
) -> list[str]:
    problems = []
    want = svc.kubernetes_probe
    serve = next(c for c in spec["containers"] if c["name"] == "serve")
    if serve["image"] != manifest.target(svc.target).tags[0]:
        problems.append(f"{name}: image {serve['image']}")
    startup, ready = serve["startupProbe"], serve["readinessProbe"]
    live = serve.get("livenessProbe", {})
    found = {
        "startup-period": startup["periodSeconds"],
        "startup-failures": startup["failureThreshold"],
        "readiness-period": ready["periodSeconds"],
        "readiness-failures": ready["failureThreshold"],
        "liveness-period": live.get("periodSeconds"),
        "liveness-failures": live.get("failureThreshold"),
        "timeout": startup["timeoutSeconds"],
    }
    timeouts = {ready["timeoutSeconds"], live.get("timeoutSeconds")}
    if found != want or timeouts != {want["timeout"]}:
        problems.append(f"{name}: probes {found} != targets.toml {want}")
    probe = ["python", "-m", "entrypoint", "probe"]
    # Startup and liveness follow the start's progress; readiness is ready only.
    for kind, command in (("startupProbe", [*probe, "--live"]), ("readinessProbe", probe),
                          ("livenessProbe", [*probe, "--live"])):
        if serve.get(kind, {}).get("exec", {}).get("command") != command:
            problems.append(f"{name}: {kind} is not the watcher's {' '.join(command[3:])}")
    gpus = serve["resources"]["limits"].get("nvidia.com/gpu", 0)
    if gpus != svc.gpus:
        problems.append(f"{name}: {gpus} GPUs, targets.toml says {svc.gpus}")
    return problems


def kubernetes_drift(documents: dict[str, str], manifest: targets.Manifest) -> list[str]:
    problems = []
    for stem, text in documents.items():
        for doc in yaml.safe_load_all(text):
            if not doc or not pod_specs(doc):
                continue
            name = doc["metadata"]["name"]
            if name not in manifest.services:
                problems.append(f"{stem}: {doc['kind']} {name} is no service of targets.toml")
                continue
            svc = manifest.service(name)
            if not svc.kubernetes_probe:
                problems.append(f"{name}: targets.toml has no kubernetes-probe")
                continue
            for role, spec in pod_specs(doc):
                problems += _pod_drift(f"{name}{role}", spec, svc, manifest)
    return problems


@pytest.fixture(scope="module")
def manifest() -> targets.Manifest:
    return targets.load()


def test_dockerfile_healthchecks_match(manifest: targets.Manifest) -> None:
    assert dockerfile_drift(DOCKERFILE, manifest) == []
    drifted = DOCKERFILE.replace("--start-period=900s", "--start-period=600s")
    assert dockerfile_drift(drifted, manifest) == [
        "runtime-cpu-gguf: HEALTHCHECK {'interval': 10, 'timeout': 5, 'start-period': 600, "
        "'retries': 3} != targets.toml {'interval': 10, 'timeout': 5, 'start-period': 900, "
        "'retries': 3}"
    ]


def test_compose_matches(manifest: targets.Manifest) -> None:
    assert compose_drift(yaml.safe_load(COMPOSE), manifest) == []
    for old, new, what in [
        ("start_period: 6h", "start_period: 45m", "glm5: start_period 45m"),
        ("count: 2", "count: 4", "qwen36-dflash: reserves 4 GPUs"),
        ("${SMOKE_GGUF_PORT:-8002}", "${SMOKE_GGUF_PORT:-8003}", "smoke-gguf: neither"),
        ("interval: 3s", "interval: 4s", "smoke: healthcheck"),
    ]:
        assert old in COMPOSE, old
        problems = compose_drift(yaml.safe_load(COMPOSE.replace(old, new, 1)), manifest)
        assert len(problems) == 1 and problems[0].startswith(what), (old, problems)


def test_kubernetes_matches(manifest: targets.Manifest) -> None:
    assert kubernetes_drift(KUBERNETES, manifest) == []
    drifted = dict(KUBERNETES)
    drifted["glm5"] = drifted["glm5"].replace("failureThreshold: 6", "failureThreshold: 360")
    assert [p[:13] for p in kubernetes_drift(drifted, manifest)] == ["glm5: probes "]
    live = "exec: {command: [python, -m, entrypoint, probe, --live]}"
    ready = "exec: {command: [python, -m, entrypoint, probe]}"
    drifted["glm5"] = KUBERNETES["glm5"].replace(
        f"          livenessProbe:\n            {live}",
        "          livenessProbe:\n            httpGet: {path: /health, port: http}",
    )
    assert kubernetes_drift(drifted, manifest) == [
        "glm5: livenessProbe is not the watcher's probe --live"]
    drifted["glm5"] = KUBERNETES["glm5"].replace(
        f"          readinessProbe:\n            {ready}",
        f"          readinessProbe:\n            {live}",
    )
    assert kubernetes_drift(drifted, manifest) == [
        "glm5: readinessProbe is not the watcher's probe"]
    # Each template of the LeaderWorkerSet is checked on its own.
    lws = KUBERNETES["glm5-lws"]
    worker_at = lws.index("workerTemplate:")
    for old, new, what in [
        ("failureThreshold: 4\n", "failureThreshold: 5\n", "glm5-lws worker: probes"),
        ("limits: {memory: 240Gi, nvidia.com/gpu: 4}", "limits: {memory: 240Gi, nvidia.com/gpu: 8}",
         "glm5-lws worker: 8 GPUs"),
    ]:
        assert old in lws[worker_at:], old
        text = lws[:worker_at] + lws[worker_at:].replace(old, new, 1)
        problems = kubernetes_drift({"glm5-lws": text}, manifest)
        assert len(problems) == 1 and problems[0].startswith(what), (old, problems)
    text = lws.replace("periodSeconds: 15", "periodSeconds: 20", 1)  # the leader's liveness
    assert [p[:23] for p in kubernetes_drift({"glm5-lws": text}, manifest)] == [
        "glm5-lws leader: probes"
    ]


def test_every_deployment_service_has_a_kubernetes_manifest(manifest: targets.Manifest) -> None:
    with_probes = {name for name, svc in manifest.services.items() if svc.kubernetes_probe}
    assert with_probes == set(KUBERNETES)


def test_a_kubernetes_only_service_needs_no_compose_service(manifest: targets.Manifest) -> None:
    assert not manifest.service("glm5-lws").compose
    assert "glm5-lws" not in yaml.safe_load(COMPOSE)["services"]
    assert compose_drift(yaml.safe_load(COMPOSE), manifest) == []


def test_scripts_hold_no_copy_of_the_manifest(manifest: targets.Manifest) -> None:
    """Tags, ports, models, prompts and waits reach the scripts only through
    `python3 -m pipeline targets shell`."""
    scripts = {  # code only: comments may name a service's model
        name: "\n".join(
            line
            for line in (REPO / "build/docker" / name).read_text().splitlines()
            if not line.lstrip().startswith("#")
        )
        for name in ("build-image.sh", "smoke.sh", "e2e.sh")
    }
    facts: list[str] = []
    for target in manifest.targets.values():
        facts += target.tag_names("0.32.0")
    for svc in manifest.services.values():
        facts += [f"={svc.port}", f"-{svc.port}}}"]
        if svc.smoke:
            facts += [f"={svc.smoke['model']}", f"={svc.smoke['model']} ", svc.smoke["prompt"]]
        if "wait" in svc.smoke:
            facts.append(f" {svc.smoke['wait']}\n")
    for name, text in scripts.items():
        for fact in facts:
            assert fact not in text, f"{name} repeats {fact!r} from build/targets.toml"
        assert "pipeline targets shell" in text, name


def test_image_pipeline_reads_the_manifest() -> None:
    code = (REPO / "build/pipeline/image.py").read_text()
    for table in ("CONTEXT_KEYS", "BASE_KEYS", "DEPS_OF_KEYS", "EXTRA_REQUIREMENTS", "FAMILY"):
        assert table not in code, table
    assert "targets.load(" in code


def test_shell_facts(manifest: targets.Manifest) -> None:
    out = targets.shell(manifest, None, "smoke-gguf", "0.32.0")
    assert "target=runtime-cpu-gguf\n" in out and "port=8002\n" in out
    assert "prompt='The capital of France is'\n" in out
    assert "tags='frontier-serve:cpu-gguf frontier-serve:0.32.0-cpu-gguf'\n" in out


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('lock = "runtime"\nbase-wheel', 'lock = "nope"\nbase-wheel', "lock 'nope' is not in"),
        ("start-budget = 900", "start-budget = 0", "start-budget = 0 is not 1..86400"),
        ("port = 8002", "port = 70000", "port 70000 is not 1..65535"),
        ('python = "3.12"', 'python = "3.13"', "python 3.13 has no lock 'runtime'"),
        ('pythons = ["3.11"]\n\n[locks.cpu-tier]', 'pythons = ["3"]\n\n[locks.cpu-tier]', "X.Y"),
        (
            '"gguf-wheel", "gguf-plugin-wheel"]',
            '"gguf-whl", "gguf-plugin-wheel"]',
            "gguf-whl not in",
        ),
        (
            'models = ["gemma-gguf"]',
            'models = ["gemma"]',
            "[targets.runtime-cpu-gguf]: ",
        ),
        ('models = ["gemma-gguf"]', 'models = ["gemma"]', "missing pins entry [models.gemma]"),
    ],
)
def test_bad_manifest_entries_are_named(tmp_path: Path, old: str, new: str, message: str) -> None:
    text = targets.TARGETS_FILE.read_text()
    assert old in text, old
    bad = tmp_path / "targets.toml"
    bad.write_text(text.replace(old, new, 1))
    with pytest.raises(PipelineError, match=re.escape(message)):
        targets.load(bad)


# Where the runtime user and folders are spelled out (they stay plain text there).
RUNTIME_FILES = [
    "Dockerfile", "build/docker/install-runtime.sh", "build/docker/check-image.sh",
    "docker-compose.yml", "deploy/kubernetes/glm5.yaml", "deploy/kubernetes/glm5-lws.yaml",
    "deploy/kubernetes/qwen36-dflash.yaml", "checks/image/check_cuda_image.py",
    "entrypoint/argv/settings.py", "README.md", "docs/configuration.md", "docs/images.md",
    "docs/operating.md",
]  # fmt: skip
# A uid or gid as these files spell one: `USER 10001:10001`, `--uid 10001`, `runAsUser:
# 10001`, `fsGroup: 10001`, `--user 10001:10001`, `uid 10001`, `os.getuid() == 10001`.
_IDS = re.compile(
    r"(?:USER|--uid|--gid|runAsUser:|runAsGroup:|fsGroup:|--user|\buid|\bgid|getuid\(\) =="
    r"|getgid\(\) ==|user ==|\buser)\s*(\d+)(?::(\d+))?"
)
# Home and run folders: any /home/NAME or /run/NAME (/run/secrets is Docker's own).
_DIRS = re.compile(r"(/home/[\w.-]+|/run/(?!secrets\b)[\w.-]+)")


def runtime_drift(texts: dict[str, str], runtime: targets.Runtime) -> list[str]:
    problems = []
    for name, text in texts.items():
        ids = [int(i) for m in _IDS.finditer(text) for i in m.groups() if i]
        dirs = _DIRS.findall(text)
        if not ids and not dirs:
            problems.append(f"{name} spells out no runtime uid or folder (drop it from the list)")
        problems += [f"{name}: uid/gid {i} != [runtime] uid {runtime.uid}"
                     for i in ids if i != runtime.uid]  # fmt: skip
        problems += [f"{name}: {d} is neither [runtime] home nor run-dir"
                     for d in dirs if d not in (runtime.home, runtime.run_dir)]  # fmt: skip
    return problems


def test_runtime_user_and_folders_match_the_manifest(manifest: targets.Manifest) -> None:
    texts = {name: (REPO / name).read_text() for name in RUNTIME_FILES}
    assert manifest.runtime == targets.Runtime("serve", 10001, "/home/serve", "/run/serve")
    assert runtime_drift(texts, manifest.runtime) == []
    # The user's name, too, where the image creates it.
    assert f"--home-dir {manifest.runtime.home}" in texts["build/docker/install-runtime.sh"]
    assert f"--uid {manifest.runtime.uid} --gid {manifest.runtime.user} " in (
        texts["build/docker/install-runtime.sh"]
    )
    # Each drift is seen.
    for name, old, new in [
        ("deploy/kubernetes/glm5.yaml", "fsGroup: 10001", "fsGroup: 10002"),
        ("Dockerfile", "USER 10001:10001", "USER 10001:0"),
        ("docker-compose.yml", "glm5-run:/run/serve", "glm5-run:/run/frontier"),
        ("checks/image/check_cuda_image.py", "os.getuid() == 10001", "os.getuid() == 1000"),
        ("entrypoint/argv/settings.py", '"/run/serve/ready"', '"/run/srv/ready"'),
    ]:
        assert old in texts[name], (name, old)
        drifted = {**texts, name: texts[name].replace(old, new)}
        assert [p for p in runtime_drift(drifted, manifest.runtime) if p.startswith(name)], name
