"""Foundations of scoped search: the embedder and the vector extension.

The index, the prefilter and the authorized search come next; these pin
what they will stand on: vectors are deterministic and comparable, carry
the model's name and dimension, and sqlite-vec and FTS5 both work inside
apsw's SQLite.
"""

from __future__ import annotations

import subprocess
import sys

import apsw
import pytest

from scopefs.catalog import vectors
from scopefs.catalog.embedding import HashingEmbedder, cosine, default_embedder


def test_the_default_embedder_is_local_and_deterministic_across_processes() -> None:
    text = "Alice prefers green tea, never coffee"
    here = default_embedder().embed([text])[0]
    code = ("from scopefs.catalog.embedding import default_embedder; import json, sys; "
            "print(json.dumps(default_embedder().embed([sys.argv[1]])[0]))")
    there = subprocess.run([sys.executable, "-c", code, text], capture_output=True, check=True, text=True,
                           env={"PYTHONHASHSEED": "random", "PATH": "/usr/bin:/bin"}).stdout
    assert here == pytest.approx(__import__("json").loads(there))
    assert len(here) == default_embedder().dimension
    assert cosine(here, here) == pytest.approx(1.0)


def test_similar_texts_are_nearer_than_unrelated_ones() -> None:
    embed = HashingEmbedder().embed
    tea, teas, cars = embed(["she drinks green tea every morning", "green teas in the morning",
                             "the quarterly budget for vehicle maintenance"])
    assert cosine(tea, teas) > cosine(tea, cars) + 0.2


def test_the_model_identity_names_its_dimension() -> None:
    small, large = HashingEmbedder(64), HashingEmbedder(512)
    assert small.name != large.name and "64" in small.name and "512" in large.name
    assert len(small.embed(["x"])[0]) == 64
    with pytest.raises(ValueError):
        HashingEmbedder(3)


def test_hostile_text_is_bounded() -> None:
    vector = HashingEmbedder().embed(["a" * 10_000_000 + "!" * 1_000_000])[0]
    assert cosine(vector, vector) == pytest.approx(1.0)
    assert HashingEmbedder().embed([""])[0] == [0.0] * 256  # nothing to say: the zero vector


def test_sqlite_vec_and_fts5_work_in_the_catalogs_sqlite() -> None:
    conn = apsw.Connection(":memory:")
    assert vectors.load(conn).startswith("v")
    embed = HashingEmbedder(256).embed
    conn.execute("CREATE VIRTUAL TABLE v USING vec0(embedding float[256])")
    notes = ["green tea in the morning", "budget for vehicles", "tea ceremony notes"]
    for rowid, vector in enumerate(embed(notes), start=1):
        conn.execute("INSERT INTO v(rowid, embedding) VALUES (?, ?)", (rowid, vectors.pack(vector)))
    nearest = conn.execute("SELECT rowid FROM v WHERE embedding MATCH ? AND k = 3 ORDER BY distance",
                           (vectors.pack(embed(["morning green tea"])[0]),)).fetchall()
    assert [r[0] for r in nearest] == [1, 3, 2]
    conn.execute("CREATE VIRTUAL TABLE f USING fts5(body)")
    conn.executemany("INSERT INTO f(rowid, body) VALUES (?, ?)", list(enumerate(notes, start=1)))
    assert conn.execute("SELECT rowid FROM f WHERE f MATCH 'tea' ORDER BY rank").fetchall() != []
    with pytest.raises(apsw.Error):  # loading is switched off again after sqlite-vec
        conn.load_extension("/nonexistent.so")
