"""One local Ray instance for the whole test session (ray.init costs seconds here)."""

import pytest


@pytest.fixture(scope="session")
def ray_session():
    import ray

    from poise.runtime.cluster import start_local

    start_local(num_cpus=8)
    yield ray
    ray.shutdown()
