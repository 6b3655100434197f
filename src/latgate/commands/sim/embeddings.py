"""Deterministic embedding vectors: the same input always maps to the same unit vector."""

from __future__ import annotations

import base64
import hashlib
import math
import random
import struct

import orjson

DEFAULT_DIMENSIONS = 16
MAX_DIMENSIONS = 4096


def embedding_vector(item: object, *, seed: int, dimensions: int) -> list[float]:
    """A unit-length vector of ``dimensions`` floats derived from ``item`` (text or token ids) and ``seed``."""
    digest = hashlib.blake2b(orjson.dumps([seed, item]), digest_size=16).digest()
    rng = random.Random(digest)
    values = [rng.uniform(-1.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def encode_base64(vector: list[float]) -> str:
    """``encoding_format: base64``: little-endian float32 values, base64-encoded (as OpenAI sends them)."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
