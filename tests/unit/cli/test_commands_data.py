"""`--data-path` (issue 53, finding 8): a run or a sweep trains on the dataset it names, in place of the tag's
OSCAR or mock data, and a dataset that is not there is one line before anything is submitted."""

import json

from conftest import ROOT

DATA = ROOT / "benchmark" / "data"


def _dataset(bench, folder):
    """The shipped sample corpus as `bench data preprocess` writes it: folder/sample_text_document.{bin,idx}."""
    out = bench("data", "preprocess", "--input", str(DATA / "sample.jsonl"), "--output-prefix", str(folder / "sample"),
                "--vocab-file", str(DATA / "gpt2-vocab.json"), "--merge-file", str(DATA / "gpt2-merges.txt"),
                "--append-eod")
    assert out.exit_code == 0, out.output
    return folder / "sample_text_document"


def _points(results):
    return [(json.loads((f / "point.json").read_text()), (f / "jobscript.sbatch").read_text())
            for f in sorted(results.glob("nlp/*/*/")) if (f / "point.json").is_file()]


def test_a_run_trains_on_the_data_path_it_is_given(bench, results, tmp_path, monkeypatch):
    prefix = _dataset(bench, tmp_path)
    monkeypatch.chdir(tmp_path)
    out = bench("run", "--tag", "smoke", "--data-path", "sample_text_document.bin", "--dry-run")
    assert out.exit_code == 0 and "warning" not in out.stderr, out.output
    ((point, script),) = _points(results)
    assert point["train"]["data-path"] == str(prefix) and "mock-data" not in point["train"]
    assert f"--data-path {prefix}\n" in script and "--mock-data" not in script
    out = bench("run", "--tag", "175", "--data-path", str(prefix), "--dry-run")
    script = next(s for p, s in _points(results) if p["tag"] == "175")
    assert f"--data-path {prefix}\n" in script and "oscar_text_document" not in script, out.output
    assert '--vocab-file "${NLP_BENCH_DATA}"/gpt2-vocab.json' in script  # the tokenizer files stay the tag's


def test_a_sweep_and_a_grid_train_on_the_data_path(bench, results, tmp_path):
    prefix = _dataset(bench, tmp_path)
    grid = ROOT / "benchmark" / "grids" / "smoke.yaml"
    assert bench("sweep", str(grid), "--data-path", str(prefix), "--dry-run").exit_code == 0
    own = tmp_path / "g.yaml"
    own.write_text(grid.read_text().replace("train:\n", f"train:\n  data-path: {prefix}\n"))
    assert bench("sweep", str(own), "--dry-run").exit_code == 0
    points = _points(results)
    assert len(points) == 8
    for point, script in points:
        assert point["train"]["data-path"] == str(prefix) and f"--data-path {prefix}\n" in script
        assert "--mock-data" not in script


def test_a_missing_dataset_is_refused_in_one_line(bench, results, tmp_path):
    out = bench("run", "--tag", "smoke", "--data-path", str(tmp_path / "nothing"))
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.exit_code == 2 and len(lines) == 1, out.output
    assert f"{tmp_path / 'nothing'}.bin is missing" in lines[0] and "nothing was submitted" in lines[0]
    assert not list(results.glob("nlp/*/*/"))
    assert bench("sweep", "--resume", "x", "--data-path", "y").exit_code == 2
