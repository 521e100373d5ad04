"""Mixture-of-experts iteration lines of Megatron-LM (core_v0.20.0's training_log: each tracked aux loss is a
`{key}: {:.6E}` field beside `lm loss`, MTP's as `mtp_1 loss`) and Megatron-Bridge (the same fields, a
timestamp without microseconds): the aux losses are record fields and `bench parse --json` keys, and the
timing fields are read as in a dense run. The fixture log megatron_moe.log is written with those format
strings (a DeepSeek-V3-like run: per-sequence aux loss, z-loss, one MTP depth)."""

import json

import pytest
from click.testing import CliRunner
from conftest import DATA

from nlp_bench.analysis import metrics, parsers
from nlp_bench.analysis.formats import megatron
from nlp_bench.analysis.formats.megatron import parse_line
from nlp_bench.analysis.log_record import AUX_LOSSES, Record
from nlp_bench.cli.parse_commands import bench_parse

MOE_LOG = DATA / "logs" / "megatron_moe.log"
_one_by_one = megatron._megatron_record


def _line(losses: dict[str, float], stamp: str = "[2026-05-01 10:00:00.123456]", iteration: int = 10) -> str:
    """A Megatron-LM core_v0.20.0 iteration line with these entries of total_loss_dict after `lm loss`."""
    text = f" {stamp} iteration {iteration:8d}/{100:8d} | consumed samples: {iteration * 64:12d} |"
    text += f" elapsed time per iteration (ms): {2000.0:.1f} | throughput per GPU (TFLOP/s/GPU): {250.0:.1f} |"
    text += f" learning rate: {1e-4:.6E} | global batch size: {64:5d} |"
    for key, value in {"lm loss": 9.5, **losses}.items():
        text += f" {key}: {value:.6E} |"
    return text + " loss scale: 1.0 | grad norm: 2.000 | number of skipped iterations:   0 | number of nan iterations:   0 |"


def test_every_aux_loss_megatron_prints_is_a_record_field():
    record = parse_line(_line({"load_balancing_loss": 1.05, "seq_load_balancing_loss": 0.5,
                               "global_load_balancing_loss": 0.25, "z_loss": 3.2e-3, "mtp_1 loss": 9.9}), True)
    assert (record.load_balancing_loss, record.seq_load_balancing_loss, record.global_load_balancing_loss,
            record.z_loss, record.mtp_loss) == (1.05, 0.5, 0.25, 3.2e-3, 9.9)
    assert (record.iteration, record.iteration_time_s, record.loss, record.tflops_per_gpu) == (10, 2.0, 9.5, 250.0)


def test_a_dense_line_has_no_aux_loss_and_unknown_snake_case_keys_are_left_out():
    dense = parse_line(_line({}), True)
    assert all(getattr(dense, name) is None for name in AUX_LOSSES)
    # the tracker's percentiles (`{name}_p50`, printed `.2f`) and MTP's deeper depths are no record field
    record = parse_line(_line({"load_balancing_loss": 1.0, "load_balancing_loss_p50": 0.9, "mtp_2 loss": 7.0}), True)
    assert record.load_balancing_loss == 1.0 and record.mtp_loss is None and record.loss == 9.5


def test_megatron_bridge_line_with_aux_losses():
    """Megatron-Bridge's training_log prints `[%Y-%m-%d %H:%M:%S]` and the same loss loop."""
    text = "\n".join(_line({"load_balancing_loss": 1.0 + k / 100, "z_loss": 1e-3}, "[2026-05-01 10:00:00]", 10 * k)
                     for k in range(1, 4)) + "\n"
    parsed = parsers.parse(text)
    assert parsed.format == "megatron-current"
    assert [r.load_balancing_loss for r in parsed.records] == [1.01, 1.02, 1.03]
    assert {r.z_loss for r in parsed.records} == {1e-3}


def test_the_fixture_log_through_the_compiled_layout_gives_each_line_its_own_record(monkeypatch):
    """20 lines of one shape: read through a compiled layout, which must give what the field-by-field
    reading of each line gives (and the memory report between them is no record)."""
    read_alone = []
    monkeypatch.setattr(megatron, "_megatron_record", lambda *a: read_alone.append(a) or _one_by_one(*a))
    parsed = parsers.parse_log(MOE_LOG)
    assert len(read_alone) < 5, "the aux-loss keys must fit a compiled layout, not send every line field by field"
    monkeypatch.undo()
    assert parsed.format == "megatron-current" and parsed.warnings == {}
    lines = [line for line in MOE_LOG.read_text().splitlines() if " iteration " in line]
    assert parsed.records == [parse_line(line, True) for line in lines]
    assert [r.iteration for r in parsed.records] == list(range(5, 105, 5))
    first = parsed.records[0]
    assert (first.seq_load_balancing_loss, first.z_loss, first.mtp_loss, first.loss) == (1.2, 4e-3, 11.2, 11.0)
    assert first.load_balancing_loss is None and first.iteration_time_s == pytest.approx(3.1)


def test_bench_parse_json_has_the_aux_losses_in_records_and_summary():
    result = CliRunner().invoke(bench_parse, [str(MOE_LOG), "--json", "--seq-length", "4096"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    view = out["records"][-1]
    assert (view["seq_load_balancing_loss"], view["z_loss"], view["mtp_loss"]) == \
        pytest.approx((1.2 - 0.19, 0.004 - 0.0019, 11.2 - 1.9))
    assert "load_balancing_loss" not in view, "a loss the log does not print is no key"
    assert out["summary"]["aux_losses"] == {"seq_load_balancing_loss": view["seq_load_balancing_loss"],
                                            "z_loss": view["z_loss"], "mtp_loss": view["mtp_loss"]}
    assert out["summary"]["warmup_excluded"] == 1  # the first interval (3.1 s) against ~2.4 s: timing as before
    assert out["summary"]["tokens_per_s"]["mean"] > 0


def test_a_dense_log_json_keeps_its_keys():
    records = parsers.parse_log(DATA / "logs" / "megatron_current.log").records
    views, summary = metrics.steady_summary(records, 2048)
    assert set(views[0]) == {"iteration", "iteration_time_s", "global_batch_size", "seq_length", "tokens_per_s",
                             "samples_per_s", "tflops_per_gpu", "mfu_percent", "loss"}
    assert summary["aux_losses"] == {}
    assert not set(AUX_LOSSES) & set(records[0].to_dict()), "a dense run's stored records keep their keys"
    stored = parsers.parse_log(MOE_LOG).records[0].to_dict()
    assert (stored["seq_load_balancing_loss"], stored["z_loss"], stored["mtp_loss"]) == (1.2, 4e-3, 11.2)
    assert "load_balancing_loss" not in stored


def test_the_trainer_line_with_load_balancing_loss_stays_the_nlp_bench_variant():
    """The built-in trainer spells the aux loss as Megatron does, so one parser reads both."""
    line = (" iteration       10/      20 | consumed samples:          160 | elapsed time per iteration (s): 0.5000 |"
            " learning rate: 1.000E-04 | global batch size:    16 | lm loss: 9.000000E+00 |"
            " load_balancing_loss: 1.010000E+00 | loss scale: 1.0 | grad norm: 1.000 |"
            " number of skipped iterations:   0 | number of nan iterations:   0 | samples per second: 32.000 |"
            " tokens per second: 4096.0 | TFLOPs: 0.01 |")
    parsed = parsers.parse(line + "\n")
    assert parsed.format == "nlp-bench" and parsed.records[0].load_balancing_loss == 1.01


@pytest.mark.timeout(20)
@pytest.mark.parametrize("unit", [" a_b", "a_", "_1", " x_y loss", "a_b_" * 3 + " "])
def test_snake_case_keys_are_read_in_linear_time(unit):
    """Keys with `_` are looked for at a field's end: a 64 KB field of them must not be scanned again from
    every position (a quadratic scan of it would take minutes, far past the timeout)."""
    body = (unit * (60_000 // len(unit)))
    for field in (body + ": 1.0 |", body + "!: 1.0 |", "z_loss" + body + ": 1 |"):
        record = parse_line(" iteration 10/ 100 | elapsed time per iteration (ms): 1000.0 |" + field, True)
        assert record is not None and record.iteration_time_s == 1.0


def test_every_format_makes_whole_records():
    """Records made by tuple.__new__ (the compiled paths) get no defaults: each format must give every field
    the record has now that the aux losses lengthened it, or reading one fails (NeMo 2's did)."""
    nemo2 = "".join(f"Training epoch 0, iteration {i}/99 | lr: 1.5e-05 | global_batch_size: 128 | global_step: {i} | "
                    f"reduced_train_loss: 7.5 | train_step_timing in s: 4.7 | consumed_samples: {128 * (i + 1)}\n"
                    for i in range(20))
    texts = [(log.name, log.read_text()) for log in sorted((DATA / "logs").glob("*.log"))] + [("nemo2", nemo2)]
    for name, text in texts:
        parsed = parsers.parse(text)
        assert {len(r) for r in parsed.records} == {len(Record._fields)}, name
        views, summary = metrics.steady_summary(parsed.records, 2048)
        assert len(views) == len(parsed.records) and isinstance(summary["aux_losses"], dict), name
