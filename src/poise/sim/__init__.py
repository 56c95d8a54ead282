"""Discrete-event simulator on a virtual clock (docs/design.md, "Layers").

Runs the driver loop with emulated rollout instances (continuous batching priced by
`poise.policy.cost`) and an emulated trainer, calling the same policy objects as the runtime.
No torch, ray or asyncio; time is virtual.

  scenario.py   ScenarioConfig, load_scenario(name_or_path, overrides), builtin_scenarios()
  workload.py   parametric (lognormal/Pareto mixes, phases, growth) and trace workloads
  driver.py     Simulation(sc, run_dir).run() -> Summary; writes config.yaml, events.jsonl,
                metrics.jsonl and summary.json through poise.runlog.RunLog
  partial.py    partial rollouts and over-provisioning: a step's generation phase in windows
  pricing.py    make_cost(sc): the scenario's cost model (built-in or a `poise profile` file)
  summary.py    StepRecord, Summary, measured_break_even: what a simulated run reports
  scenarios/    built-in scenarios (YAML)
"""

from poise.sim.driver import Simulation, Summary, simulate
from poise.sim.scenario import ScenarioConfig, builtin_scenarios, load_scenario

__all__ = ["Simulation", "Summary", "simulate", "ScenarioConfig", "builtin_scenarios", "load_scenario"]
