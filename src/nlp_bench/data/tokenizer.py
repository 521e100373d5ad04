"""The GPT-2 byte-level BPE tokenizer (Megatron's GPT2BPETokenizer), built from vocab and merges files
with the `tokenizers` library."""

from __future__ import annotations

from pathlib import Path

from nlp_bench.errors import BenchError

EOD_TOKEN = "<|endoftext|>"


class GPT2Tokenizer:
    def __init__(self, vocab_file: str | Path, merge_file: str | Path) -> None:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        for path in (vocab_file, merge_file):
            if not Path(path).is_file():
                raise BenchError(f"tokenizer file not found: {path}")
        self._tok = Tokenizer(models.BPE.from_file(str(vocab_file), str(merge_file)))
        self._tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        self._tok.decoder = decoders.ByteLevel()
        eod = self._tok.token_to_id(EOD_TOKEN)
        if eod is None:
            raise BenchError(f"{vocab_file} has no {EOD_TOKEN} token: not a GPT-2 vocabulary")
        self.eod = eod

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts)]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)
