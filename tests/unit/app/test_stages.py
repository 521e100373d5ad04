"""A run as named stages (app.stages), each a function of the record it is given, checked in-process with
nothing launched: render makes every script in memory and writes nothing; write makes the run and hands on the
point records it wrote; analyse works from those records without opening point.json again."""

import json

from conftest import record_job
from stage_orders import PREDICTED, smoke_order

from nlp_bench.app.stage_records import Done, Finished, PointOnDisk, Written
from nlp_bench.app.stages import analyse_run, render_scripts, write_run
from nlp_bench.store import states
from nlp_bench.store.runs import find_run


def test_render_makes_each_point_in_memory_and_writes_nothing(site, tmp_path):
    order = smoke_order(tmp_path / "results", hang_timeout_s=77)
    (one,) = render_scripts(order).points
    point = order.points[0]
    assert one.record.data == point.to_dict() and one.record.id == point.id
    assert one.jobscript.startswith("#!") and f"point {point.id}\n" in one.jobscript
    assert 'NLP_BENCH_HANG_TIMEOUT:-77}' in one.jobscript
    assert one.compile_script is None and one.prediction == PREDICTED
    assert not (tmp_path / "results").exists()

def test_write_hands_launch_the_records_it_wrote(site, tmp_path):
    rendered = render_scripts(smoke_order(tmp_path / "results", dry_run=False))
    written = write_run(rendered)
    assert isinstance(written, Written) and written.root == tmp_path / "results" and not written.again
    (point,) = written.points
    assert point.record is rendered.points[0].record
    assert point.folder == written.run.path / point.record.id and point.folder.is_dir()

def test_analyse_takes_a_finished_run_folder_and_its_records(site, tmp_path, point_reads, capsys):
    """A point measured elsewhere (its log and state written here): the table from the record handed in."""
    order = smoke_order(tmp_path / "results")
    (one,) = render_scripts(order).points
    write_run(render_scripts(order))
    (run,) = (tmp_path / "results" / "nlp").iterdir()
    folder = run / one.record.id
    (folder / "job.out").write_text(
        "[default0]: iteration        1/       1 | elapsed time per iteration (s): 0.2500 | global batch size:     4 |"
        " lm loss: 8.0E+00 |\n")
    record_job(folder, states.COMPLETED, executor="local", job_id="1", exit_code=0)
    written = Written(find_run(tmp_path / "results", run.name), tmp_path / "results", order.executor, order.options,
                      (PointOnDisk(folder, one.record),))
    assert analyse_run(Finished(written, 0)) == Done(0)
    assert "2048.00" in capsys.readouterr().out
    assert point_reads == []
    assert json.loads((folder / "result.json").read_text())["summary"]["tokens_per_s"] == 2048.0
