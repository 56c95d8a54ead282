"""One local Ray instance for the whole test session (ray.init costs seconds here)."""

import pytest


@pytest.fixture(scope="session")
def ray_session():
    from poise.runtime.cluster import start_local  # first: it puts Ray in loopback-only mode

    import ray

    start_local(num_cpus=8)
    yield ray
    ray.shutdown()
