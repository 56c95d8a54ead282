"""TrainerGroup's put-ahead (async): step k+1's micro-batches go into the object store while step k
trains, and step k+1's feed sends those references, unless it is fed other samples."""

import dataclasses

import pytest

from poise.config import load_train_config
from poise.policy.plan import plan_step
from poise.runtime.cluster import rendezvous_key
from poise.runtime.emulated import Emulation
from poise.runtime.trainer_group import TrainerGroup
from poise.runtime.worker import WorkerSpec, start_devices
from poise.types import Sample

pytestmark = pytest.mark.ray


def _emulated_device(tmp_path):
    """One emulated train device (torch-free), the kind an emulated run places."""
    cfg = load_train_config(None, ["cluster.compute=emulated", "cluster.devices=2", f"run.dir={tmp_path}",
                                   "emulation.time_scale=0.001"])
    spec = WorkerSpec(cfg.model, cfg.data.tokenizer, cfg.algorithm, cfg.rollout, 0, 1, True, "cpu",
                      Emulation.from_config(cfg).device_spec)
    return start_devices([0], lambda i: "DEFAULT", 1, 1, rendezvous_key(), spec, num_cpus=0)


def _sample(sid, tokens=3):
    return Sample(sid, (1, 2), tuple(range(tokens)), (-0.5,) * tokens, "stop", 0, 0.0, 1.0, 8)


def test_an_async_steps_micro_batches_are_put_while_it_generates(ray_session, tmp_path):
    device = _emulated_device(tmp_path)
    group = TrainerGroup(device, [0], advantage="grpo", streaming=False, loss_agg="token")
    plan = plan_step(1, prompts=3, group_size=2, micro_batch_size=2, mode="async")  # micro-batches = groups
    samples = {sid: _sample(sid) for sid in plan.sample_ids}

    group.expect_next(plan)
    group.arrive_ahead([samples[(1, 0, 0)], samples[(1, 0, 1)], samples[(1, 1, 0)]])  # group 1 not complete yet
    assert set(group.early_refs) == {((1, 0, 0), (1, 0, 1))}
    group.arrive_ahead([samples[(1, 1, 1)]])
    ahead = {ids: ref.hex() for ids, (ref, _) in group.early_refs.items()}
    assert set(ahead) == {((1, 0, 0), (1, 0, 1)), ((1, 1, 0), (1, 1, 1))}

    group.start_step(plan, version=2)
    regenerated = dataclasses.replace(samples[(1, 1, 1)], finish_time=2.0)  # generated again after a recovery
    fed = [samples[(1, 0, 0)], samples[(1, 0, 1)], samples[(1, 1, 0)], regenerated]  # group 2 still to come
    group.feed([(s, 1.0) for s in fed])
    assert group.batch_refs[(0, 0)].hex() == ahead[((1, 0, 0), (1, 0, 1))]  # put ahead: only a reference sent
    assert group.batch_refs[(0, 1)].hex() != ahead[((1, 1, 0), (1, 1, 1))]  # fed another sample: put again
    assert ray_session.get(group.batch_refs[(0, 1)])[1] == regenerated != samples[(1, 1, 1)]
    assert group.early_refs == {}
    ray_session.kill(device[0])
