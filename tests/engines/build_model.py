"""Builds the engine tier's model: a random-weight Llama and a small BPE tokenizer with a
chat template, saved as a Hugging Face model folder vLLM loads offline.

Run with the vLLM venv's interpreter (it needs ``torch``, ``transformers`` and
``tokenizers``): ``python build_model.py OUT_DIR [SHAPE]``. Writes to ``OUT_DIR.partial``
and renames it when complete, so an interrupted build is never mistaken for a model.

Shapes (:data:`SHAPES`):

- ``default``: hidden size 768, 12 layers (~118 M parameters), 1024 positions: on a
  2-core CPU it decodes at a pace of tens of milliseconds between tokens, like a real
  engine under load, so streams last long enough to be interrupted.
- ``long``: hidden size 256, 4 layers, 8192 positions, for multi-turn histories of
  several thousand tokens (the prefix-caching test): small enough that a history's
  prefill takes a fraction of a second on one core, large enough that it is measurable
  against a cached prefix.

The weights are random: the text is gibberish, the framing, token counts and lifecycle
are vLLM's.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

VOCAB_SIZE = 4096
#: shape name -> (hidden size, layers, attention heads, positions)
SHAPES = {"default": (768, 12, 12, 1024), "long": (256, 4, 4, 8192)}
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}"
    "</s>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus() -> list[str]:
    """Local text to train the tokenizer on: the standard library's asyncio sources."""
    import asyncio

    folder = Path(asyncio.__file__).parent
    return [path.read_text(encoding="utf-8") for path in sorted(folder.glob("*.py"))]


def build(out: Path, shape: str = "default") -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    hidden, layers, heads, positions = SHAPES[shape]
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    specials = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = positions
    fast.save_pretrained(partial)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=positions,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(partial, safe_serialization=True)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)


if __name__ == "__main__":
    build(Path(sys.argv[1]), *sys.argv[2:3])
