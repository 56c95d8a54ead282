"""Safetensors files written one tensor at a time: the layout of a checkpoint's tensor files, so a
file can be streamed from its owners (each value asked for when its bytes are due) or written in
place by every owner at once, with the bytes `safetensors.torch.save_file` writes of the same
tensors. Checkpoints (training/checkpoint.py) and the sharded states' checkpoint parts
(training/state/checkpoint_stream.py) write through these.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Callable

import torch

# One tensor of a streamed safetensors file: (name, dtype, shape, a function returning its value).
Entry = tuple[str, torch.dtype, tuple[int, ...], Callable[[], torch.Tensor]]
_DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.bfloat16: "BF16", torch.float16: "F16",
           torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL"}


def optimizer_entries_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[Entry]:
    """The optimizer state this process holds as entries `name::field`, in parameter order and
    field name order: the order of the optimizer file, whoever holds the state."""
    entries = []
    for name, p in model.named_parameters():
        for key, value in sorted(optimizer.state.get(p, {}).items()):
            value = torch.as_tensor(value)
            entries.append((f"{name}::{key}", value.dtype, tuple(value.shape), lambda v=value: v))
    return entries


# safetensors' dtype enum, in its order: `save_file` writes tensors by dtype, descending, then by name
_ENUM_ORDER = ("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64",
               "I64", "U64")


def safetensors_order(entries: list[Entry]) -> list[Entry]:
    """`entries` in the order `safetensors.torch.save_file` lays tensors out, so `write_tensors`
    writes its bytes exactly (a streamed file equals the one written from a held dict)."""
    return sorted(entries, key=lambda e: (-_ENUM_ORDER.index(_DTYPES[e[1]]), e[0]))


def tensor_layout(entries: list[Entry]) -> tuple[bytes, dict[str, tuple[int, int]], int]:
    """The safetensors file of `entries` (their values unused): its first bytes (the 8-byte header
    length, the JSON header padded to 8 bytes), each tensor's byte span in the file, its size."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape, _ in entries:
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        header[name] = {"dtype": _DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    start = 8 + len(text)
    spans = {name: (start + h["data_offsets"][0], start + h["data_offsets"][1])
             for name, h in header.items() if name != "__metadata__"}
    return struct.pack("<Q", len(text)) + text, spans, start + offset


def write_tensors(path: Path, entries: list[Entry]) -> None:
    """A safetensors file written one tensor at a time, in the order of `entries` (each value is
    asked for when its bytes are due, so a sharded save holds one tensor of a peer's state, not the
    whole state). The format (an 8-byte header length, the JSON header padded to 8 bytes, the data)
    is safetensors' own; `safetensors.safe_open` reads it. The bytes depend only on the entries, so
    every shard mode and number of train devices writes the same file."""
    head, _, _ = tensor_layout(entries)
    with open(path, "wb") as f:
        f.write(head)
        for name, dtype, shape, value in entries:
            f.write(_tensor_bytes(name, dtype, shape, value))


def create_tensor_file(path: Path, entries: list[Entry]) -> None:
    """`write_tensors`' file with its header and its full size but no tensor data yet: each owner
    then writes its own tensors into it, in place and in parallel (`write_tensor_parts`)."""
    head, _, size = tensor_layout(entries)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size)


def write_tensor_parts(path: Path, entries: list[Entry], names: set[str]) -> None:
    """The values of the entries in `names`, each at its place in `create_tensor_file`'s file of
    `entries` (the same bytes `write_tensors` would put there)."""
    _, spans, _ = tensor_layout(entries)
    with open(path, "r+b") as f:
        for name, dtype, shape, value in entries:
            if name in names:
                f.seek(spans[name][0])
                f.write(_tensor_bytes(name, dtype, shape, value))


def _tensor_bytes(name: str, dtype: torch.dtype, shape: tuple[int, ...], value) -> bytes:
    tensor = value().detach().to("cpu").contiguous()
    if tensor.dtype != dtype or tuple(tensor.shape) != shape:
        raise RuntimeError(f"tensor {name}: got {tensor.dtype} {tuple(tensor.shape)}, announced {dtype} {shape}")
    return tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
