"""A scenario's cost model (policy/cost.py): the built-in one, or a `poise profile` file
(`cost.profile`), placed on the scenario's device types when it has some. Torch-free.
"""

from __future__ import annotations

from pathlib import Path

from poise.policy.cost import CostModel
from poise.sim.scenario import ScenarioConfig


def make_cost(sc: ScenarioConfig, roles: tuple[str, str] | None = None) -> CostModel:
    """The scenario's cost model; reads `cost.profile` JSON if one is named. With device types,
    each role is priced on its type and weight sync on the link between their groups: `roles`
    (rollout type, train type), default the scenario's (`ScenarioConfig.roles`; unplaced when
    split: auto leaves them to the device planner)."""
    cost = _written_cost(sc)
    fleet, roles = sc.fleet(), roles or sc.roles()
    return fleet.place(cost, *roles) if fleet is not None and roles is not None else cost


def _written_cost(sc: ScenarioConfig) -> CostModel:
    if sc.cost.profile:
        import json

        from poise.errors import PoiseError

        path = Path(sc.cost.profile)
        if not path.is_file():
            raise PoiseError(f"cost.profile '{path}' does not exist; write one with `poise profile`")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise PoiseError(f"cost.profile '{path}' is not JSON ({e}); rerun `poise profile`") from None
        return CostModel.from_profile(data, sc.cost)
    return CostModel(sc.cost)
