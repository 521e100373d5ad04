"""Values reach the jobscript only as text: no value can run a command when the script runs."""



import pytest
import yaml

from nlp_bench.errors import SpecError


@pytest.mark.parametrize("key,value,message", [
    ("data_dir", "$(touch PWNED)", "cannot take literally"),
    ("data_dir", "/data; touch PWNED", "cannot take literally"),
    ("master_addr_suffix", "i`touch PWNED`", "cannot take literally"),
])
def test_site_values_written_verbatim_are_checked(site, key, value, message):
    from nlp_bench.spec.systems import load_system

    profile = site / "slurm" / "systems" / "juwels-booster.yaml"
    data = yaml.safe_load(profile.read_text())
    data[key] = value
    profile.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match=message):
        load_system("juwels-booster")

def test_tag_and_flag_names_are_checked(site):
    from nlp_bench.spec.benchmark import load_benchmark

    path = site / "benchmark" / "nlp.yaml"
    data = yaml.safe_load(path.read_text())
    data["tags"]["x$(touch PWNED)"] = data["tags"]["smoke"]
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="tag name"):
        load_benchmark()
    del data["tags"]["x$(touch PWNED)"]
    data["tags"]["smoke"]["train"]["lr; touch PWNED"] = 1
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecError, match="is not a Megatron flag name"):
        load_benchmark()
