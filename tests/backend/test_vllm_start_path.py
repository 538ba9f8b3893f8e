"""vLLM patches 0014-0016: work off a start's critical path.

Real vLLM (the CPU tier) and a real byte-level BPE tokenizer (fixtures.tiny_model).
- 0014: the renderer's tokenizer pool makes no copies when built, the background
  warm-up (which the multiprocess client starts once the engine core exists) makes
  them and resolves the chat template, and warmup() joins it.
- 0015: the engine core's structured-output manager loads its tokenizer on its
  grammar executor instead of in its constructor.
- 0016: on CPU with the multiprocessing executor the engine core is forked (as on
  GPUs) while its workers stay spawned.
Each fails on the unpatched vLLM (no `defer`, no `warmup_text`, no `_tokenizer_future`,
no `_engine_core_mp_context`).
"""

from __future__ import annotations

import copy
import threading
from concurrent.futures import Future
from importlib.util import find_spec
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(find_spec("vllm") is None, reason="needs the CPU test tier (make venv)"),
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fixtures.tiny_model import build_tiny_model

    return Path(build_tiny_model(str(tmp_path_factory.mktemp("tiny"))))


class _CopyCounter:
    """Stands in for the `copy` module inside vllm.tokenizers.hf: counts deep copies."""

    def __init__(self) -> None:
        self.deep = 0
        self._lock = threading.Lock()

    def copy(self, obj: object) -> object:
        return copy.copy(obj)

    def deepcopy(self, obj: object) -> object:
        with self._lock:
            self.deep += 1
        return copy.deepcopy(obj)


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> _CopyCounter:
    import vllm.tokenizers.hf as hf

    counter = _CopyCounter()
    monkeypatch.setattr(hf, "copy", counter)
    return counter


def _vllm_config(model: Path):  # noqa: ANN202 - vLLM's own type
    from vllm.config import ModelConfig, VllmConfig

    return VllmConfig(model_config=ModelConfig(model=str(model), max_model_len=128))


def test_deferred_pool_copies_only_when_filled(tiny_dir: Path, copies: _CopyCounter) -> None:
    from transformers import AutoTokenizer
    from vllm.tokenizers.hf import maybe_make_thread_pool

    tok = AutoTokenizer.from_pretrained(str(tiny_dir))
    expected = tok.encode("the cat sat")
    maybe_make_thread_pool(tok, 2, defer=True)
    assert copies.deep == 0
    tok.fill_pool()
    assert copies.deep == 2
    tok.fill_pool()  # at most once
    assert copies.deep == 2
    assert tok.encode("the cat sat") == expected


def test_deferred_pool_serves_before_it_is_filled(tiny_dir: Path, copies: _CopyCounter) -> None:
    from transformers import AutoTokenizer
    from vllm.tokenizers.hf import maybe_make_thread_pool

    tok = AutoTokenizer.from_pretrained(str(tiny_dir))
    expected = tok.encode("a dog ran")
    maybe_make_thread_pool(tok, 2, defer=True)
    assert tok.encode("a dog ran") == expected  # an empty pool makes its own copy
    assert copies.deep == 1


def test_pool_not_deferred_copies_at_once(tiny_dir: Path, copies: _CopyCounter) -> None:
    from transformers import AutoTokenizer
    from vllm.tokenizers.hf import maybe_make_thread_pool

    tok = AutoTokenizer.from_pretrained(str(tiny_dir))
    maybe_make_thread_pool(tok, 3)
    assert copies.deep == 3


def test_renderer_warms_its_tokenizer_in_the_background(
    tiny_dir: Path, copies: _CopyCounter
) -> None:
    from vllm.renderers import hf as renderers_hf
    from vllm.renderers.registry import renderer_from_config

    config = _vllm_config(tiny_dir)
    renderer = renderer_from_config(config)
    assert isinstance(renderer, renderers_hf.HfRenderer)
    assert copies.deep == 0, "the pool's copies are made on the start's critical path"

    renderer.start_mm_warmup_in_background()  # what the client calls after the engine starts
    future = renderer._text_warmup_future
    assert isinstance(future, Future)
    future.result(timeout=120)
    workers = config.model_config.renderer_num_workers
    assert copies.deep == workers + 1
    assert any(key[0] == renderer.tokenizer.name_or_path
               for key in renderers_hf._PROCESSOR_CHAT_TEMPLATES)  # fmt: skip

    renderer.warmup_text()  # idempotent
    assert copies.deep == workers + 1
    renderer.shutdown()


def test_structured_output_tokenizer_loads_on_the_grammar_executor(tiny_dir: Path) -> None:
    from vllm.v1.structured_output import StructuredOutputManager

    manager = StructuredOutputManager(_vllm_config(tiny_dir))
    assert isinstance(manager._tokenizer_future, Future)
    tokenizer = manager.tokenizer
    assert tokenizer.encode("the cat") == tokenizer.encode("the cat")
    assert len(tokenizer) > 256


def test_cpu_engine_core_is_forked_and_its_workers_spawned(
    tiny_dir: Path, restored_environ: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.utils.system_utils import get_mp_context
    from vllm.v1.engine.utils import _engine_core_mp_context

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    config = _vllm_config(tiny_dir)
    assert config.parallel_config.distributed_executor_backend == "mp"  # forced on CPU
    assert _engine_core_mp_context(config).get_start_method() == "fork"
    assert get_mp_context().get_start_method() == "spawn"  # the workers, as before


def test_without_the_multiprocessing_executor_the_start_method_is_unchanged(
    tiny_dir: Path, restored_environ: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.utils.system_utils import get_mp_context
    from vllm.v1.engine.utils import _engine_core_mp_context

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    config = _vllm_config(tiny_dir)
    assert config.parallel_config.distributed_executor_backend != "mp"
    assert (_engine_core_mp_context(config).get_start_method()
            == get_mp_context().get_start_method())
