import pytest

from nlp_bench.errors import SpecError
from nlp_bench.spec.systems import known_systems, load_system


def test_systems():
    assert {"juwels-booster", "jureca-dc", "local", "local-slurm", "jupiter", "h100-8"} <= set(known_systems())
    for name in known_systems():  # every shipped profile loads
        assert load_system(name).devices_per_node >= 1
    booster = load_system("juwels-booster")
    assert booster.devices_per_node == 4 and booster.device_memory_gib == 40
    assert booster.sbatch["partition"] == "booster" and booster.sbatch["cpus-per-task"] == 48
    local = load_system("local")
    assert local.backend == "gloo" and local.executor == "local" and local.launcher == "direct"
    with pytest.raises(SpecError, match=r"unknown system 'juwels-boster' \(did you mean 'juwels-booster'\?\)"):
        load_system("juwels-boster")
