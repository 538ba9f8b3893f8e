"""vLLM's sparse_utils.py as the pinned sdist ships it, for machines without vLLM.

The backend kernel-call tests (test_backend_kernel_call.py) build the
backend's call from vLLM's own remap kernel. The GPU machine has no vLLM and
no network, so the file travels with the checkout: `make kernel-upstream`
(CPU side, plain python3) takes it out of the pinned vLLM sdist, verified by
the sdist's sha256 in build/pins.toml and by the member's own sha256 below,
and writes it to .work/kernel-upstream/ (ignored by git: it is upstream's code,
not ours; a device call carries that folder). The tests re-check its sha256
before reading it, so an edited copy fails them.

Standard library only (no torch), like build/pipeline.
"""

from __future__ import annotations

import hashlib
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SDIST_PIN = "vllm-sdist"
MEMBER = "vllm/v1/attention/backends/mla/sparse_utils.py"
# sha256 of MEMBER inside vllm-0.32.0.tar.gz (pins.toml [files.vllm-sdist]).
MEMBER_SHA256 = "f95c8f9027d0705f0aaa2cfe7f7540b70cd3f58d6b105a7b9b1f25b8d42b2915"
# Not a .py file: it is upstream's code, neither linted nor collected here.
COPY = REPO / ".work/kernel-upstream/sparse_utils.py.txt"


class PinnedCopyError(RuntimeError):
    pass


def pinned_sparse_utils() -> Path:
    """The extracted copy, after checking it is byte for byte the pinned member."""
    if not COPY.is_file():
        raise PinnedCopyError(f"{COPY} is missing: run `make kernel-upstream`")
    actual = hashlib.sha256(COPY.read_bytes()).hexdigest()
    if actual != MEMBER_SHA256:
        raise PinnedCopyError(
            f"{COPY}: sha256 {actual} is not the pinned {MEMBER_SHA256}; "
            "run `make kernel-upstream` to restore it"
        )
    return COPY


def member_from_sdist(sdist: Path) -> bytes:
    with tarfile.open(sdist) as tar:
        names = [n for n in tar.getnames() if n.split("/", 1)[-1] == MEMBER]
        if len(names) != 1:
            raise PinnedCopyError(f"{sdist}: expected one {MEMBER}, found {names}")
        handle = tar.extractfile(names[0])
        assert handle is not None
        data = handle.read()
    actual = hashlib.sha256(data).hexdigest()
    if actual != MEMBER_SHA256:
        raise PinnedCopyError(f"{sdist}:{MEMBER} sha256 {actual} != {MEMBER_SHA256}")
    return data


def main() -> int:
    sys.path.insert(0, str(REPO / "build"))
    from pipeline import fetch, pins  # the pipeline's cache and sha256 check
    from pipeline.errors import PipelineError

    try:  # cached, or downloaded and verified
        sdist = fetch.fetch_one(pins.load().file(SDIST_PIN))
        COPY.parent.mkdir(parents=True, exist_ok=True)
        COPY.write_bytes(member_from_sdist(sdist))
        pinned_sparse_utils()
    except (PipelineError, PinnedCopyError, OSError) as exc:
        # e.g. a GPU machine with no package index: the copy must travel with the checkout
        print(
            f"pinned_upstream: error: {exc}\n"
            f"pinned_upstream: without a package index, run `make kernel-upstream` where"
            f" there is one and carry {COPY.parent.relative_to(REPO)}/ with the checkout",
            file=sys.stderr,
        )
        return 1
    print(f"wrote {COPY.relative_to(REPO)} ({MEMBER} from {sdist.name}, sha256 {MEMBER_SHA256})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
