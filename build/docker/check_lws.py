"""Check LeaderWorkerSet documents against the vendored LWS CRD's schema (make lint-deploy).

kubernetes-validate knows only Kubernetes' own kinds; for a LeaderWorkerSet it warns
and passes. This validates every `leaderworkerset.x-k8s.io/v1` LeaderWorkerSet in the
given files against the openAPIV3Schema of the CRD in deploy/kubernetes/vendor/
(whose sha256 must match its SOURCE.toml), strictly: a field the schema does not
name is an error here, where the API server would prune it without a word (a typo
such as `readinesProbe` would silently drop the probe).

Usage: python check_lws.py FILE.yaml...   (needs PyYAML and jsonschema: the tools venv)
"""

from __future__ import annotations

import copy
import hashlib
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import yaml

REPO = Path(__file__).resolve().parents[2]
VENDOR = REPO / "deploy/kubernetes/vendor/lws-v0.10.0"
API_VERSION = "leaderworkerset.x-k8s.io/v1"
KIND = "LeaderWorkerSet"


def crd_schema(vendor: Path = VENDOR) -> tuple[dict[str, Any], str]:
    """(the v1 openAPIV3Schema, made strict; the LWS version) from the vendored CRD."""
    source = tomllib.loads((vendor / "SOURCE.toml").read_text())
    data = (vendor / source["file"]).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != source["sha256"]:
        raise SystemExit(f"{vendor / source['file']}: sha256 {digest} is not SOURCE.toml's")
    crd = yaml.safe_load(data)
    for version in crd["spec"]["versions"]:
        if f"{crd['spec']['group']}/{version['name']}" == API_VERSION:
            return strict(version["schema"]["openAPIV3Schema"]), source["version"]
    raise SystemExit(f"the vendored CRD has no {API_VERSION}")


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy where every object with named properties admits no others (unless the
    schema keeps unknown fields on purpose, x-kubernetes-preserve-unknown-fields)."""
    schema = copy.deepcopy(schema)
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
        for key in ("properties", "patternProperties"):
            stack.extend((node.get(key) or {}).values())
        for key in ("items", "additionalProperties", "not"):
            if isinstance(node.get(key), dict):
                stack.append(node[key])
        for key in ("allOf", "anyOf", "oneOf"):
            stack.extend(node.get(key) or [])
    return schema


def problems(documents: list[tuple[str, Any]], schema: dict[str, Any]) -> list[str]:
    found: list[str] = []
    validator = jsonschema.Draft7Validator(schema)
    for where, doc in documents:
        if doc.get("apiVersion") != API_VERSION:
            found.append(f"{where}: apiVersion {doc.get('apiVersion')!r} is not {API_VERSION}")
        for error in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
            path = ".".join(str(p) for p in error.absolute_path) or "(top)"
            found.append(f"{where}: {path}: {error.message[:300]}")
    return found


def lws_documents(paths: list[str]) -> list[tuple[str, Any]]:
    found = []
    for path in paths:
        for index, doc in enumerate(yaml.safe_load_all(Path(path).read_text())):
            if isinstance(doc, dict) and doc.get("kind") == KIND:
                name = (doc.get("metadata") or {}).get("name", f"#{index}")
                found.append((f"{path}: {KIND}/{name}", doc))
    return found


def main(argv: list[str]) -> int:
    schema, version = crd_schema()
    documents = lws_documents(argv)
    if not documents:
        print(f"no {KIND} in {' '.join(argv)}", file=sys.stderr)
        return 1
    found = problems(documents, schema)
    for line in found:
        print(line, file=sys.stderr)
    for where, _ in documents:
        print(f"{where}: {'FAILED' if found else 'valid'} against the LWS {version} CRD schema")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
