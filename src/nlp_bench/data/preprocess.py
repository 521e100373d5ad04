"""jsonl -> Megatron indexed dataset, as Megatron-LM's tools/preprocess_data.py does it: one document
per line (the `text` field), one sequence per document, an end-of-document token if asked, written to
PREFIX_text_document.bin/.idx."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from nlp_bench.data.indexed import IndexedDatasetWriter, best_dtype
from nlp_bench.data.tokenizer import GPT2Tokenizer
from nlp_bench.errors import BenchError

CHUNK = 256  # documents per unit of work

_worker_tokenizer: GPT2Tokenizer | None = None


def output_prefix(prefix: str | Path, json_key: str = "text") -> Path:
    return Path(f"{prefix}_{json_key}_document")


def _texts(path: Path, json_key: str) -> Iterator[list[str]]:
    chunk: list[str] = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BenchError(f"{path} line {number}: not JSON ({exc.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get(json_key), str):
                raise BenchError(f"{path} line {number}: no string field {json_key!r}")
            chunk.append(record[json_key])
            if len(chunk) == CHUNK:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def _init_worker(vocab: str, merges: str) -> None:
    global _worker_tokenizer
    _worker_tokenizer = GPT2Tokenizer(vocab, merges)


def _encode(texts: list[str]) -> list[list[int]]:
    return _worker_tokenizer.encode_batch(texts)


def preprocess(input_path: str | Path, prefix: str | Path, vocab_file: str | Path, merge_file: str | Path,
               append_eod: bool = False, workers: int = 1, json_key: str = "text",
               progress: Callable[[int], None] | None = None) -> tuple[Path, int, int]:
    """Writes the dataset; returns (prefix written, documents, tokens). progress(n) gets each chunk's size."""
    input_path = Path(input_path)
    if not input_path.is_file():
        raise BenchError(f"input file not found: {input_path}")
    tokenizer = GPT2Tokenizer(vocab_file, merge_file)
    out = output_prefix(prefix, json_key)
    docs = tokens = 0
    chunks = _texts(input_path, json_key)
    with IndexedDatasetWriter(out, best_dtype(tokenizer.vocab_size)) as writer:
        if workers > 1:
            with ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(str(vocab_file), str(merge_file))) as pool:
                encoded = pool.map(_encode, chunks)
                docs, tokens = _write(writer, encoded, tokenizer.eod, append_eod, progress)
        else:
            encoded = (tokenizer.encode_batch(c) for c in chunks)
            docs, tokens = _write(writer, encoded, tokenizer.eod, append_eod, progress)
    return out, docs, tokens


def _write(writer: IndexedDatasetWriter, encoded, eod: int, append_eod: bool, progress) -> tuple[int, int]:
    docs = tokens = 0
    for batch in encoded:
        for ids in batch:
            if append_eod:
                ids = [*ids, eod]
            if ids:
                writer.add_document([np.asarray(ids)])
                docs += 1
                tokens += len(ids)
        if progress is not None:
            progress(len(batch))
    return docs, tokens
