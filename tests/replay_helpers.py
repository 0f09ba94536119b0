"""APIs to record and replay in tests, and a dump writer that follows docs/dump-format.md.

The functions and the wrapper class are decorated with ``flashinfer_api`` like the real
kernel APIs, so they are registered and replay can call them once told to trust this
module (``allow_modules=["replay_helpers"]``, ``--allow-module replay_helpers``).
``TouchOnInit`` and ``SegmentSumWrapper.touch`` are not decorated: dumps naming them
must be refused. ``DumpWriter`` writes level-10 dumps the way the recorder does (our
format, or FlashInfer's: no ``sequence`` key): every file name, directory name, key and
record field through flashinfer_native.record, which takes them from the core
(_C.DUMP_FORMAT).
"""

import enum
import inspect
import json
import os
import sys
import time
from datetime import datetime

import torch

from flashinfer.api_logging import flashinfer_api
from flashinfer.version import __version__ as flashinfer_version
from flashinfer_native import _C
from flashinfer_native import record as rec

F = rec.FIELDS
INFO = rec.TENSOR_INFO_FIELDS
DETAIL = rec.TENSOR_DETAIL_FIELDS
EXC = rec.EXCEPTION_FIELDS
STATUS = rec.STATUS


class Reduction(enum.Enum):
    SUM = "sum"
    MAX = "max"


@flashinfer_api
def scale_add(x, y, alpha=1.0):
    """``x * alpha + y``."""
    return x * alpha + y


@flashinfer_api
def reduce_rows(x, mode=Reduction.SUM, dtype=torch.float32, device=None):
    """Row reduction of ``x`` in ``dtype``, on ``device`` (default: x's device)."""
    x = x.to(dtype=dtype, device=device if device is not None else x.device)
    return x.sum(dim=-1) if mode is Reduction.SUM else x.amax(dim=-1)


@flashinfer_api
def concat(tensors, dim=0):
    """``torch.cat`` of a list of tensors."""
    return torch.cat(list(tensors), dim=dim)


@flashinfer_api
def split_halves(x):
    """``(first half, second half, length)`` along dim 0: a tuple with a non-tensor item."""
    n = x.shape[0] // 2
    return x[:n].clone(), x[n:].clone(), int(x.shape[0])


@flashinfer_api
def summarize(x):
    """A dict holding a tensor and plain values."""
    return {"total": x.sum(dim=0), "count": int(x.numel()), "name": "summary"}


@flashinfer_api
def check_positive(x):
    """Return ``x * 2``; raise ValueError when ``x`` has a negative element."""
    if bool((x < 0).any()):
        raise ValueError("check_positive: x has negative elements")
    return x * 2


@flashinfer_api
def fill_out(x, out):
    """Write ``x + 1`` into ``out`` and return it (the ``out=`` convention)."""
    out.copy_(x + 1)
    return out


@flashinfer_api
def slow_identity(x, seconds=60.0):
    """Sleeps before returning: tests kill the process in the middle of this call."""
    time.sleep(seconds)
    return x


@flashinfer_api
def pad_rows(x, multiple: int = 8):
    """``x`` with zero rows added up to a multiple of ``multiple`` rows: an int-annotated
    parameter, like those FlashInfer formats into its JIT module names."""
    extra = -x.shape[0] % multiple
    return torch.cat([x, x.new_zeros((extra, *x.shape[1:]))])


@flashinfer_api
def dumps_suspended_now():
    """Whether level-10 dumping is suspended while this call runs."""
    return _C.dumps_suspended()


class TouchOnInit:
    """Not an API: its constructor has a side effect (creates the file ``path``)."""

    def __init__(self, path):
        open(path, "w").close()


class SegmentSumWrapper:
    """Stateful like FlashInfer's wrappers: ``plan`` fixes segments, ``run`` uses them."""

    @flashinfer_api
    def __init__(self, workspace, layout="NHD"):
        self.workspace = workspace
        self.layout = layout
        self.indptr = None

    @flashinfer_api
    def plan(self, indptr, scale, out_dtype=torch.float32):
        self.indptr = [int(v) for v in indptr.tolist()]
        self.scale = float(scale)
        self.out_dtype = out_dtype

    @flashinfer_api
    def run(self, x, return_lse=False):
        if self.indptr is None:
            raise RuntimeError("run() called before plan()")
        segments = [x[a:b].sum(dim=0) * self.scale for a, b in zip(self.indptr, self.indptr[1:])]
        out = torch.stack(segments).to(self.out_dtype)
        if return_lse:
            return out, torch.logsumexp(out, dim=-1)
        return out

    def touch(self, path):
        """Not an API: a method of an API class with a side effect (creates ``path``)."""
        open(path, "w").close()


# ----------------------------------------------------------------------- the writer


def encode(value, key, tensors):
    """The JSON encoding of one value (docs/dump-format.md#value-encoding); nested tensors go into ``tensors``."""
    if isinstance(value, torch.Tensor):
        tensors[key] = value
        return {
            "type": "torch.Tensor",
            "shape": list(value.shape),
            "dtype": str(value.dtype),
            "stride": list(value.stride()),
            "device": str(value.device),
            "requires_grad": value.requires_grad,
            "is_contiguous": value.is_contiguous(),
            "tensor_key": key,
        }
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.dtype):
        return {"type": "torch.dtype", "value": str(value)}
    if isinstance(value, enum.Enum):
        cls = type(value)
        return {
            "type": "enum",
            "name": f"{cls.__name__}.{value.name}",
            "value": value.value,
            "class": f"{cls.__module__}.{cls.__qualname__}",
        }
    if isinstance(value, torch.device):
        return {"type": "torch.device", "value": str(value)}
    if isinstance(value, (list, tuple)):
        return {
            "type": type(value).__name__,
            "length": len(value),
            "items": [encode(v, rec.item_key(key, i), tensors) for i, v in enumerate(value)],
            "truncated": False,
        }
    if isinstance(value, dict):
        items = []
        for i, (k, v) in enumerate(value.items()):
            key_key, value_key = rec.dict_item_keys(key, i)
            items.append(
                {"key": encode(k, key_key, tensors), "value": encode(v, value_key, tensors)}
            )
        return {"type": "dict", "length": len(value), "items": items, "truncated": False}
    return {"type": type(value).__name__, "repr": repr(value)[: rec.FORMAT["repr_limit"]]}


def _encode_top(key, value, metadata, tensors):
    if isinstance(value, torch.Tensor):
        tensors[key] = value
    else:
        metadata[key] = encode(value, key, tensors)


def _details(tensors):
    return {
        k: {
            DETAIL.shape: list(t.shape),
            DETAIL.dtype: str(t.dtype),
            DETAIL.stride: list(t.stride()),
            DETAIL.device: str(t.device),
        }
        for k, t in tensors.items()
    }


def _nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors.values())


class DumpWriter:
    """Writes level-10 dumps under ``root`` following docs/dump-format.md.

    Parameters
    ----------
    root : str
        Dump root (``FLASHINFER_DUMP_DIR``).
    fmt : {"torch", "safetensors"}
        Tensor file format.
    flashinfer_style : bool
        Write FlashInfer's records: no ``sequence`` key.
    timestamp : str, optional
        Fixed timestamp for every call (to force equal timestamps); default: now.
    """

    def __init__(self, root, fmt="torch", flashinfer_style=False, timestamp=None, pid=None):
        self.root = str(root)
        self.fmt = fmt
        self.flashinfer_style = flashinfer_style
        self.timestamp = timestamp
        self.pid = pid if pid is not None else os.getpid()
        self.sequence = 0
        self.counters = {}
        self.dirs = []
        os.makedirs(self.root, mode=0o700, exist_ok=True)

    # -- public: record a call the way the decorator would see it
    def call(self, func, *args, **kwargs):
        """Record and run a plain function."""
        raw = inspect.unwrap(func)
        return self._record(func.__name__, raw, func, args, kwargs, None, False)

    def crash(self, func, *args, **kwargs):
        """Record only the inputs and line 1, as when the process dies inside the call."""
        raw = inspect.unwrap(func)
        return self._record(func.__name__, raw, func, args, kwargs, None, True)

    def construct(self, cls, *args, **kwargs):
        """Record ``Cls.__init__`` (self is ``arg_0``) and return the new object."""
        obj = cls.__new__(cls)
        init = inspect.unwrap(cls.__init__)
        self._record(
            f"{cls.__name__}.__init__",
            init,
            lambda *a, **k: init(obj, *a, **k),
            (obj, *args),
            kwargs,
            id(obj),
            False,
            run_args=args,
        )
        return obj

    def method(self, obj, name, *args, **kwargs):
        """Record and run ``obj.name(*args, **kwargs)``."""
        raw = inspect.unwrap(getattr(type(obj), name))
        bound = getattr(obj, name)
        return self._record(
            f"{type(obj).__name__}.{name}",
            raw,
            bound,
            (obj, *args),
            kwargs,
            id(obj),
            False,
            run_args=args,
        )

    # -- internals
    def _save(self, dump_dir, which, tensors):
        # torch.save as FlashInfer writes (whole storages: a view keeps its offset), or
        # safetensors with the strides and requires_grad in the header as the core writes
        path = os.path.join(dump_dir, rec.tensor_file_name(which, self.fmt))
        if self.fmt == "safetensors":
            from safetensors.torch import save_file

            meta = {
                "flashinfer.strides": json.dumps({k: list(t.stride()) for k, t in tensors.items()}),
                "flashinfer.requires_grad": json.dumps(
                    {k: t.requires_grad for k, t in tensors.items()}
                ),
            }
            data = {k: t.detach().cpu().contiguous().clone() for k, t in tensors.items()}
            save_file(data, path + ".tmp", metadata=meta)
        else:
            torch.save({k: t.detach().cpu() for k, t in tensors.items()}, path + ".tmp")
        os.rename(path + ".tmp", path)

    def _append(self, dump_dir, record):
        line = json.dumps(record) + "\n"
        for path in (
            os.path.join(dump_dir, rec.METADATA_FILE),
            os.path.join(self.root, rec.SESSION_FILE),
        ):
            with open(path, "a") as f:
                f.write(line)

    def _record(self, name, raw, runner, args, kwargs, self_id, crash, run_args=None):
        count = self.counters[name] = self.counters.get(name, 0) + 1
        self.sequence += 1
        ts = self.timestamp or rec.stamp(datetime.now())
        dump_dir = os.path.join(self.root, rec.call_dir_name(ts, self.pid, name, count))
        os.makedirs(dump_dir)
        self.dirs.append(dump_dir)
        in_meta, in_tensors = {}, {}
        for i, value in enumerate(args):
            _encode_top(rec.arg_key(i), value, in_meta, in_tensors)
        for k, value in kwargs.items():
            _encode_top(rec.kwarg_key(k), value, in_meta, in_tensors)
        in_bytes = _nbytes(in_tensors)
        record = {
            F.function_name: name,
            F.module: raw.__module__,
            F.call_sequence: count,
            F.timestamp: ts,
            F.process_id: self.pid,
            F.input_metadata: in_meta,
            F.output_metadata: {},
            F.tensor_info: {
                INFO.input_tensor_keys: list(in_tensors),
                INFO.output_tensor_keys: [],
                INFO.input_size_bytes: in_bytes,
                INFO.input_size_mb: in_bytes / 1048576,
            },
            F.tensor_details: _details(in_tensors),
            F.tensor_format: self.fmt,
            F.function_signature: str(inspect.signature(raw)),
            F.versions: {
                "torch": torch.__version__,
                "python": sys.version.split()[0],
                "flashinfer": flashinfer_version,
            },
            F.execution_status: STATUS.inputs_saved,
            F.graph_capture: False,
            F.dump_dir: dump_dir,
        }
        if self_id is not None:
            record[F.self_id] = self_id
        if not self.flashinfer_style:
            record[F.sequence] = self.sequence
        self._save(dump_dir, "inputs", in_tensors)
        self._append(dump_dir, record)
        if crash:
            return None
        try:
            result = runner(*(run_args if run_args is not None else args), **kwargs)
        except Exception as exc:
            record = {
                **record,
                F.execution_status: STATUS.exception,
                F.exception: {EXC.type: type(exc).__name__, EXC.message: str(exc)},
            }
            self._append(dump_dir, record)
            raise
        out_meta, out_tensors = {}, {}
        if isinstance(result, tuple):
            for i, value in enumerate(result):
                _encode_top(rec.result_key(i), value, out_meta, out_tensors)
        else:
            _encode_top(rec.result_key(), result, out_meta, out_tensors)
        out_bytes = _nbytes(out_tensors)
        self._save(dump_dir, "outputs", out_tensors)
        info = {
            **record[F.tensor_info],
            INFO.output_tensor_keys: list(out_tensors),
            INFO.output_size_bytes: out_bytes,
            INFO.output_size_mb: out_bytes / 1048576,
            INFO.total_size_bytes: in_bytes + out_bytes,
            INFO.total_size_mb: (in_bytes + out_bytes) / 1048576,
        }
        record = {
            **record,
            F.execution_status: STATUS.completed,
            F.output_metadata: out_meta,
            F.tensor_info: info,
            F.tensor_details: {**record[F.tensor_details], **_details(out_tensors)},
        }
        self._append(dump_dir, record)
        return result
