"""Starting or joining Ray, and the job's device pool (one placement group, a bundle per device).

Without `cluster.address` Poise starts a local Ray (dashboard off, loopback only, one logical CPU
per device so a 2-core machine can host 4-64 CPU devices). With it, Poise joins the cluster, and
a cluster that does not answer is a clear error within `connect_timeout_s`, never a hang.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from poise import interrupt
from poise.config import ClusterConfig
from poise.errors import PoiseError


def _check_address_answers(address: str, timeout_s: float) -> None:
    """A TCP connect with a deadline: ray.init on a dead address can block far longer."""
    host, _, port = address.rpartition(":")
    if address.startswith("ray://") or not port.isdigit():
        return  # let Ray parse other address forms
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=min(timeout_s, 10.0)):
            pass
    except OSError as e:
        raise PoiseError(f"cluster.address '{address}' does not answer ({e.strerror or e}); start the cluster "
                         "(`ray start --head`) or drop cluster.address to run a local Ray") from None


@contextlib.contextmanager
def _output_to(log: Path | None) -> Iterator[None]:
    """Ray's start-up lines ("Token authentication is enabled ...", which stays on) go to the run's
    log file, not the console: this process's stdout and stderr point there while Ray starts, and
    the Ray services started meanwhile keep writing there. Actor output reaches the console after."""
    if log is None:
        yield
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with open(log, "ab") as f:
            os.dup2(f.fileno(), 1)
            os.dup2(f.fileno(), 2)
            yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def connect(cfg: ClusterConfig, log: Path | None = None) -> None:
    """ray.init for this job, once per process (a test session shares one local Ray); Ray's own
    start-up output goes to `log` (RUN_DIR/ray.log) if given."""
    with interrupt.held(), _output_to(None if ray.is_initialized() else log):  # Ctrl-C: after, not inside
        warning = _connect(cfg)
    if warning:
        print(f"poise: warning: {warning}", file=sys.stderr)


def _connect(cfg: ClusterConfig) -> str | None:
    """Start or join Ray; returns a warning for the console, if any."""
    if cfg.address:
        _check_address_answers(cfg.address, cfg.connect_timeout_s)
        host = cfg.address.rpartition(":")[0].removeprefix("ray://")
        if host not in ("127.0.0.1", "localhost", "::1") and \
                os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == "0":
            raise PoiseError(f"cluster.address '{cfg.address}' is another host, but this process runs Ray in "
                             "loopback-only mode; export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1 to join it")
    if ray.is_initialized():
        return None
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if cfg.address:
        error: list[BaseException] = []

        def join() -> None:
            try:
                ray.init(address=cfg.address, include_dashboard=False, log_to_driver=False)
            except BaseException as e:  # surfaced below as a PoiseError
                error.append(e)

        thread = threading.Thread(target=join, daemon=True)
        thread.start()
        thread.join(cfg.connect_timeout_s)
        if thread.is_alive() or error:
            why = str(error[0]).splitlines()[0] if error else f"no answer within {cfg.connect_timeout_s:g} s"
            raise PoiseError(f"cannot join Ray cluster at '{cfg.address}': {why}; check the address or drop "
                             "cluster.address to run a local Ray")
        if not token_auth():
            return (f"joined the Ray cluster at '{cfg.address}' without token authentication: anyone who reaches "
                    "its ports can run code in this job; start it with RAY_AUTH_MODE=token "
                    "(https://docs.ray.io/en/latest/ray-security/token-auth.html)")
        return None
    devices = cfg.devices + cfg.reserve_devices
    if cfg.device == "cuda":
        check_gpu_count(cfg, detected_gpus())
    # Ray counts the GPUs itself: telling it `devices` would pass the placement check and fail later
    # in every actor with "no CUDA GPUs" / "invalid device ordinal"
    start_local(num_cpus=max(devices, os.cpu_count() or 1))
    return None


def detected_gpus() -> int | None:
    """The GPUs a local Ray detects on this machine (NVIDIA's count, limited by CUDA_VISIBLE_DEVICES),
    or None where this Ray cannot say (the placement check then reports the shortfall)."""
    try:
        from ray._private.accelerators import get_accelerator_manager_for_resource

        manager = get_accelerator_manager_for_resource("GPU")
        count = manager.get_current_node_num_accelerators()
        visible = manager.get_current_process_visible_accelerator_ids()
    except (ImportError, AttributeError):  # a Ray without this (private) interface
        return None
    return count if visible is None else min(count, len(visible))


def gpus_needed(cfg: ClusterConfig) -> int:
    """Whole GPUs the job's devices and reserve take at `cluster.gpus_per_device` each."""
    return math.ceil((cfg.devices + cfg.reserve_devices) * cfg.gpus_per_device - 1e-9)


def check_gpu_count(cfg: ClusterConfig, detected: int | None) -> None:
    """One line, before any actor starts, if this machine has fewer GPUs than the job needs."""
    need = gpus_needed(cfg)
    if detected is None or detected >= need:
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
    share = cfg.gpus_per_device
    fix = (f"lower cluster.devices, or share GPUs with cluster.gpus_per_device="
           f"{max(detected, 1) / (cfg.devices + cfg.reserve_devices):.3g}" if detected else
           "install NVIDIA's driver or use cluster.device=cpu")
    raise PoiseError(f"cluster.devices={cfg.devices} + reserve_devices={cfg.reserve_devices} at "
                     f"gpus_per_device={share:g} need {need} GPUs, but Ray detects {detected} on this "
                     f"machine{where}; {fix}")


def collective_backend(device: str, gpus_per_device: float) -> str:
    """torch.distributed's backend: NCCL between whole GPUs; gloo on CPU and where devices share a
    GPU (NCCL refuses two ranks on one GPU; gloo moves CUDA tensors through the host)."""
    return "nccl" if device == "cuda" and gpus_per_device >= 1 else "gloo"


def device_bundle(cfg: ClusterConfig) -> dict[str, float]:
    """One device's placement-group bundle."""
    return {"GPU": cfg.gpus_per_device, "CPU": 1} if cfg.device == "cuda" else {"CPU": 1}


def token_auth() -> bool:
    """Whether this process talks to Ray with token authentication: having joined a cluster
    without it means that cluster accepts anyone."""
    try:
        from ray._raylet import AuthenticationMode, get_authentication_mode
    except ImportError:  # a Ray from before token authentication
        return False
    return get_authentication_mode() == AuthenticationMode.TOKEN


def start_local(num_cpus: int, num_gpus: int = 0) -> None:
    if ray.is_initialized():
        return
    ray.init(num_cpus=num_cpus, num_gpus=num_gpus or None, include_dashboard=False, log_to_driver=True,
             configure_logging=False,
             runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}})


@dataclass
class DevicePool:
    """The job's placement group: bundle i is device i, held for the whole job."""

    group: PlacementGroup
    devices: int

    def strategy(self, device: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(placement_group=self.group, placement_group_bundle_index=device)

    def release(self) -> None:
        remove_placement_group(self.group)


def _place(cfg: ClusterConfig, count: int, what: str, fix: str) -> DevicePool:
    """A placement group of `count` one-device bundles, or one line naming `what` and the `fix`."""
    bundle = device_bundle(cfg)
    group = placement_group([dict(bundle) for _ in range(count)], strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=cfg.connect_timeout_s)
    if not ready:
        remove_placement_group(group)
        raise PoiseError(f"could not place {what} within {cfg.connect_timeout_s:g} s{fix}")
    return DevicePool(group, count)


def device_pool(cfg: ClusterConfig) -> DevicePool:
    """Reserve one bundle per device, or fail clearly if the cluster cannot hold them."""
    resource = "GPU" if cfg.device == "cuda" else "CPU"
    have = ray.cluster_resources().get(resource, 0)
    need = cfg.devices * (cfg.gpus_per_device if cfg.device == "cuda" else 1)
    if have < need - 1e-9:
        share = f" at gpus_per_device={cfg.gpus_per_device:g} ({need:g} GPUs)" if cfg.device == "cuda" else ""
        raise PoiseError(f"cluster.devices={cfg.devices}{share} but the Ray cluster has {have:g} {resource}s; "
                         f"lower cluster.devices or add nodes")
    return _place(cfg, cfg.devices, f"{cfg.devices} devices",
                  " (other jobs hold the resources?); lower cluster.devices or free the cluster")


def reserve_pool(cfg: ClusterConfig) -> DevicePool | None:
    """The reserve (`cluster.reserve_devices`): a second placement group, bundle i is device
    cluster.devices + i, from which devices join the job as rollout instances (runtime/scale.py)."""
    if not cfg.reserve_devices:
        return None
    resource = "GPU" if cfg.device == "cuda" else "CPU"
    return _place(cfg, cfg.reserve_devices, f"cluster.reserve_devices={cfg.reserve_devices} more {resource}s",
                  "; lower cluster.reserve_devices or add nodes")


def rendezvous_key() -> str:
    """A fresh key under which device 0 of a new torch.distributed world publishes its store's
    address (runtime/worker.py join_rendezvous); every start of the actors gets its own."""
    import uuid

    return f"poise-rendezvous-{uuid.uuid4().hex}"


def interface_of(address: str) -> str:
    """The network interface that holds `address` (gloo's GLOO_SOCKET_IFNAME); loopback for a
    local Ray."""
    import fcntl
    import ipaddress
    import struct

    if ipaddress.ip_address(address).is_loopback:
        return "lo"
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
            except OSError:
                continue
        if socket.inet_ntoa(raw[20:24]) == address:
            return name
    raise PoiseError(f"Ray reports this node's address as {address}, but no network interface holds it; "
                     "set GLOO_SOCKET_IFNAME to the interface to use")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
