import pytest

from poise.errors import ConfigError, PoiseError
from poise.schema import apply_overrides


def test_dotted_overrides_parse_values_as_yaml():
    data = apply_overrides({"a": {"b": 1}}, ["a.b=2", "a.c=[1, 2]", "x.y.z=hello", "f=3e-4"])
    assert data == {"a": {"b": 2, "c": [1, 2]}, "x": {"y": {"z": "hello"}}, "f": "3e-4"}


def test_overrides_index_into_lists():
    data = {"phases": [{"steps": 1}, {"steps": 2}]}
    apply_overrides(data, ["phases[1].steps=5", "phases[0]={steps: 9}"])
    assert data == {"phases": [{"steps": 9}, {"steps": 5}]}


@pytest.mark.parametrize("override, message", [
    ("phases[3].steps=1", r"index \[3\] is out of range; the list has 2 items"),
    ("phases[x].steps=1", "is not a list index"),
    ("phases.steps=1", "is not inside a section"),
    ("noequals", "is not key=value"),
])
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises((ConfigError, PoiseError), match=message):
        apply_overrides({"phases": [{"steps": 1}, {"steps": 2}]}, [override])


@pytest.mark.parametrize("overrides, message", [
    (["pipeline.mode=async", "pipeline.assist=true"], "pipeline.assist.*needs pipeline.mode=sync"),
    (["pipeline.mode=colocated", "pipeline.assist=true"], "pipeline.assist.*needs pipeline.mode=sync"),
    (["model.sft.threads=0"], "threads.*must be >= 1"),
    (["emulation.devices_per_process=-1"], "devices_per_process.*must be >= 0"),
])
def test_train_config_refuses_settings_that_cannot_apply(overrides, message):
    from poise.config import load_train_config

    with pytest.raises(ConfigError, match=message):
        load_train_config(None, overrides)


def test_scenario_refuses_assist_in_async():
    from poise.sim import load_scenario

    with pytest.raises(ConfigError, match="pipeline.assist.*needs pipeline.mode=sync"):
        load_scenario("streamrl-pipeline", ["pipeline.mode=async", "pipeline.assist=true"])
