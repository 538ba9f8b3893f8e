"""Checks run inside the built CUDA image (`make check-image`), without a GPU.

    docker run --rm --user 10001:10001 -v REPO:/checks:ro --entrypoint python \
        frontier-serve:cuda /checks/checks/image/check_cuda_image.py

Each check prints `PASS name: detail` or `FAIL name: why`; the exit code is the
number of failures. What cannot run without a GPU is replaced by a stand-in
that says so in its name (the CUDA platform for vLLM's argument parser,
fixtures/stand_in_gpu.py, and a libcuda.so.1 so that vLLM's binaries load and
Triton's launcher links), nothing else.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

CHECKS = Path(__file__).resolve().parents[2]  # the repository, mounted read-only
OVERLAY = CHECKS / "patches" / "vllm" / "files"
SM120_SMEM_LIMIT = 101376
failures: list[str] = []


def check(name: str) -> Callable[[Callable[[], str]], Callable[[], str]]:
    def wrap(fn: Callable[[], str]) -> Callable[[], str]:
        try:
            detail = fn()
        except Exception as exc:  # a check's failure is a line, not the end of the run
            failures.append(name)
            print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc(limit=3)
        else:
            print(f"PASS {name}: {detail}", flush=True)
        return fn

    return wrap


def site_packages() -> Path:
    import sysconfig

    return Path(sysconfig.get_paths()["purelib"])


def stand_in_libcuda(folder: Path) -> Path:
    """A libcuda.so.1 holding a do-nothing function for every `cu*` symbol that
    vLLM's and the plugin's binaries import. With no driver in the container, it
    lets them load (nothing here calls into CUDA) and lets Triton's launcher link.
    On a GPU host the driver's own libcuda.so.1 is mounted by the Container Toolkit."""
    import re

    from triton.backends.nvidia import driver

    binaries = [*site_packages().glob("vllm/*.so"), *site_packages().glob("vllm_gguf_plugin/*.so")]
    listing = subprocess.run(
        ["nm", "-D", "--undefined-only", *map(str, binaries)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    names = {line.split()[-1].split("@")[0] for line in listing.splitlines() if " U cu" in line}
    # ... and the driver calls in the source of Triton's launcher.
    launcher = (Path(driver.__file__).parent / "driver.c").read_text()
    names |= set(re.findall(r"\b(cu[A-Z]\w+)\s*\(", launcher))
    names = sorted(names)
    source = folder / "stand_in_libcuda.c"
    source.write_text("".join(f"int {name}(void) {{ return 0; }}\n" for name in names))
    lib = folder / "libcuda.so.1"
    subprocess.run(["cc", "-shared", "-o", str(lib), str(source)], check=True)
    return lib


def run_checks() -> None:
    @check("user")
    def _() -> str:
        assert os.getuid() == 10001 and os.getgid() == 10001, (os.getuid(), os.getgid())
        home = Path.home()
        for folder in (home, home / ".cache", home / ".cache" / "huggingface"):
            assert os.access(folder, os.W_OK), f"{folder} is not writable for uid 10001"
        return f"uid 10001, gid 10001; {home} and its .cache writable (JIT and model caches)"

    @check("vllm and the plugin import")
    def _() -> str:
        import vllm
        import vllm_gguf_plugin  # noqa: F401

        plugin = importlib.metadata.version("vllm-gguf-plugin")
        assert "+frontier." in plugin, plugin
        return f"vllm {vllm.__version__}, vllm-gguf-plugin {plugin}"

    @check("vLLM is installed once, from the patched wheel with the release's abi3 tag")
    def _() -> str:
        site = site_packages()
        infos = sorted(p.name for p in site.glob("vllm-*.dist-info"))
        assert len(infos) == 1, infos
        wheel = (site / infos[0] / "WHEEL").read_text()
        assert "Tag: cp38-abi3-manylinux_2_28_x86_64" in wheel, wheel
        return f"{infos[0]}, {sys.version.split()[0]}"

    @check("overlay files are byte-identical to patches/vllm/files")
    def _() -> str:
        site = site_packages()
        files = sorted(
            p for p in OVERLAY.rglob("*") if p.is_file() and "__pycache__" not in p.parts
        )
        assert files, f"no overlay files under {OVERLAY}"
        for path in files:
            rel = path.relative_to(OVERLAY)
            installed = site / rel
            assert installed.is_file(), f"{rel} is not installed"
            assert installed.read_bytes() == path.read_bytes(), f"{rel} differs"
        return f"{len(files)} file(s)"

    @check("TRITON_MLA_SPARSE resolves")
    def _() -> str:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        cls = AttentionBackendEnum["TRITON_MLA_SPARSE"].get_class()
        assert cls.get_name() == "TRITON_MLA_SPARSE", cls.get_name()
        return f"{cls.__module__}.{cls.__name__}"

    @check("the GGUF plugin registers")
    def _() -> str:
        import vllm_gguf_plugin
        from vllm.model_executor.layers.quantization import get_quantization_config

        vllm_gguf_plugin.register()
        config = get_quantization_config("gguf")
        return f"quantization gguf -> {config.__module__}.{config.__name__}"

    for profile, gpus in (("glm5", 8), ("qwen36-dflash", 2)):

        @check(f"profiles/{profile}.env renders with a stand-in CUDA platform ({gpus} GPUs)")
        def _(profile: str = profile, gpus: int = gpus) -> str:
            return render_profile_with_stand_in_cuda_platform(profile, gpus)

    @check("with no GPU, render is one frontier-serve: error naming the likely causes, exit 2")
    def _() -> str:
        return no_gpu_is_one_error_line()

    @check("nvcc through CUDA_HOME")
    def _() -> str:
        home = Path(os.environ["CUDA_HOME"])
        assert shutil.which("nvcc") == str(home / "bin" / "nvcc"), shutil.which("nvcc")
        out = subprocess.run(
            [str(home / "bin" / "nvcc"), "--version"], capture_output=True, text=True, check=True
        ).stdout
        return f"{home}: " + out.strip().splitlines()[-1]

    @check("nvcc, the CUDA headers and torch are one CUDA release")
    def _() -> str:
        import re

        home = Path(os.environ["CUDA_HOME"])
        out = subprocess.run(
            [str(home / "bin" / "nvcc"), "--version"], capture_output=True, text=True, check=True
        ).stdout
        nvcc = re.search(r"release (\d+\.\d+)", out).group(1)
        header = (home / "include" / "cuda_runtime_api.h").read_text()
        number = int(re.search(r"#define CUDART_VERSION\s+(\d+)", header).group(1))
        headers = f"{number // 1000}.{number % 1000 // 10}"
        torch_cuda = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.version.cuda)"],
            env={k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert nvcc == headers == torch_cuda, f"nvcc {nvcc}, headers {headers}, torch {torch_cuda}"
        return f"CUDA {nvcc}"

    @check("nvcc compiles for sm_120a against CUDA's, CUTLASS's and FlashInfer's headers")
    def _() -> str:
        return jit_headers_compile()

    @check("JIT caches live in vLLM's cache folder (the vllm-cache volume)")
    def _() -> str:
        env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        code = "import flashinfer.jit.env as e; print(e.FLASHINFER_JIT_DIR)"
        flashinfer_dir = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
        root = str(Path.home() / ".cache" / "vllm")
        for name, path in (("Triton", os.environ.get("TRITON_CACHE_DIR", "")),
                           ("FlashInfer", flashinfer_dir)):  # fmt: skip
            assert path.startswith(root + "/"), f"{name} JIT cache {path!r} is outside {root}"
        return f"Triton {os.environ['TRITON_CACHE_DIR']}, FlashInfer {flashinfer_dir}"

    @check("FlashInfer is enabled (no 'FlashInfer kernels are disabled')")
    def _() -> str:
        from vllm.utils import flashinfer

        assert flashinfer.has_flashinfer(), "has_flashinfer() is False"
        return f"nvcc {flashinfer._flashinfer_nvcc_path()}, ninja {shutil.which('ninja')}"

    @check("Triton builds its launcher (gcc + Python headers), with a stand-in libcuda")
    def _() -> str:
        return triton_launcher_builds_with_stand_in_libcuda()

    @check("the sparse-MLA kernel compiles for sm_120 and every config fits 99 KiB, no spills")
    def _() -> str:
        return sm120_fitness_of_the_installed_kernel()

    @check("the SM90 Gluon sparse-MLA builds compile with the image's Triton (sm_90a)")
    def _() -> str:
        return sm90_gluon_builds_compile()

    @check("check-gguf passes on a tiny GLM-5 GGUF")
    def _() -> str:
        return check_gguf_on_a_tiny_glm5()


def render_profile_with_stand_in_cuda_platform(profile: str, gpus: int) -> str:
    """vLLM's parser needs a platform; with no GPU the CUDA build cannot infer one.
    fixtures/stand_in_gpu.py gives it a stand-in CUDA platform with `gpus` GPUs and
    runs `frontier-serve render` through the image's own vLLM parser."""
    result = subprocess.run(
        [sys.executable, "-m", "fixtures.stand_in_gpu", "--gpus", str(gpus), "render",
         "--env-file", str(CHECKS / "profiles" / f"{profile}.env")],
        cwd=CHECKS, env={**os.environ, "PYTHONPATH": str(CHECKS)},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise AssertionError(f"exit {result.returncode}: {result.stderr.strip()[-1500:]}")
    argv = result.stdout.strip()
    assert f"--tensor-parallel-size {gpus}" in argv, argv
    return argv[-160:]


def no_gpu_is_one_error_line() -> str:
    """The real path, no stand-in: the CUDA build with no GPU visible (D7)."""
    result = subprocess.run(
        ["frontier-serve", "render", "--env-file", str(CHECKS / "profiles" / "glm5.env")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2, (result.returncode, result.stderr[-1500:])
    assert "Traceback" not in result.stderr, result.stderr[-1500:]
    errors = [line for line in result.stderr.splitlines() if "frontier-serve: error:" in line]
    assert errors and "GPU" in errors[0], result.stderr[-1500:]
    for hint in ("Container Toolkit", "--gpus", "deploy.resources"):
        assert hint in result.stderr, f"the error does not mention {hint}: {result.stderr}"
    return errors[0][:160]


def jit_headers_compile() -> str:
    """nvcc from CUDA_HOME builds an sm_120a object against the headers FlashInfer's
    JIT passes (its own, CUTLASS's, CCCL's) and vLLM's bundled DeepGEMM includes."""
    # FlashInfer's env module imports cutlass-dsl, which asks the driver for its
    # version: read the folders in a child that does not see the stand-in libcuda.
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    listing = subprocess.run(
        [sys.executable, "-c", _FLASHINFER_INCLUDES],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    home = Path(os.environ["CUDA_HOME"])
    includes = [home / "include", *map(Path, json.loads(listing))]
    deep_gemm = [p for p in site_packages().glob("**/deep_gemm/include") if p.is_dir()]
    assert deep_gemm, "no deep_gemm/include in site-packages"
    includes += deep_gemm
    missing = [p for p in includes if not p.is_dir()]
    assert not missing, f"include folders missing: {missing}"
    source = (
        "#include <cuda_runtime.h>\n#include <cuda_bf16.h>\n#include <cuda_fp8.h>\n"
        "#include <cute/tensor.hpp>\n#include <cutlass/cutlass.h>\n"
        "#include <flashinfer/vec_dtypes.cuh>\n"
        "__global__ void k(__nv_bfloat16* x) { x[threadIdx.x] = __float2bfloat16(1.0f); }\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        cu = Path(tmp) / "probe.cu"
        cu.write_text(source)
        cmd = [
            str(home / "bin" / "nvcc"),
            "-std=c++17",
            "-arch=sm_120a",
            "-c",
            str(cu),
            "-o",
            str(Path(tmp) / "probe.o"),
            *(f"-I{p}" for p in includes),
        ]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise AssertionError(result.stderr.strip()[-1500:])
    return f"sm_120a object built with {len(includes)} include folders (DeepGEMM's among them)"


_FLASHINFER_INCLUDES = """
import json
import flashinfer.jit.env as e
dirs = [e.FLASHINFER_INCLUDE_DIR, e.FLASHINFER_CSRC_DIR, e.SPDLOG_INCLUDE_DIR]
dirs += [*e.CUTLASS_INCLUDE_DIRS, *e.CCCL_INCLUDE_DIRS]
print(json.dumps([str(d) for d in dirs]))
"""


def triton_launcher_builds_with_stand_in_libcuda() -> str:
    """Triton compiles its C launcher (cuda_utils) with the C compiler and Python.h on
    first use. Without a driver there is no libcuda.so.1 to link: the stand-in made at
    the start (TRITON_LIBCUDA_PATH) takes its place, as the driver's would on a GPU host."""
    from triton.backends.nvidia import driver
    from triton.runtime.build import compile_module_from_src

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TRITON_CACHE_DIR"] = str(Path(tmp) / "cache")
        src = (Path(driver.__file__).parent / "driver.c").read_text()
        kwargs = {"src": src, "name": "cuda_utils"}
        try:
            compile_module_from_src(
                **kwargs,
                library_dirs=driver.library_dirs(),
                include_dirs=driver.include_dirs,
                libraries=driver.libraries,
            )
        except ImportError as exc:  # built, but loading needs the real driver's symbols
            if not any(word in str(exc) for word in ("cuda_utils", "libcuda", "undefined")):
                raise
            return f"built (loading needs a GPU driver: {exc})"
    import triton

    return f"triton {triton.__version__}: cuda_utils built and loaded"


def sm120_fitness_of_the_installed_kernel() -> str:
    sys.path.insert(0, str(CHECKS / "fixtures" / "kernels"))
    import sm120_fitness
    import triton

    mod = importlib.import_module("vllm.v1.attention.ops.triton_sparse_mla")
    rows = sm120_fitness.sm120_table(mod)
    bad = [r for r in rows if r.shared > SM120_SMEM_LIMIT or r.local or r.stack]
    assert not bad, f"{len(bad)} config(s) do not fit: {bad[:3]}"
    worst = max(rows, key=lambda r: r.shared)
    return (
        f"triton {triton.__version__}: {len(rows)} builds, max shared {worst.shared} B "
        f"({worst.name}), no stack or local"
    )


def sm90_gluon_builds_compile() -> str:
    """Every Gluon config an H100/H200 launches, compiled for sm_90a by the image's Triton:
    the device machine's Triton is not the image's, and Gluon's API moves between
    releases (3.7 renamed thread_barrier)."""
    sys.path.insert(0, str(CHECKS / "fixtures" / "kernels"))
    import sm120_fitness
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    mod = importlib.import_module("vllm.v1.attention.ops.triton_sparse_mla")
    assert mod._HAS_GLUON, "the image's Triton has no Gluon"
    cfgs = [c for c in mod._CONFIGS_BIG.values() if c.gluon]
    for cfg in cfgs:
        constexprs = mod._sm90_constexprs(cfg, False, cfg.pdl, cfg.cluster_merge)
        sm120_fitness.compile_build(
            mod._sparse_mla_split_kernel_sm90, constexprs, {"num_warps": cfg.num_warps},
            target=GPUTarget("cuda", 90, 32), source=GluonASTSource,
        )  # fmt: skip
    return f"triton {triton.__version__}: {len(cfgs)} Gluon builds"


def check_gguf_on_a_tiny_glm5() -> str:
    sys.path.insert(0, str(CHECKS))
    from fixtures import tiny_glm5_gguf

    with tempfile.TemporaryDirectory() as tmp:
        tiny_glm5_gguf.main([tmp])
        gguf_file = Path(tmp) / tiny_glm5_gguf.GGUF_NAME
        result = subprocess.run(
            ["frontier-serve", "check-gguf", str(gguf_file), "--hf-config", tmp],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            tail = f"{result.stdout[-800:]} {result.stderr[-800:]}"
            raise AssertionError(f"exit {result.returncode}: {tail}")
    return result.stdout.strip().splitlines()[-1]


if __name__ == "__main__":
    if "TRITON_LIBCUDA_PATH" not in os.environ:
        # The loader reads LD_LIBRARY_PATH at start: run again with the stand-in on it
        # (the container is removed afterwards, and the folder with it).
        stand_in = tempfile.mkdtemp(prefix="stand-in-libcuda-")
        stand_in_libcuda(Path(stand_in))
        os.environ["LD_LIBRARY_PATH"] = stand_in
        os.environ["TRITON_LIBCUDA_PATH"] = stand_in
        os.execv(sys.executable, [sys.executable, *sys.argv])
    run_checks()
    print(f"{len(failures)} check(s) failed" + (f": {', '.join(failures)}" if failures else ""))
    sys.exit(min(len(failures), 100))
