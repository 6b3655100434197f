"""A tiny Hugging Face ``tokenizer.json`` on disk for tests of exact token counting."""

from __future__ import annotations

from pathlib import Path


def whitespace_tokenizer(path: Path) -> Path:
    """Write a word-level tokenizer that splits on whitespace and knows only "hello" and
    "world" (anything else is one ``[UNK]`` token per word) to ``path``; returns ``path``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(["hello world"], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tokenizer.save(str(path))
    return path
