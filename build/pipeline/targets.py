"""Read and validate build/targets.toml: per-target, per-lock and per-service facts.

`python3 -m pipeline targets shell --service NAME | --target NAME` prints them
as shell assignments for build-image.sh, smoke.sh and e2e.sh."""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from . import pins
from .errors import PipelineError
from .paths import REPO

TARGETS_FILE = REPO / "build" / "targets.toml"
PYTHON_RE = re.compile(r"^3\.\d{1,2}$")
GLIBC_RE = re.compile(r"^2\.\d{1,2}$")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")


@dataclass(frozen=True)
class LockSpec:
    name: str
    description: str
    pythons: tuple[str, ...]
    platform: str
    pins: tuple[str, ...] = ()
    deps_of: tuple[str, ...] = ()
    sdist_file: str = ""
    requirements: tuple[str, ...] = ()
    requirements_files: tuple[str, ...] = ()
    project: tuple[str, ...] | None = None  # None: not this project; () : its dependencies
    exclude: tuple[str, ...] = ()
    constraints: tuple[str, ...] = ()


@dataclass(frozen=True)
class Target:
    name: str
    family: str
    base_arg: str
    python: str
    lock: str
    base_wheel: str
    context_pins: tuple[str, ...]
    model_pins: tuple[str, ...]
    tags: tuple[str, ...]
    title: str
    description: str
    healthcheck: dict[str, int]
    normalize: bool  # build-image.sh clamps the image's build times (normalize_image.py)

    def tag_names(self, version: str) -> list[str]:
        return [tag.format(version=version) for tag in self.tags]


@dataclass(frozen=True)
class Service:
    name: str
    target: str
    port: int
    port_env: str
    start_budget: int
    compose_probe: dict[str, int]
    gpus: int = 0
    kubernetes_probe: dict[str, int] = field(default_factory=dict)
    smoke: dict[str, object] = field(default_factory=dict)
    compose: bool = True  # False: a Kubernetes-only service (no compose service, no port-env)


@dataclass(frozen=True)
class Runtime:
    """The images' runtime user (uid = gid) and folders."""

    user: str = ""
    uid: int = 0
    home: str = ""
    run_dir: str = ""


@dataclass(frozen=True)
class Manifest:
    path: Path
    locks: dict[str, LockSpec]
    targets: dict[str, Target]
    services: dict[str, Service]
    # Python X.Y -> the glibc (2.NN) of the image bases that install its locks
    install_glibc: dict[str, str] = field(default_factory=dict)
    runtime: Runtime = field(default_factory=Runtime)

    def target(self, name: str) -> Target:
        return _known(self.targets, name, "target", self.path)

    def lock(self, name: str) -> LockSpec:
        return _known(self.locks, name, "lock", self.path)

    def service(self, name: str) -> Service:
        return _known(self.services, name, "service", self.path)


def _known(table: dict, name: str, what: str, path: Path):  # noqa: ANN202
    try:
        return table[name]
    except KeyError:
        raise PipelineError(
            f"{path}: no {what} {name!r} (known: {', '.join(sorted(table)) or 'none'})"
        ) from None


def _strings(entry: dict, key: str, where: str) -> tuple[str, ...]:
    value = entry.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise PipelineError(f"{where}: {key} must be a list of non-empty strings")
    return tuple(value)


def _seconds(entry: dict, key: str, where: str, required: tuple[str, ...]) -> dict[str, int]:
    table = entry.get(key)
    if not isinstance(table, dict):
        raise PipelineError(f"{where}: {key} must be a table of seconds")
    missing = [name for name in required if name not in table]
    if missing:
        raise PipelineError(f"{where}: {key} lacks {', '.join(missing)}")
    return {name: _second(value, f"{where}: {key}.{name}") for name, value in table.items()}


def _second(value: object, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 86400:
        raise PipelineError(f"{where} = {value!r} is not 1..86400 seconds")
    return value


def _required(entry: dict, keys: tuple[str, ...], where: str) -> None:
    missing = [key for key in keys if entry.get(key) in (None, "")]
    if missing:
        raise PipelineError(f"{where}: lacks {', '.join(missing)}")


def load(path: Path = TARGETS_FILE, loaded_pins: pins.Pins | None = None) -> Manifest:
    data = pins.read_toml(path, "targets manifest")
    loaded = loaded_pins or pins.load()
    known_pins = set(loaded.files)

    def model_parts(entry: dict, where: str) -> tuple[str, ...]:
        """The pinned parts of the target's models, as build/pins.toml lists them."""
        try:
            return tuple(p for m in _strings(entry, "models", where) for p in loaded.model_parts(m))
        except PipelineError as exc:
            raise PipelineError(f"{where}: {exc}") from None

    def check_pins(keys: tuple[str, ...], where: str) -> tuple[str, ...]:
        unknown = [key for key in keys if key not in known_pins]
        if unknown:
            raise PipelineError(f"{where}: {', '.join(unknown)} not in build/pins.toml")
        return keys

    lock_table = dict(data.get("locks") or {})
    platform = lock_table.pop("platform", "")
    if not isinstance(platform, str) or not platform:
        raise PipelineError(f"{path}: [locks] platform is missing")
    install_glibc = lock_table.pop("install-glibc", {})
    if not isinstance(install_glibc, dict) or not all(
        isinstance(k, str) and PYTHON_RE.match(k) and isinstance(v, str) and GLIBC_RE.match(v)
        for k, v in install_glibc.items()
    ):
        raise PipelineError(f"{path}: [locks] install-glibc maps X.Y Pythons to 2.NN versions")
    locks: dict[str, LockSpec] = {}
    for name, entry in lock_table.items():
        where = f"{path}: [locks.{name}]"
        if not NAME_RE.match(name) or not isinstance(entry, dict):
            raise PipelineError(f"{where}: a lock is a table named with a-z, 0-9 and -")
        pythons = _strings(entry, "pythons", where)
        bad = [py for py in pythons if not PYTHON_RE.match(py)]
        if not pythons or bad:
            raise PipelineError(f"{where}: pythons must list X.Y versions, got {list(pythons)}")
        project = entry.get("project")
        locks[name] = LockSpec(
            name=name,
            description=str(entry.get("description", "")),
            pythons=pythons,
            platform=platform,
            pins=check_pins(_strings(entry, "pins", where), where),
            deps_of=check_pins(_strings(entry, "deps-of", where), where),
            sdist_file=str(entry.get("sdist-file", "")),
            requirements=_strings(entry, "requirements", where),
            requirements_files=_strings(entry, "requirements-files", where),
            project=None if project is None else _strings(entry, "project", where),
            exclude=_strings(entry, "exclude", where),
            constraints=_strings(entry, "constraints", where),
        )
    for spec in locks.values():
        unplaced = [py for py in spec.pythons if py not in install_glibc]
        if unplaced:
            raise PipelineError(f"{path}: [locks] install-glibc lacks Python {', '.join(unplaced)}")
        for other in spec.constraints:
            if other not in locks or other == spec.name:
                raise PipelineError(f"{path}: [locks.{spec.name}] constraint {other!r} is no lock")
            missing = set(spec.pythons) - set(locks[other].pythons)
            if missing:
                raise PipelineError(
                    f"{path}: [locks.{spec.name}] needs lock {other!r} for Python "
                    f"{', '.join(sorted(missing))}"
                )

    targets: dict[str, Target] = {}
    for name, entry in (data.get("targets") or {}).items():
        where = f"{path}: [targets.{name}]"
        _required(entry, ("family", "base-arg", "python", "lock", "base-wheel", "title"), where)
        if entry["lock"] not in locks:
            raise PipelineError(f"{where}: lock {entry['lock']!r} is not in [locks]")
        if entry["python"] not in locks[entry["lock"]].pythons:
            raise PipelineError(
                f"{where}: python {entry['python']} has no lock {entry['lock']!r} "
                f"(made for {', '.join(locks[entry['lock']].pythons)})"
            )
        targets[name] = Target(
            name=name,
            family=entry["family"],
            base_arg=entry["base-arg"],
            python=entry["python"],
            lock=entry["lock"],
            base_wheel=check_pins((entry["base-wheel"],), where)[0],
            context_pins=check_pins(_strings(entry, "context-pins", where), where),
            model_pins=model_parts(entry, where),
            tags=_strings(entry, "tags", where),
            title=entry["title"],
            description=str(entry.get("description", "")),
            healthcheck=_seconds(
                entry, "healthcheck", where, ("interval", "timeout", "start-period", "retries")
            ),
            normalize=_flag(entry, "normalize", where),
        )
    for target in targets.values():
        if target.family not in targets:
            raise PipelineError(f"{path}: [targets.{target.name}] family is no target")

    services: dict[str, Service] = {}
    for name, entry in (data.get("services") or {}).items():
        where = f"{path}: [services.{name}]"
        in_compose = entry.get("compose", True)
        if not isinstance(in_compose, bool):
            raise PipelineError(f"{where}: compose must be true or false")
        needed = ("target", "port", "start-budget") + (("port-env",) if in_compose else ())
        _required(entry, needed, where)
        if entry["target"] not in targets:
            raise PipelineError(f"{where}: target {entry['target']!r} is not in [targets]")
        port = entry["port"]
        if not isinstance(port, int) or not 1 <= port <= 65535:
            raise PipelineError(f"{where}: port {port!r} is not 1..65535")
        smoke = entry.get("smoke", {})
        if smoke:
            _required(smoke, ("model", "prompt", "wait"), f"{where} smoke")
        services[name] = Service(
            name=name,
            target=entry["target"],
            port=port,
            port_env=entry.get("port-env", ""),
            start_budget=_second(entry["start-budget"], f"{where}: start-budget"),
            compose_probe=_seconds(
                entry, "compose-probe", where, ("interval", "timeout", "retries")
            )
            if in_compose or "compose-probe" in entry
            else {},
            gpus=int(entry.get("gpus", 0)),
            kubernetes_probe=_seconds(entry, "kubernetes-probe", where, ())
            if "kubernetes-probe" in entry
            else {},
            smoke=dict(smoke),
            compose=in_compose,
        )
    return Manifest(path=path, locks=locks, targets=targets, services=services,
                    install_glibc=dict(install_glibc), runtime=_runtime(data, path))


def _runtime(data: dict, path: Path) -> Runtime:
    entry = data.get("runtime")
    if not isinstance(entry, dict):
        raise PipelineError(f"{path}: [runtime] is missing")
    _required(entry, ("user", "uid", "home", "run-dir"), f"{path}: [runtime]")
    uid = entry["uid"]
    if not isinstance(uid, int) or isinstance(uid, bool) or not 1000 <= uid <= 65533:
        raise PipelineError(f"{path}: [runtime] uid = {uid!r} is not 1000..65533")
    for key in ("home", "run-dir"):
        if not isinstance(entry[key], str) or not entry[key].startswith("/"):
            raise PipelineError(f"{path}: [runtime] {key} = {entry[key]!r} is no absolute path")
    return Runtime(str(entry["user"]), uid, entry["home"], entry["run-dir"])


def _flag(entry: dict, key: str, where: str) -> bool:
    value = entry.get(key, False)
    if not isinstance(value, bool):
        raise PipelineError(f"{where}: {key} must be true or false, not {value!r}")
    return value


def shell(manifest: Manifest, target: str | None, service: str | None, version: str) -> str:
    """KEY=value lines (shell-quoted) for one target or service."""
    values: dict[str, object] = {}
    if service:
        svc = manifest.service(service)
        target = svc.target
        values |= {"service": svc.name, "port": svc.port, "port_env": svc.port_env}
        values |= {"start_budget": svc.start_budget}
        values |= {key: svc.smoke[key] for key in ("model", "prompt", "wait") if key in svc.smoke}
    if target:
        tgt = manifest.target(target)
        values |= {"target": tgt.name, "family": tgt.family, "base_arg": tgt.base_arg}
        values |= {"python": tgt.python, "lock": tgt.lock}
        values |= {"tags": " ".join(tgt.tag_names(version)), "tag": tgt.tag_names(version)[0]}
        values |= {"normalize": int(tgt.normalize)}
    return "".join(f"{key}={shlex.quote(str(value))}\n" for key, value in values.items())


def _run(args: argparse.Namespace) -> int:
    loaded = pins.load(args.pins)
    manifest = load(loaded_pins=loaded)
    if not args.target and not args.service:
        raise PipelineError("targets shell: give --target or --service")
    print(shell(manifest, args.target, args.service, loaded.file("vllm-sdist").version), end="")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # noqa: SLF001
    cmd = sub.add_parser("targets", help="facts from build/targets.toml, for the shell scripts")
    cmd.set_defaults(func=_run, upstream=[])
    actions = cmd.add_subparsers(dest="action", required=True)
    sh = actions.add_parser("shell", help="KEY=value lines for one target or service")
    sh.add_argument("--target")
    sh.add_argument("--service")
