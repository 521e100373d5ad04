"""Megatron indexed datasets: byte layout, round trip through preprocessing, corruption, samples."""





from conftest import ROOT, run_bench

GPT2 = ROOT / "benchmark" / "data"

VOCAB, MERGES = GPT2 / "gpt2-vocab.json", GPT2 / "gpt2-merges.txt"

def test_cli_preprocess_and_its_errors(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "one"}\n{"text": "two"}\n')
    ok = run_bench("data", "preprocess", "--input", str(corpus), "--output-prefix", str(tmp_path / "out"),
                   "--vocab-file", str(VOCAB), "--merge-file", str(MERGES), "--append-eod", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "2 documents, 4 tokens" in ok.stdout
    corpus.write_text('{"text": "one"}\nnot json\n')
    bad = run_bench("data", "preprocess", "--input", str(corpus), "--output-prefix", str(tmp_path / "out"),
                    "--vocab-file", str(VOCAB), "--merge-file", str(MERGES), cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("bench: error: ") and "line 2: not JSON" in bad.stderr
    assert "Traceback" not in bad.stderr
