"""Megatron-LM's memory-mapped indexed dataset: PREFIX.bin (token ids, back to back) and PREFIX.idx.

The .idx layout, little-endian, which Megatron-LM writes and reads byte for byte the same:

    magic           9 bytes   b"MMIDIDX\\x00\\x00"
    version         uint64    1
    dtype code      uint8     1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
    sequence count  uint64    S
    document count  uint64    D (document boundaries, so documents + 1)
    sizes           int32[S]  tokens per sequence
    pointers        int64[S]  byte offset of each sequence in .bin
    document index  int64[D]  index of the first sequence of each document, then S
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from nlp_bench.errors import BenchError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPE_OF_CODE = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}
CODE_OF_DTYPE = {np.dtype(v): k for k, v in DTYPE_OF_CODE.items()}
_HEADER = struct.Struct("<9sQBQQ")


class DatasetError(BenchError):
    """An indexed dataset file is missing, truncated or not in Megatron's format."""


def best_dtype(vocab_size: int) -> type:
    """Megatron stores ids as uint16 when the vocabulary fits, else int32."""
    return np.uint16 if vocab_size < 65500 else np.int32


class IndexedDatasetWriter:
    """Appends documents to PREFIX.bin; `finalize` writes PREFIX.idx. Use as a context manager."""

    def __init__(self, prefix: str | Path, dtype: type = np.uint16) -> None:
        self.prefix = Path(prefix)
        self.dtype = np.dtype(dtype)
        if self.dtype not in CODE_OF_DTYPE:
            raise DatasetError(f"unsupported token dtype {self.dtype}")
        self.prefix.parent.mkdir(parents=True, exist_ok=True)
        self._bin = open(f"{self.prefix}.bin", "wb")
        self.sizes: list[int] = []
        self.doc_index: list[int] = [0]

    def add_document(self, sequences: list[list[int]] | list[np.ndarray]) -> None:
        """One document made of one or more sequences (Megatron: one per sentence, or one in all)."""
        for seq in sequences:
            arr = np.asarray(seq, dtype=self.dtype)
            self._bin.write(arr.tobytes(order="C"))
            self.sizes.append(len(arr))
        self.doc_index.append(len(self.sizes))

    def finalize(self) -> None:
        self._bin.close()
        sizes = np.asarray(self.sizes, dtype=np.int32)
        pointers = np.zeros(len(sizes), dtype=np.int64)
        if len(sizes) > 1:
            np.cumsum(sizes[:-1].astype(np.int64) * self.dtype.itemsize, out=pointers[1:])
        with open(f"{self.prefix}.idx", "wb") as fh:
            fh.write(_HEADER.pack(MAGIC, VERSION, CODE_OF_DTYPE[self.dtype], len(sizes), len(self.doc_index)))
            fh.write(sizes.tobytes(order="C"))
            fh.write(pointers.tobytes(order="C"))
            fh.write(np.asarray(self.doc_index, dtype=np.int64).tobytes(order="C"))

    def __enter__(self) -> IndexedDatasetWriter:
        return self

    def __exit__(self, kind, *_) -> None:
        if kind is None:
            self.finalize()
        else:
            self._bin.close()


class IndexedDataset:
    """Read-only view of PREFIX.bin/.idx through memory maps: opening costs no reading of tokens."""

    def __init__(self, prefix: str | Path) -> None:
        self.prefix = Path(prefix)
        idx_path, bin_path = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
        for path in (idx_path, bin_path):
            if not path.is_file():
                raise DatasetError(f"indexed dataset file not found: {path}")
        raw = idx_path.read_bytes()
        if len(raw) < _HEADER.size:
            raise DatasetError(f"{idx_path} is truncated: {len(raw)} bytes, shorter than the {_HEADER.size}-byte header")
        magic, version, code, count, docs = _HEADER.unpack_from(raw)
        if magic != MAGIC:
            raise DatasetError(f"{idx_path} is not a Megatron indexed dataset index (magic {magic!r}, expected {MAGIC!r})")
        if version != VERSION:
            raise DatasetError(f"{idx_path}: index version {version} is not supported (only {VERSION})")
        if code not in DTYPE_OF_CODE:
            raise DatasetError(f"{idx_path}: unknown dtype code {code}")
        expected = _HEADER.size + count * 4 + count * 8 + docs * 8
        if len(raw) != expected:
            raise DatasetError(f"{idx_path} is truncated or corrupt: {len(raw)} bytes, expected {expected} for "
                               f"{count} sequences and {docs} document boundaries")
        self.dtype = np.dtype(DTYPE_OF_CODE[code])
        off = _HEADER.size
        self.sizes = np.frombuffer(raw, dtype=np.int32, count=count, offset=off)
        self.pointers = np.frombuffer(raw, dtype=np.int64, count=count, offset=off + count * 4)
        self.document_index = np.frombuffer(raw, dtype=np.int64, count=docs, offset=off + count * 12)
        needed = int(self.pointers[-1]) + int(self.sizes[-1]) * self.dtype.itemsize if count else 0
        if bin_path.stat().st_size < needed:
            raise DatasetError(f"{bin_path} is truncated: {bin_path.stat().st_size} bytes, the index needs {needed}")
        self._bin = np.memmap(bin_path, dtype=np.uint8, mode="r") if needed else np.zeros(0, np.uint8)

    def __len__(self) -> int:
        return len(self.sizes)

    def get(self, index: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens of sequence `index`, optionally a slice of it."""
        size = int(self.sizes[index])
        length = size - offset if length is None else length
        start = int(self.pointers[index]) + offset * self.dtype.itemsize
        return np.frombuffer(self._bin, dtype=self.dtype, count=length, offset=start)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.get(index)
