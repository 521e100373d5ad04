"""The Neuron (Trainium) profiles as today's Neuron runs them: no XLA_USE_BF16/XLA_DOWNCAST_BF16 (torch-xla
still honours them by storing every fp32 tensor, master weights and Adam moments included, as bf16), bf16
training chosen by the profile where a tag meets the system, the compiler's flags exported, and the job's
provenance recording the PJRT_/NEURON_/XLA_ variables and the package versions it found."""

import importlib.metadata

import pytest

from nlp_bench.errors import LayoutError
from nlp_bench.spec.benchmark import load_benchmark
from nlp_bench.spec.systems import known_systems, load_system

XLA_PROFILES = [name for name in known_systems() if load_system(name).backend == "xla"]

def _neuron(name: str) -> bool:
    """A profile of Neuron devices (a CPU stand-in with backend xla is not one)."""
    return "NeuronCore" in load_system(name).device_name

def test_the_neuron_profiles_are_all_checked():
    assert {"trn1", "trn2", "trn3"} <= {name for name in XLA_PROFILES if _neuron(name)}

def test_a_sweep_asking_another_precision_of_a_bf16_profile_is_refused_for_that_point():
    with pytest.raises(LayoutError, match="system 'trn1' trains in bf16 .*not fp16"):
        load_benchmark().point("13", "trn1", train={"fp16": True, "bf16": False})

def test_trn3_figures_follow_from_trainium3s_published_ones():
    trn3, trn2 = load_system("trn3"), load_system("trn2")
    assert trn3.devices_per_node == 16 * 8 // 2  # 16 chips of 8 NeuronCore-v4 at lnc=2
    assert (trn3.peak_tflops, trn3.peak_fp8_tflops, trn3.device_memory_gib) == (671 / 4, 2517 / 4, 144 / 4)
    assert (trn2.peak_tflops, trn2.peak_fp8_tflops) == (667 / 4, 1299 / 4)
    for system in (trn2, trn3):
        for key in ("peak_tflops", "peak_fp8_tflops", "device_memory_gib", "memory_bandwidth_gbps",
                    "inter_node_gbps", "intra_node_gbps", "precision", "neuron_cc_flags"):
            assert system.sources.get(key), f"{system.name}: {key} has no source"

NATIVE = [name for name in known_systems() if load_system(name).backend == "neuron"]

def test_a_native_neuron_profile_is_shipped_beside_the_xla_ones():
    assert NATIVE == ["trn2-native"]
    assert load_system("trn2-native").device == "neuron" and not load_system("trn2-native").compile_command

@pytest.mark.parametrize("installed,status", [(None, "warn"), ("2.9.0.2.11", "warn"), ("2.14.3.0", "ok")])
def test_the_native_backend_check_reads_torch_neuronx_from_its_metadata(monkeypatch, installed, status):
    from nlp_bench.app import doctor

    def version(name):
        if installed is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed

    monkeypatch.setattr(importlib.metadata, "version", version)
    (check,) = doctor._native_neuron(load_system("trn2-native"))
    assert check.status == status
    if installed == "2.9.0.2.11":
        assert "torch-neuronx 2.9.0.2.11, the torch-xla based one," in check.detail
    assert doctor._native_neuron(load_system("trn2")) == []
