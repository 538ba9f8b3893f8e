"""deploy/kubernetes/glm5-lws.yaml against the vendored LeaderWorkerSet CRD schema, with
the checker `make lint-deploy` runs (build/docker/check_lws.py); each check also on a
drifted copy, which it must refuse."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

pytest.importorskip("yaml")
pytest.importorskip("jsonschema")

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "deploy/kubernetes/glm5-lws.yaml"


def _checker():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("check_lws", REPO / "build/docker/check_lws.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_lws = _checker()


@pytest.fixture(scope="module")
def schema() -> dict:
    return check_lws.crd_schema()[0]


def test_the_manifest_is_valid(schema: dict) -> None:
    documents = check_lws.lws_documents([str(MANIFEST)])
    assert [where.split(": ")[1] for where, _ in documents] == ["LeaderWorkerSet/glm5-lws"]
    assert check_lws.problems(documents, schema) == []


@pytest.mark.parametrize(
    ("old", "new", "words"),
    [
        ("readinessProbe:", "readinesProbe:", "'readinesProbe' was unexpected"),
        ("size: 2 ", 'size: "2" ', "size: '2' is not of type 'integer'"),
        ("restartPolicy: RecreateGroupOnPodRestart", "restartPolicy: Always",
         "'Always' is not one of"),
        ("apiVersion: leaderworkerset.x-k8s.io/v1", "apiVersion: leaderworkerset.x-k8s.io/v2",
         "is not leaderworkerset.x-k8s.io/v1"),
    ],
)  # fmt: skip
def test_drift_is_refused(schema: dict, tmp_path: Path, old: str, new: str, words: str) -> None:
    text = MANIFEST.read_text()
    assert old in text, old
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace(old, new, 1))
    found = check_lws.problems(check_lws.lws_documents([str(bad)]), schema)
    assert any(words in line for line in found), found


def test_the_vendored_crd_must_match_its_sha256(tmp_path: Path) -> None:
    vendor = tmp_path / "lws"
    shutil.copytree(check_lws.VENDOR, vendor)
    crd = next(vendor.glob("leaderworkerset*.yaml"))
    crd.write_text(crd.read_text().replace("size:", "sizes:", 1))
    with pytest.raises(SystemExit, match="is not SOURCE.toml's"):
        check_lws.crd_schema(vendor)
    assert "v0.10.0" in (check_lws.VENDOR / "SOURCE.toml").read_text()
