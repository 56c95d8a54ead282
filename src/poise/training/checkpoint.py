"""Checkpoints: HF-format safetensors weights, optimizer state, RNG state and data cursor.

RUN_DIR/checkpoints/step_XXXXXX/ holds `config.json` + `model.safetensors` (loadable by
transformers; under `model.lora` it holds the adapter alone, by its peft names, and `poise export`
merges it into the base), `optimizer.safetensors` (AdamW moments by parameter name) and `state.json`
(completed steps = data cursor, weights version, torch RNG, and the sizes of the other three
files). Nothing time- or path-dependent is written, so two runs with the same seed write
byte-identical checkpoints. Sharded, the owners write their own tensors into these files
(training/tensor_files.py: `create_tensor_file`, then `write_tensor_parts` by each) or stream them to
the saving device: the same bytes in every shard mode and split.

Verified by content: state.json also records each file's sha256 (`"sha256": {name: hexdigest}`,
by the file's path relative to the checkpoint directory, for every file a save wrote), checked on
resume and recovery with every file opened without following a symbolic link, and the weights
must be finite; a save that fails (a full disk) is one line and leaves the earlier checkpoints.

Durable: a checkpoint is written into `checkpoints/.tmp-step_XXXXXX-<pid>/`, every file
and the directory are fsynced, and only then is it renamed to `step_XXXXXX`; the `latest` marker
is replaced atomically the same way. A kill at any moment leaves the previous checkpoints intact
and at most a `.tmp-*` entry, which resume ignores and the next save removes. Resume takes the
newest `step_*` directory that verifies (`latest_checkpoint`), warning about each torn one it
skips; the marker is for people and tools, and one that names a path outside `checkpoints/` is
refused.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import shutil
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from poise import injection
from poise.errors import PoiseError
from poise.training.optim_state import place_state
from poise.training.tensor_files import Entry, optimizer_entries_of, safetensors_order, write_tensors

CHECKPOINT_FILES = ("config.json", "model.safetensors", "optimizer.safetensors", "state.json")
# An async run's checkpoint also holds the samples of the next step, made with the weights before
# the last update (exact staleness 1): what `--resume` of an async run needs (runtime/driver.py).
PENDING_SAMPLES = "pending_samples.jsonl"
MARKER = "latest"
PARTIAL_PREFIX = ".tmp-"  # an unfinished save (or deletion): never a checkpoint
STEP_DIR = re.compile(r"step_(\d{6,})")


@dataclass(frozen=True)
class TrainState:
    step: int  # completed steps; prompts of step `step` come next
    weights_version: int


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:06d}"


def save_checkpoint(run_dir: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    state: TrainState, extra: dict[str, bytes] | None = None,
                    optimizer_entries: list[Entry] | None = None,
                    weight_entries: list[Entry] | None = None,
                    owners_write: Callable[[Path], set[str]] | None = None) -> Path:
    """`write_checkpoint`, where a full disk (or any OSError) is one line (CheckpointSaveError, exit
    2) and costs nothing: the partial directory is removed, the checkpoints before it stay."""
    try:
        return write_checkpoint(run_dir, model, optimizer, state, extra, optimizer_entries, weight_entries,
                                owners_write)
    except OSError as e:
        raise save_failed(run_dir, state.step, e) from None
    except SafetensorError as e:  # safetensors' writer reports the OS error in its message only
        code = re.search(r"\(os error (\d+)\)", str(e))
        if code is None:
            raise
        raise save_failed(run_dir, state.step, OSError(int(code.group(1)), os.strerror(int(code.group(1))))) from None


class CheckpointSaveError(PoiseError):
    """A checkpoint could not be written; the message is the one line to print."""


def save_failed(run_dir: str | Path, step: int, error: OSError) -> CheckpointSaveError:
    """The one line for a save of checkpoint `step` that raised `error`, after removing what it wrote."""
    root = Path(run_dir) / "checkpoints"
    remove_partial(root)  # the space it took, and nothing a resume would look at
    intact = next((p.name for p in _step_dirs(root) if verify_checkpoint(p) is None), None)
    what = "disk full" if error.errno in (errno.ENOSPC, errno.EDQUOT) else \
        f"{error.strerror or type(error).__name__}{f' ({error.filename})' if error.filename else ''}"
    fix = "free space" if what == "disk full" else "fix that"
    if intact is None:
        return CheckpointSaveError(f"{what} while saving step {step}; no earlier checkpoint is saved; {fix} and start "
                                   "the run again")
    return CheckpointSaveError(f"{what} while saving step {step}; step {int(intact[5:])} is intact; {fix} and "
                               f"--resume {run_dir}")


def write_checkpoint(run_dir: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                     state: TrainState, extra: dict[str, bytes] | None = None,
                     optimizer_entries: list[Entry] | None = None,
                     weight_entries: list[Entry] | None = None,
                     owners_write: Callable[[Path], set[str]] | None = None) -> Path:
    """Write checkpoint `step_{state.step}` durably (temporary directory, fsync, rename) and point
    `latest` at it. Tensors are written as they are (no device-side copies). `extra`: more files
    the resumed run needs (an async run's next samples, PENDING_SAMPLES), written and verified
    with the others. `optimizer_entries`: the optimizer state as entries (sharded: most of them
    arrive from their owners as the file is written); default: `optimizer`'s own.
    `weight_entries`: the weights likewise (`cluster.shard: full`: each arrives from its owner
    when due, in safetensors' own order, so the file has `save_file`'s bytes); default: the
    model's trained parameters, held here. `owners_write(tmp)`: the owners write files of the
    temporary directory themselves, each its own tensors in place (sharded, every train device
    seeing the run directory); it returns the names of the files they wrote."""
    from poise.model.loading import save_hf_config, save_hf_weights
    from poise.model.lora import trained_parameters

    tmp = begin_checkpoint(run_dir, state.step)
    written = owners_write(tmp) if owners_write is not None else set()
    if "model.safetensors" in written:
        save_hf_config(model, tmp)
    elif weight_entries is None:
        save_hf_weights(model, tmp, dict(trained_parameters(model)))  # under LoRA: the adapter
    else:
        save_hf_config(model, tmp)
        write_tensors(tmp / "model.safetensors", safetensors_order(weight_entries))
    injection.current().checkpoint_part_written("model", state.step)
    if "optimizer.safetensors" not in written:
        if optimizer_entries is None:
            optimizer_entries = optimizer_entries_of(model, optimizer)
        write_tensors(tmp / "optimizer.safetensors", optimizer_entries)
    injection.current().checkpoint_part_written("optimizer", state.step)
    for name, data in (extra or {}).items():
        (tmp / name).write_bytes(data)
    sizes = {name: (tmp / name).stat().st_size for name in [*CHECKPOINT_FILES[:-1], *(extra or {})]}
    rng = torch.get_rng_state().tolist()
    (tmp / "state.json").write_text(json.dumps({"step": state.step, "weights_version": state.weights_version,
                                                "torch_rng": rng, "files": sizes, "sha256": file_digests(tmp)}) + "\n")
    injection.current().checkpoint_part_written("state", state.step)
    return commit_checkpoint(tmp, run_dir, state.step)


def begin_checkpoint(run_dir: str | Path, step: int) -> Path:
    """The temporary directory a checkpoint of `step` is written into (`commit_checkpoint` makes
    it one); what killed saves left is removed first."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    remove_partial(root)  # what a killed save or deletion left
    tmp = root / f"{PARTIAL_PREFIX}{checkpoint_dir(run_dir, step).name}-{os.getpid()}"
    tmp.mkdir()
    return tmp


def commit_checkpoint(tmp: Path, run_dir: str | Path, step: int) -> Path:
    """Fsync every file of `tmp` and the directory, rename it to `step_XXXXXX` and point `latest`
    at it; returns the checkpoint's path."""
    root = Path(run_dir) / "checkpoints"
    path = checkpoint_dir(run_dir, step)
    for entry in sorted(tmp.iterdir()):
        _fsync(entry)
    _fsync(tmp)
    if path.exists():  # a torn or older save of this step, past the checkpoint a resume started from
        _discard(path)
    os.rename(tmp, path)
    _fsync(root)
    _write_marker(root, path.name, step)
    return path


def prune_checkpoints(run_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` step_* directories (keep 0: delete nothing); returns those
    deleted. Called after a successful save, so the newest checkpoint is never one of them."""
    if keep <= 0:
        return []
    old = _step_dirs(Path(run_dir) / "checkpoints")[keep:]
    for path in old:
        _discard(path)
    return old


def prune_before_save(run_dir: str | Path, keep: int, step: int) -> list[Path]:
    """Before checkpoint `step` is written: delete the older checkpoints that `prune_checkpoints`
    would delete once it is, so a disk that a smaller `keep` was meant to relieve has their room for
    the save (pruning only after a save could never rescue a full disk). Kept whatever `keep`: the
    newest older checkpoint and the one the `latest` marker names (the last completed save), so a
    save that fails still leaves the run its resume point. Returns those deleted."""
    if keep <= 0:
        return []
    root = Path(run_dir) / "checkpoints"
    older = [p for p in _step_dirs(root) if int(STEP_DIR.fullmatch(p.name).group(1)) < step]
    kept = {p.name for p in older[:max(keep - 1, 1)]} | {_marked(root)}
    doomed = [p for p in older if p.name not in kept]
    for path in doomed:
        _discard(path)
    return doomed


def _marked(root: Path) -> str:
    """The name the `latest` marker holds ('' when it is missing, unreadable or not a plain file)."""
    try:
        with _open(root, MARKER) as f:
            return f.read(256).decode().strip()
    except (OSError, ValueError):
        return ""


def latest_checkpoint(run_dir: str | Path) -> Path:
    """The newest complete checkpoint of a run: the newest step_* directory that verifies.

    Torn ones (a save cut short on a filesystem that lost data, a file truncated by hand) are
    skipped with a one-line warning each; an empty, torn or missing `latest` marker only costs the
    scan. A marker naming anything outside `checkpoints/` is refused.
    """
    root = Path(run_dir) / "checkpoints"
    _check_marker(root)
    path, skipped = newest_intact_checkpoint(run_dir)
    if path is not None:
        for name, why in skipped:
            print(f"poise: warning: checkpoint {name} is incomplete ({why}); resuming from {path.name}",
                  file=sys.stderr)
        return path
    found = "; ".join(f"{name}: {why}" for name, why in skipped) or "none saved"
    raise PoiseError(f"no complete checkpoint in '{root}' to resume from ({found}); "
                     "start a fresh run (drop --resume, or set run.overwrite=true)")


def newest_intact_checkpoint(run_dir: str | Path) -> tuple[Path | None, list[tuple[str, str]]]:
    """The newest step_* directory of a run that verifies (None if none does), and each newer one
    skipped, with what is wrong with it (`verify_checkpoint`)."""
    skipped = []
    for path in _step_dirs(Path(run_dir) / "checkpoints"):
        problem = verify_checkpoint(path)
        if problem is None:
            return path, skipped
        skipped.append((path.name, problem))
    return None, skipped


def verify_checkpoint(path: Path, step: int | None = None) -> str | None:
    """None if checkpoint `path` is complete, else what is wrong with it, in a few words. `step`:
    the step it must describe (default: the one its `step_XXXXXX` name says).

    Real, by content: state.json parses and names this step, config.json parses, no file is a
    symbolic link (every file is opened without following one), each file has the sha256 that
    state.json records (checkpoints from before the hashes: the size), each safetensors file's
    header covers the file exactly, and every weight is finite.
    """
    try:
        if path.is_symlink():
            return f"{path.name} is a symbolic link"
        meta = json.loads(_read(path, "state.json"))
        if step is None:
            step = int(STEP_DIR.fullmatch(path.name).group(1))
        if not isinstance(meta, dict) or meta.get("step") != step or "torch_rng" not in meta:
            return "state.json does not describe this step"
        json.loads(_read(path, "config.json"))
        sizes, digests = meta.get("files", {}), meta.get("sha256", {})  # absent in older checkpoints
        if not isinstance(sizes, dict) or not isinstance(digests, dict):
            return "state.json's file list is malformed"
        names = [*CHECKPOINT_FILES[:-1], *(n for n in [*sizes, *digests] if n not in CHECKPOINT_FILES)]
        for name in dict.fromkeys(names):
            with _open(path, name) as f:
                size = os.fstat(f.fileno()).st_size
                if name in sizes and sizes[name] != size:
                    return f"{name} has {size} bytes, state.json says {sizes[name]}"
                if digests and name not in digests:
                    return f"{name} has no sha256 in state.json"
                if name in digests and hashlib.file_digest(f, "sha256").hexdigest() != digests[name]:
                    return f"{name} does not match its sha256 in state.json (its bytes changed)"
            if name.endswith(".safetensors"):
                _check_safetensors(path, name, size)
        bad = _non_finite(path / "model.safetensors")
        if bad is not None:
            return f"model.safetensors holds non-finite weights ({bad})"
    except FileNotFoundError as e:
        return f"{Path(e.filename).name if e.filename else 'a file'} is missing"
    except OSError as e:
        if e.errno == errno.ELOOP:
            return f"{Path(e.filename).name if e.filename else 'a file'} is a symbolic link"
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    except (ValueError, TypeError, AttributeError) as e:
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    return None


def file_digests(directory: Path) -> dict[str, str]:
    """The sha256 of every file written under `directory` but state.json (which records them), by
    its path relative to `directory`: whatever a save wrote (more optimizer files, extra files) is
    covered without being listed here."""
    out = {}
    for parent, dirs, files in os.walk(directory):  # os.walk does not follow symbolic links
        dirs.sort()
        for name in sorted(files):
            rel = Path(parent, name).relative_to(directory).as_posix()
            if rel != "state.json":
                with _open(directory, rel) as f:
                    out[rel] = hashlib.file_digest(f, "sha256").hexdigest()
    return out


def _open(root: Path, rel: str):
    """File `rel` under `root` (its path relative to it), opened for reading without following a
    symbolic link at any component (ELOOP, or ENOTDIR for a linked directory); `..` is refused."""
    parts = rel.split("/")
    if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"state.json names {len(rel)} characters that are not a file of the checkpoint")
    nofollow = os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | nofollow)
    try:
        for part in parts[:-1]:
            fd, parent = os.open(part, os.O_RDONLY | os.O_DIRECTORY | nofollow, dir_fd=fd), fd
            os.close(parent)
        try:
            file_fd = os.open(parts[-1], os.O_RDONLY | nofollow, dir_fd=fd)
        except OSError as e:
            raise type(e)(e.errno, e.strerror, rel) from None
    finally:
        os.close(fd)
    return os.fdopen(file_fd, "rb")


def _read(root: Path, rel: str) -> str:
    with _open(root, rel) as f:
        return f.read().decode()


def _non_finite(path: Path) -> str | None:
    """The first weight of a safetensors file that is NaN or infinite, named, else None; one tensor
    in memory at a time."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    return name
    except Exception as e:  # noqa: BLE001 - safetensors' own error type: the file is not what it says
        raise ValueError(f"{path.name} cannot be read ({type(e).__name__})") from None
    return None


def check_finite(step: int, stats: dict, run_dir: str | Path) -> None:
    """Stop the run with one line when step `step`'s loss or gradient norm is NaN or infinite: its
    update made (or will make) the weights non-finite, and no checkpoint may hold them."""
    bad = {k: stats[k] for k in ("loss", "grad_norm") if k in stats and not math.isfinite(stats[k])}
    if bad:
        root = Path(run_dir) / "checkpoints"
        intact = next((p.name for p in _step_dirs(root) if verify_checkpoint(p) is None), None)
        where = f"step {int(intact[5:])} is intact: --resume {run_dir} (with a lower algorithm.lr)" if intact \
            else "no checkpoint was saved"
        raise PoiseError(f"step {step}: the {' and '.join(f'{k} is {v}' for k, v in bad.items())} (non-finite); "
                         f"the run stopped before saving it; {where}")


def load_weights(path: Path, model: torch.nn.Module, names: set[str] | None = None) -> None:
    """Restore a checkpoint's weights into `model` in place: every parameter that training changes
    (under LoRA the adapter; the frozen base is the run's initial one) must be there. `names`:
    only these parameters, read one at a time into their (allocated) storage (`cluster.shard:
    full`: a train device reads its own run alone)."""
    from poise.model.lora import trained_parameters

    if names is not None:
        from safetensors import safe_open

        params = dict(model.named_parameters())
        with safe_open(str(path / "model.safetensors"), framework="pt") as f:
            missing = sorted(names - set(f.keys()))
            if missing:
                raise PoiseError(f"checkpoint '{path}' does not match the model: missing {missing}")
            with torch.no_grad():
                for name in sorted(names):
                    params[name].copy_(f.get_tensor(name))
        return
    weights = load_file(str(path / "model.safetensors"))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    trained = {name for name, _ in trained_parameters(model)}
    tied = {n for n in missing if n == "lm_head.weight" and getattr(model.config, "tie_word_embeddings", False)}
    missing = (set(missing) & trained) - tied
    if missing or unexpected:
        raise PoiseError(f"checkpoint '{path}' does not match the model: missing {sorted(missing)}, "
                         f"unexpected {sorted(unexpected)}")


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    owned: set[str] | None = None, weights: set[str] | None = None) -> TrainState:
    """Restore weights, optimizer moments and RNG in place; returns the saved TrainState.
    `owned`: the parameters whose optimizer state this process takes (sharded, or none on a device
    that does not train); default: every parameter's. Only those tensors are read. `weights`:
    likewise for the weights (`load_weights`' `names`); default: all of them."""
    load_weights(path, model, weights)
    from safetensors import safe_open

    params = dict(model.named_parameters())
    by_param: dict[str, dict[str, torch.Tensor]] = {}
    with safe_open(str(path / "optimizer.safetensors"), framework="pt") as f:
        for key in f.keys():
            name, field = key.split("::")
            if owned is None or name in owned:
                by_param.setdefault(name, {})[field] = f.get_tensor(key)
    for name, fields in by_param.items():  # onto the parameter's device and dtype, as AdamW keeps it
        optimizer.state[params[name]] = place_state(optimizer, params[name], fields)
    meta = json.loads((path / "state.json").read_text())
    torch.set_rng_state(torch.tensor(meta["torch_rng"], dtype=torch.uint8))
    return TrainState(step=meta["step"], weights_version=meta["weights_version"])


def has_optimizer_state(path: Path) -> bool:
    """Whether checkpoint `path` holds optimizer state (none before the first update)."""
    from safetensors import safe_open

    with safe_open(str(path / "optimizer.safetensors"), framework="pt") as f:
        return bool(list(f.keys()))


# --- the durable-write pieces ----------------------------------------------------------------
def remove_partial(root: Path) -> None:
    """Remove what killed saves and deletions left (`.tmp-*`): only one process saves a run."""
    for entry in root.glob(f"{PARTIAL_PREFIX}*"):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def _step_dirs(root: Path) -> list[Path]:
    """step_* directories, newest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := STEP_DIR.fullmatch(p.name)) and p.is_dir() and not p.is_symlink()]
    return [p for _, p in sorted(found, reverse=True)]


def _discard(path: Path) -> None:
    """Delete a directory so that a kill halfway leaves a `.tmp-*` entry, not a torn step_* one."""
    trash = path.parent / f"{PARTIAL_PREFIX}deleted-{path.name}-{os.getpid()}"
    os.rename(path, trash)
    shutil.rmtree(trash)


def _write_marker(root: Path, name: str, step: int) -> None:
    tmp = root / f"{PARTIAL_PREFIX}{MARKER}-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        injection.current().checkpoint_part_written("marker", step)
        os.fsync(f.fileno())
    os.replace(tmp, root / MARKER)
    _fsync(root)


def _check_marker(root: Path) -> None:
    """Refuse a `latest` marker that is a symbolic link or names anything but an entry of
    `checkpoints/` itself. Its content is never printed (a marker linked to another file would
    print that file)."""
    marker = root / MARKER
    try:
        with _open(root, MARKER) as f:
            name = f.read(256).decode().strip()
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK):
            raise PoiseError(f"'{marker}' is a symbolic link; it must be a file naming a step_XXXXXX directory: "
                             "delete it (resume finds the newest checkpoint without it)") from None
        return  # missing, unreadable: the scan finds the checkpoint without it
    except ValueError:  # not text
        return
    if "\0" in name:
        return  # zero-filled: what a crash can leave of a file whose size was written but not its data
    try:
        outside = (Path(name).is_absolute() or Path(name).name != name
                   or (root / name).resolve().parent != root.resolve())
    except (OSError, RuntimeError):  # a symlink loop
        outside = True
    if name and outside:
        raise PoiseError(f"'{marker}' names a path outside '{root}'; it must name a step_XXXXXX directory there: "
                         "delete the file (resume finds the newest checkpoint without it)")


def _check_safetensors(root: Path, name: str, size: int) -> None:
    """The header parses and its tensors end exactly at the end of the file."""
    with _open(root, name) as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{name} is truncated")
        n = struct.unpack("<Q", head)[0]
        if n > min(size - 8, 100_000_000):  # safetensors' own limit on a header
            raise ValueError(f"{name} is truncated or not safetensors")
        header = json.loads(f.read(n))
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end != size:
        raise ValueError(f"{name} has {size} bytes, its header describes {8 + n + end}")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)



# --- an async run's next samples ------------------------------------------------------------------
def encode_samples(samples: list, instance_of: dict) -> bytes:
    """One JSON line per sample (ids, tokens, logprobs: floats round-trip exactly through JSON),
    with the device that generated it."""
    from dataclasses import asdict

    lines = [json.dumps({**asdict(s), "instance": instance_of.get(tuple(s.sample_id))}) for s in samples]
    return ("\n".join(lines) + "\n").encode()


def decode_samples(path: Path) -> list[tuple[object, int | None]]:
    """(Sample, generating device) of each line written by `encode_samples`."""
    from poise.types import Sample

    out = []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        instance = row.pop("instance", None)
        row["sample_id"] = tuple(row["sample_id"])
        for key in ("prompt_ids", "token_ids", "logprobs"):
            row[key] = tuple(row[key])
        if row.get("token_versions") is not None:  # partial rollouts
            row["token_versions"] = tuple(row["token_versions"])
        out.append((Sample(**row), instance))
    return out
