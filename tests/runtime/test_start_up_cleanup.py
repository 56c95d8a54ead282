"""A run that fails while it starts leaves nothing running: not the reward sandbox's workers, not
the placement group, not a device actor (what `poise.train(...)` in a notebook would otherwise keep
until the kernel dies)."""

from __future__ import annotations

import time

import psutil
import pytest

from poise.config import load_train_config
from poise.errors import PoiseError
from poise.runtime import runtime as runtime_module  # Runtime.start: where the actors start
from poise.runtime.driver import train_disaggregated

from run_shapes import tiny_job

pytestmark = pytest.mark.ray


def _children() -> set[int]:
    """This process's live direct children (the reward sandbox's workers are among them)."""
    return {p.pid for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE}


def _alive_actors(ray) -> set[str]:
    return {a["ActorID"] for a in ray._private.state.actors().values() if a["State"] != "DEAD"}


def _gone_within(seconds: float, check) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return check()


def _cfg(tmp_path, *extra):
    return load_train_config(None, [*tiny_job(1), "cluster.devices=2", "cluster.split=[1,1]",
                                    f"run.dir={tmp_path / 'run'}", *extra])


def test_a_bad_profile_stops_the_reward_sandbox_it_started(tmp_path):
    profile = tmp_path / "profile.json"
    profile.write_text("not json")
    before = _children()
    with pytest.raises(PoiseError, match="cluster.profile"):
        train_disaggregated(_cfg(tmp_path, f"cluster.profile={profile}"))
    assert _gone_within(10, lambda: _children() <= before), _children() - before


def test_a_runtime_that_fails_while_it_starts_releases_everything(ray_session, tmp_path, monkeypatch):
    """The start fails once the devices' actors exist and the placement group is held (as when a
    device dies building its model)."""
    ray = ray_session
    started: list = []
    real_start = runtime_module.start_devices

    def recorded_start(*args, **kwargs):
        started.extend(real_start(*args, **kwargs))
        return list(started)

    def fail(*args, **kwargs):
        raise RuntimeError("injected start-up failure")

    monkeypatch.setattr(runtime_module, "start_devices", recorded_start)
    monkeypatch.setattr(runtime_module, "prewarm_rank_sets", fail)  # right after the actors start
    children = _children()
    with pytest.raises(RuntimeError, match="injected start-up failure"):
        train_disaggregated(_cfg(tmp_path))
    ids = {w._actor_id.hex() for w in started}
    assert len(ids) == 2 and ids <= set(ray._private.state.actors())  # both actors were started
    assert _gone_within(30, lambda: not ids & _alive_actors(ray)), ids & _alive_actors(ray)
    assert all(pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values())
    assert _gone_within(10, lambda: _children() <= children), _children() - children
