"""Bad multi-turn input (env.*): one line, exit 2, before the run directory exists (so before Ray).
The environment class and its tools are checked where they run: the reward sandbox builds the
environment once at start-up, before any work."""

import textwrap

import pytest

from cli_checks import assert_one_line_error, poise  # tests/cli_checks.py

ENVS = '''
class NoStep:
    step = 3
    def reset(self, row, seed):
        return ""

class Fine:
    def reset(self, row, seed):
        return ""
    def step(self, action):
        return "", 0.0, True, {}
'''
TOOLS = '''
def untyped(x):
    """A tool without type hints."""
    return x
'''


@pytest.fixture
def project(tmp_path):
    (tmp_path / "envs.py").write_text(textwrap.dedent(ENVS))
    (tmp_path / "my_tools.py").write_text(textwrap.dedent(TOOLS))
    return tmp_path


@pytest.mark.parametrize("overrides, fragments", [
    (["env.name=nosuch.module:Env"], ("env.name", "no module named 'nosuch'", "module:Class")),
    (["env.name=missing.py:Env"], ("env.name", "file 'missing.py' does not exist")),
    (["env.name=envs.py:Nope"], ("env.name", "has no attribute 'Nope'")),
    (["env.name=envs.py:NoStep"], ("env.name", "NoStep.step is not callable", "reset(row, seed) and step(action)")),
    (["env.name=envs.py:Fine", "env.args={bogus: 1}"], ("env.name", "Fine() takes no arguments", "env.args")),
    (["env.name=tools", "env.args={tools: [my_tools:untyped], format: plain}"],
     ("tool untyped, parameter x", "no type hint", "give it a type hint")),
    (["env.name=tools", "env.args={tools: [nomodule:f]}"], ("env.args.tools[0]", "no module named 'nomodule'")),
    (["env.name=guess", "env.max_turns=0"], ("env.max_turns", "got 0", ">= 1")),
    (["env.name=noseparator"], ("env.name", "module:Class")),
    (["env.name=guess", "algorithm.dynamic_sampling=true"], ("algorithm.dynamic_sampling", "multi-turn episodes")),
])
def test_bad_episode_input_is_one_line_before_any_work(project, overrides, fragments):
    config = str((project.parent / "cfg.yaml"))
    with open(config, "w") as f:
        f.write("eval: {every: 0}\n")
    result = poise("train", config, *overrides, f"run.dir={project}/run", "pipeline.mode=sync", cwd=project)
    assert_one_line_error(result, *fragments)
    assert not (project / "run").exists()
