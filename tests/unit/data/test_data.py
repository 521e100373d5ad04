"""Megatron indexed datasets: byte layout, round trip through preprocessing, corruption, samples."""

import json
import struct

import numpy as np
import pytest
from conftest import ROOT

from nlp_bench.data.gpt_dataset import GPTDataset, split_ranges
from nlp_bench.data.indexed import DatasetError, IndexedDataset, IndexedDatasetWriter
from nlp_bench.data.preprocess import preprocess
from nlp_bench.data.tokenizer import GPT2Tokenizer

GPT2 = ROOT / "benchmark" / "data"

VOCAB, MERGES = GPT2 / "gpt2-vocab.json", GPT2 / "gpt2-merges.txt"

TEXTS = ["Hello world!", "The quick brown fox jumps over the lazy dog.", "  spaces and\nnewlines\t", "Ünïcödé ✓ 日本"]

@pytest.fixture(scope="module")
def tokenizer():
    return GPT2Tokenizer(VOCAB, MERGES)

def test_gpt2_ids_are_the_published_ones(tokenizer):
    assert tokenizer.encode("Hello world!") == [15496, 995, 0]
    assert tokenizer.eod == 50256 and tokenizer.vocab_size == 50257
    for text in TEXTS:
        assert tokenizer.decode(tokenizer.encode(text)) == text

def test_preprocess_round_trip(tmp_path, tokenizer):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS * 300))
    for workers in (1, 2):
        prefix, docs, tokens = preprocess(corpus, tmp_path / f"w{workers}", VOCAB, MERGES, append_eod=True,
                                          workers=workers)
        assert prefix.name == f"w{workers}_text_document" and docs == len(TEXTS) * 300
        ds = IndexedDataset(prefix)
        assert len(ds) == docs and ds.dtype == np.uint16
        for i, text in enumerate(TEXTS * 2):
            assert ds[i].tolist() == tokenizer.encode(text) + [50256]
        assert int(ds.sizes.sum()) == tokens

def test_idx_layout_field_by_field(tmp_path):
    with IndexedDatasetWriter(tmp_path / "d", np.uint16) as w:
        w.add_document([[1, 2, 3]])
        w.add_document([[4], [5, 6]])  # a document of two sequences
    raw = (tmp_path / "d.idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    assert struct.unpack_from("<Q", raw, 9) == (1,)  # version
    assert raw[17] == 8  # dtype code: uint16
    assert struct.unpack_from("<QQ", raw, 18) == (3, 3)  # sequences, document boundaries
    assert struct.unpack_from("<3i", raw, 34) == (3, 1, 2)  # sizes, int32
    assert struct.unpack_from("<3q", raw, 46) == (0, 6, 8)  # byte pointers, int64
    assert struct.unpack_from("<3q", raw, 70) == (0, 1, 3)  # document index, int64
    assert len(raw) == 94
    assert (tmp_path / "d.bin").read_bytes() == np.arange(1, 7, dtype=np.uint16).tobytes()
    ds = IndexedDataset(tmp_path / "d")
    assert [ds[i].tolist() for i in range(3)] == [[1, 2, 3], [4], [5, 6]]
    assert ds.document_index.tolist() == [0, 1, 3] and ds.get(0, 1, 2).tolist() == [2, 3]

@pytest.mark.parametrize("damage,message", [
    (lambda raw: b"XXXXXXXXX" + raw[9:], "not a Megatron indexed dataset index"),
    (lambda raw: raw[:-5], "truncated or corrupt"),
    (lambda raw: raw[:20], "shorter than the 34-byte header"),
    (lambda raw: raw[:9] + struct.pack("<Q", 2) + raw[17:], "version 2 is not supported"),
])
def test_corrupt_index_is_a_clear_error(tmp_path, damage, message):
    with IndexedDatasetWriter(tmp_path / "d") as w:
        w.add_document([[1, 2, 3]])
    idx = tmp_path / "d.idx"
    idx.write_bytes(damage(idx.read_bytes()))
    with pytest.raises(DatasetError, match=message):
        IndexedDataset(tmp_path / "d")

def test_truncated_bin_and_missing_files(tmp_path):
    with IndexedDatasetWriter(tmp_path / "d") as w:
        w.add_document([[1, 2, 3]])
    (tmp_path / "d.bin").write_bytes(b"\x01\x00")
    with pytest.raises(DatasetError, match="d.bin is truncated"):
        IndexedDataset(tmp_path / "d")
    with pytest.raises(DatasetError, match="not found"):
        IndexedDataset(tmp_path / "nothing")

def test_split_ranges():
    assert split_ranges("7,3,1", 1100) == [(0, 700), (700, 1000), (1000, 1100)]
    assert split_ranges("1", 10) == [(0, 10), (10, 10), (10, 10)]
    assert split_ranges("969,30,1", 1000)[0] == (0, 969)

def test_gpt_samples_run_across_documents_and_are_deterministic(tmp_path):
    with IndexedDatasetWriter(tmp_path / "d") as w:
        start = 0
        for n in range(1, 41):  # documents of growing length with consecutive token ids
            w.add_document([list(range(start, start + n))])
            start += n
    ds = IndexedDataset(tmp_path / "d")
    a = GPTDataset(ds, "1", "train", seq_length=16, num_samples=100, seed=5)
    b = GPTDataset(ds, "1", "train", seq_length=16, num_samples=100, seed=5)
    assert len(a) >= 100
    for i in range(len(a)):
        assert len(a[i]) == 17 and np.array_equal(a[i], b[i])
    c = GPTDataset(ds, "1", "train", seq_length=16, num_samples=100, seed=6)
    assert any(not np.array_equal(a[i], c[i]) for i in range(10))
    with pytest.raises(Exception, match="split .* is empty"):
        GPTDataset(ds, "1,0,0", "valid", 16, 10, 1)
