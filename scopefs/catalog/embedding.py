"""Turning note text into vectors for the search index, with a pluggable model.

Search ranks by meaning as well as by words, and the vectors it compares
must all come from the same model: a changed model (or dimension) must
force a reindex, never mix two spaces in one index. So every embedder
has a ``name`` and a ``dimension``, which the index records beside its
vectors.

The default needs no download and no network: ``HashingEmbedder`` hashes
word unigrams, word bigrams and character trigrams into signed buckets
(feature hashing) and normalizes to unit length. It is deterministic
across processes and machines (CRC-32, not Python's salted ``hash``),
so the same text always gets the same vector, and texts that share words
and word pieces come out near each other. It knows no synonyms; that is
what the optional WordLlama model is for, when its package is installed
(``pip install 'scopefs[embeddings]'``; its weights ship in the wheel).

Nothing here logs or stores text; it only returns numbers.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
import re
import zlib
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

MAX_TEXT_CHARS = 64 << 10  # what one chunk may hand the embedder; longer text is cut, never read whole
_WORDS = re.compile(r"\w{1,64}", re.UNICODE)  # bounded: no catastrophic backtracking on hostile text


class Embedder(Protocol):
    """What the index needs from a model: a stable identity and vectors of one size."""

    @property
    def name(self) -> str: ...

    @property
    def dimension(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


class HashingEmbedder:
    """Deterministic local embeddings by feature hashing (the default)."""

    def __init__(self, dimension: int = 256) -> None:
        if not 16 <= dimension <= 4096:
            raise ValueError("dimension must be between 16 and 4096")
        self._dimension = dimension

    @property
    def name(self) -> str:
        return f"scopefs-hashing-v2-{self._dimension}"

    @property
    def dimension(self) -> int:
        return self._dimension

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [self._one(text) for text in texts]

    def _one(self, text: str) -> list[float]:
        # Words weigh most, then word pairs, then character trigrams (which
        # match word forms). A word's own buckets are cached: notes share
        # most of their words, and this runs on every write.
        dimension = self._dimension
        vector = [0.0] * dimension
        words = [w.casefold() for w in _WORDS.findall(text[:MAX_TEXT_CHARS])]
        for word, count in Counter(words).items():
            for bucket, weight in _word_buckets(word, dimension):
                vector[bucket] += weight * count
        for (first, second), count in Counter(itertools.pairwise(words)).items():
            bucket, sign = _bucket("b:" + first + " " + second, dimension)
            vector[bucket] += sign * 0.5 * count
        norm = math.sqrt(sum(v * v for v in vector))
        return [v / norm for v in vector] if norm else vector


def _bucket(feature: str, dimension: int) -> tuple[int, float]:
    """CRC-32 (deterministic everywhere, cheap): its low bits pick the bucket, its top bit the sign."""
    digest = zlib.crc32(feature.encode("utf-8", "surrogatepass"))
    return digest % dimension, (1.0 if digest >> 31 else -1.0)


CACHED_WORD_CHARS = 24  # longer words are rare in prose and costly to keep: computed each time (20 us)


def _word_buckets(word: str, dimension: int) -> tuple[tuple[int, float], ...]:
    """A word's feature and its character trigrams, as (bucket, signed weight)."""
    if len(word) > CACHED_WORD_CHARS:
        return _word_features(word, dimension)
    return _cached_word_features(word, dimension)


def _word_features(word: str, dimension: int) -> tuple[tuple[int, float], ...]:
    bucket, sign = _bucket("w:" + word, dimension)
    out = [(bucket, sign)]
    padded = f"^{word}$"
    for i in range(len(padded) - 2):
        bucket, sign = _bucket("c:" + padded[i:i + 3], dimension)
        out.append((bucket, 0.25 * sign))
    return tuple(out)


# Bounded in bytes, not only in count: a long-running process (scopefs serve, a mount) meets new
# words with every write, and 32,768 entries of 64-character words (65 features, about 7.5 KB each)
# held some 240 MB. Now at most 8,192 words of at most 24 characters (about 2.9 KB): 24 MB.
_cached_word_features = functools.lru_cache(maxsize=1 << 13)(_word_features)


class WordLlamaEmbedder:
    """WordLlama's static sentence embeddings, when the optional package is installed.

    Chosen because its weights ship inside the PyPI wheel: installing the
    ``[embeddings]`` extra is the whole setup, with no model download and no
    network at run time (loading is pointed at the package's own files with
    downloads disabled). It knows word meanings the hashing embedder cannot
    (tea and matcha are near), at about 16 MiB of weights.

    Its name ends in a fingerprint of the weights file (``@`` and 12 hex
    digits of its SHA-256): a package upgrade that ships other weights then
    names another model, so the index's old vectors are never compared with
    the new space.
    """

    CONFIG = "l2_supercat"

    def __init__(self, dimension: int = 256) -> None:
        try:
            import wordllama
        except ImportError:
            raise RuntimeError("the wordllama package is not installed (pip install 'scopefs[embeddings]')") from None
        from pathlib import Path

        package_dir = Path(wordllama.__file__).parent  # holds weights/ and tokenizers/ of the bundled model
        weights = package_dir / "weights" / f"{self.CONFIG}_{dimension}.safetensors"
        try:
            self._fingerprint = hashlib.sha256(weights.read_bytes()).hexdigest()[:12]
        except OSError:
            raise RuntimeError(f"the wordllama package ships no {self.CONFIG} weights"
                               f" of dimension {dimension}") from None
        try:
            self._model = wordllama.WordLlama.load(config=self.CONFIG, dim=dimension, cache_dir=package_dir,
                                                   disable_download=True)
        except (FileNotFoundError, ValueError) as exc:
            raise RuntimeError(f"the bundled WordLlama model cannot be loaded: {type(exc).__name__}") from None
        self._dimension = dimension

    @property
    def name(self) -> str:
        return f"wordllama:{self.CONFIG}-{self._dimension}@{self._fingerprint}"

    @property
    def dimension(self) -> int:
        return self._dimension

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        vectors = self._model.embed([t[:MAX_TEXT_CHARS] for t in texts], norm=True)
        return [list(map(float, v)) for v in vectors]


def default_embedder() -> Embedder:
    return HashingEmbedder()


_HASHING_PREFIX = "scopefs-hashing-v2-"
_WORDLLAMA_PREFIX = f"wordllama:{WordLlamaEmbedder.CONFIG}-"
_WORDLLAMA = re.compile(re.escape(_WORDLLAMA_PREFIX) + r"([0-9]{1,4})(@[0-9a-f]{12})?")
_loaded: dict[str, Embedder] = {}


def embedder_for(name: str) -> Embedder:
    """The embedder an index records by ``name``, loaded once per process.

    ``name`` may leave out a WordLlama fingerprint (what a person types for
    ``reindex --model``); the index then records the full name. ValueError
    for a name no embedder answers to; RuntimeError when the model's optional
    package is not installed or its weights are not the ones named. Callers
    degrade to words only and say so; they never substitute another model,
    whose vectors would live in a different space.
    """
    found = _loaded.get(name)
    if found is not None:
        return found
    wordllama = _WORDLLAMA.fullmatch(name)
    if name.startswith(_HASHING_PREFIX) and name[len(_HASHING_PREFIX):].isdigit():
        embedder: Embedder = HashingEmbedder(int(name[len(_HASHING_PREFIX):]))
    elif wordllama:
        embedder = WordLlamaEmbedder(int(wordllama.group(1)))
        if wordllama.group(2) and embedder.name != name:
            raise RuntimeError("the installed WordLlama weights are not the ones the index was built with;"
                               f" run 'scopefs reindex --model {_WORDLLAMA_PREFIX}{wordllama.group(1)}'")
    else:
        raise ValueError("unknown embedding model; use scopefs-hashing-v2-<dimension> or "
                         f"{_WORDLLAMA_PREFIX}256")
    if embedder.name != name and not (wordllama and not wordllama.group(2)):
        raise ValueError("unknown embedding model")
    _loaded[name] = embedder
    return embedder


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity of two vectors (1.0 for the same direction)."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norms if norms else 0.0
