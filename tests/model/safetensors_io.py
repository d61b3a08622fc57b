"""Minimal safetensors reader/writer on numpy, for the PyTorch parity tests.

The `safetensors` Python package is not installable here, and the format is small enough that
carrying our own reader keeps the tests dependent only on numpy (and torch for the reference).

Layout: an 8-byte little-endian unsigned header length N, then N bytes of UTF-8 JSON mapping
each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the
first byte after the header) plus an optional "__metadata__" of string -> string, then the raw
little-endian tensor bytes.
"""

import json
import struct

import numpy as np

# Only the dtypes the parity tests exchange; anything else is rejected rather than guessed.
_DTYPE_TO_NUMPY = {
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
}
_NUMPY_TO_DTYPE = {v: k for k, v in _DTYPE_TO_NUMPY.items()}

# Refuse absurd headers early so a corrupt file gives a message, not a MemoryError.
_MAX_HEADER_BYTES = 100 * 1024 * 1024


class SafetensorsError(Exception):
    pass


def save(path, tensors, metadata=None):
    """Write `tensors` (name -> numpy array) to `path`. Names are stored in sorted order."""
    header = {}
    chunks = []
    offset = 0
    for name in sorted(tensors):
        array = np.asarray(tensors[name])
        little = array.dtype.newbyteorder("<")
        if little not in _NUMPY_TO_DTYPE:
            raise SafetensorsError(
                f"tensor '{name}': dtype {array.dtype} is not one of F32, F64, I32, I64")
        data = np.ascontiguousarray(array, dtype=little).tobytes()
        header[name] = {
            "dtype": _NUMPY_TO_DTYPE[little],
            "shape": [int(d) for d in array.shape],
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    # Pad with spaces so the data section starts 8-byte aligned, which lets readers map it.
    header_bytes += b" " * (-len(header_bytes) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for data in chunks:
            f.write(data)


def load(path, with_metadata=False):
    """Read `path` into a dict name -> numpy array (and the metadata dict if asked)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise SafetensorsError(f"{path}: {len(raw)} bytes, too short for a safetensors header")
    (header_len,) = struct.unpack("<Q", raw[:8])
    if header_len > _MAX_HEADER_BYTES or 8 + header_len > len(raw):
        raise SafetensorsError(
            f"{path}: header length {header_len} does not fit a file of {len(raw)} bytes")
    try:
        header = json.loads(raw[8:8 + header_len].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: header is not valid JSON: {e}") from e
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    data = memoryview(raw)[8 + header_len:]
    metadata = header.pop("__metadata__", {}) or {}
    tensors = {}
    for name, info in header.items():
        try:
            dtype = _DTYPE_TO_NUMPY[info["dtype"]]
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise SafetensorsError(f"{path}: tensor '{name}': bad header entry {info!r}") from e
        count = int(np.prod(shape, dtype=np.int64))
        if not (0 <= begin <= end <= len(data)) or end - begin != count * dtype.itemsize:
            raise SafetensorsError(
                f"{path}: tensor '{name}' ({info['dtype']} {list(shape)}) has data_offsets "
                f"[{begin}, {end}], expected {count * dtype.itemsize} bytes within a data "
                f"section of {len(data)} bytes")
        # Copy out so the arrays are writable and do not pin the whole file buffer.
        tensors[name] = np.frombuffer(data[begin:end], dtype=dtype).reshape(shape).copy()
    if with_metadata:
        return tensors, metadata
    return tensors
