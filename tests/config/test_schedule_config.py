"""`resize.schedule` and `scale.schedule`: each malformed entry stops with one line naming the
entry's key, the value and the fix, word for word; a well-formed schedule reads as {step: what}."""

import pytest

from poise.config import ResizeConfig, ScaleConfig
from poise.config.split import Split
from poise.errors import ConfigError

RESIZE = [
    ([[1, 3]], "config key 'resize.schedule[0]': got [1, 3]; each entry is {at_step: N, split: [rollout, train]}"),
    ([{"at_step": 2}], "config key 'resize.schedule[0]': got {'at_step': 2}; each entry is "
                       "{at_step: N, split: [rollout, train]}"),
    ([{"at_step": 2, "split": [1, 3], "add": 1}], "config key 'resize.schedule[0]': got {'at_step': 2, "
     "'split': [1, 3], 'add': 1}; each entry is {at_step: N, split: [rollout, train]}"),
    ([{"at_step": 0, "split": [1, 3]}], "config key 'resize.schedule[0].at_step': got 0; must be an integer >= 1 "
                                        "(step 0 runs on cluster.split)"),
    ([{"at_step": True, "split": [1, 3]}], "config key 'resize.schedule[0].at_step': got True; must be an integer "
                                           ">= 1 (step 0 runs on cluster.split)"),
    ([{"at_step": 2.0, "split": [1, 3]}], "config key 'resize.schedule[0].at_step': got 2.0; must be an integer "
                                          ">= 1 (step 0 runs on cluster.split)"),
    ([{"at_step": 2, "split": [1, 3]}, {"at_step": 2, "split": [3, 1]}],
     "config key 'resize.schedule[1].at_step': got 2; two entries name the same step; keep one"),
]

SCALE = [
    ([{"after_step": 1}], "config key 'scale.schedule[0]': got {'after_step': 1}; each entry is "
                          "{after_step: N, add: K}"),
    ([{"at_step": 1, "add": 1}], "config key 'scale.schedule[0]': got {'at_step': 1, 'add': 1}; each entry is "
                                 "{after_step: N, add: K}"),
    ([{"after_step": -1, "add": 1}], "config key 'scale.schedule[0].after_step': got -1; must be an integer >= 0 "
                                     "(the step after whose weight sync the devices join)"),
    ([{"after_step": False, "add": 1}], "config key 'scale.schedule[0].after_step': got False; must be an integer "
                                        ">= 0 (the step after whose weight sync the devices join)"),
    ([{"after_step": 1, "add": 0}], "config key 'scale.schedule[0].add': got 0; must be an integer >= 1 "
                                    "(rollout instances that join)"),
    ([{"after_step": 1, "add": "2"}], "config key 'scale.schedule[0].add': got '2'; must be an integer >= 1 "
                                      "(rollout instances that join)"),
    ([{"after_step": 1, "add": 1}, {"after_step": 1, "add": 2}],
     "config key 'scale.schedule[1].after_step': got 1; two entries name the same step; merge them"),
]


@pytest.mark.parametrize("schedule, line", RESIZE)
def test_a_malformed_resize_schedule_entry_says_which_and_how_to_fix_it(schedule, line):
    with pytest.raises(ConfigError) as e:
        ResizeConfig(schedule=tuple(schedule))
    assert str(e.value) == line


@pytest.mark.parametrize("schedule, line", SCALE)
def test_a_malformed_scale_schedule_entry_says_which_and_how_to_fix_it(schedule, line):
    with pytest.raises(ConfigError) as e:
        ScaleConfig(schedule=tuple(schedule))
    assert str(e.value) == line


def test_a_schedule_reads_as_steps_in_order():
    resize = ResizeConfig(schedule=({"at_step": 4, "split": [3, 1]}, {"at_step": 2, "split": [1, 3]}))
    assert resize.scheduled() == {2: Split(1, 3), 4: Split(3, 1)}
    scale = ScaleConfig(schedule=({"after_step": 3, "add": 2}, {"after_step": 0, "add": 1}))
    assert scale.scheduled() == {0: 1, 3: 2}
    assert ResizeConfig().scheduled() == {} and ScaleConfig().scheduled() == {}
