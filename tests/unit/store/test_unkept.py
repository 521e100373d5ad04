"""A state a reader worked out and could not write: held for the process only inside unkept.shown(), and only
while state.json is unchanged; a writer's refused write stays an error."""

import pytest

from nlp_bench.store import point_folder, states, unkept
from nlp_bench.store.files import Unwritable, write_object
from nlp_bench.store.point_folder import PointDir


@pytest.fixture
def refusing(tmp_path, monkeypatch):
    """A point with a RUNNING job whose state.json the file system then refuses to write."""
    point = PointDir(tmp_path / "p")
    point.path.mkdir()
    point.begin_attempt("local", state=states.RUNNING, job_id="7")

    def refuse(path, data, durable=True):
        raise Unwritable(f"cannot write {path}: Read-only file system")

    monkeypatch.setattr(point_folder, "write_object", refuse)
    return point


def test_a_writer_still_fails(refusing):
    with pytest.raises(Unwritable, match="Read-only file system"):
        refusing.update(states.COMPLETED)
    assert refusing.attempt().state == states.RUNNING


def test_a_reader_shows_what_it_could_not_keep_until_the_file_changes(refusing):
    with unkept.shown() as said:
        refusing.update(states.COMPLETED, exit_code=0)
    assert refusing.attempt().state == states.COMPLETED and refusing.attempt().exit_code == 0
    assert list(said.values()) == [f"cannot write {refusing.path / 'state.json'}: Read-only file system "
                                   "(the state COMPLETED is shown, not kept)"]
    record = refusing.state()
    record.current.state = states.FAILED
    write_object(refusing.path / "state.json", record.to_dict())  # a writer got there: its record wins
    assert refusing.attempt().state == states.FAILED
