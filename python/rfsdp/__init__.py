"""rfsdp from Python: ctypes over the installed shared library (librfsdp.so) and its public headers.

    import rfsdp
    ck = rfsdp.Checkpoint("runs/demo/ckpt/step-00001000")
    ck.tensors                 # names, in the checkpoint's order
    w = ck["layers.0.wq"]      # the whole tensor as a NumPy array, from every rank file, any W
    t = ck.torch("layers.0.wq")  # the same memory as a torch tensor (DLPack, no copy), torch installed
    log = rfsdp.read_log("run.jsonl")   # one dict per line
    p = rfsdp.plan("configs/demo.json", 8, batch=16, seq=256)  # rfsdp plan --json's dict: layout, step

The library is found through RFSDP_LIBRARY (a path), then next to this package's repository
(build/librfsdp.so), then the loader's usual places (ldconfig, /usr/local/lib).
"""
import ctypes
import ctypes.util
import json
import os

import numpy as np

__all__ = ["Checkpoint", "RfsdpError", "plan", "read_log", "library"]


class RfsdpError(RuntimeError):
    """A failure reported by librfsdp (the message names the file and the problem)."""


def _load():
    tried = []
    env = os.environ.get("RFSDP_LIBRARY")
    candidates = [env] if env else []
    here = os.path.dirname(os.path.abspath(__file__))
    candidates.append(os.path.join(here, "..", "..", "build", "librfsdp.so"))
    found = ctypes.util.find_library("rfsdp")
    if found:
        candidates.append(found)
    candidates += ["/usr/local/lib/librfsdp.so", "librfsdp.so"]
    for path in candidates:
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise RfsdpError("librfsdp.so not found; build it (make) or set RFSDP_LIBRARY. Tried: " + "; ".join(tried))


_lib = None


def library():
    """The loaded librfsdp.so (ctypes.CDLL), loaded on first use."""
    global _lib
    if _lib is None:
        lib = _load()
        c_p, c_i, c_i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
        lib.rf_checkpoint_open.argtypes = [ctypes.POINTER(c_p), ctypes.c_char_p]
        lib.rf_checkpoint_open.restype = c_i
        lib.rf_checkpoint_close.argtypes = [c_p]
        lib.rf_checkpoint_close.restype = None
        lib.rf_checkpoint_step.argtypes = [c_p]
        lib.rf_checkpoint_step.restype = c_i64
        lib.rf_checkpoint_world.argtypes = [c_p]
        lib.rf_checkpoint_world.restype = c_i
        lib.rf_checkpoint_extra_json.argtypes = [c_p]
        lib.rf_checkpoint_extra_json.restype = ctypes.c_char_p
        lib.rf_checkpoint_tensor_count.argtypes = [c_p]
        lib.rf_checkpoint_tensor_count.restype = c_i
        lib.rf_checkpoint_tensor_name.argtypes = [c_p, c_i]
        lib.rf_checkpoint_tensor_name.restype = ctypes.c_char_p
        lib.rf_checkpoint_tensor_info.argtypes = [c_p, ctypes.c_char_p, ctypes.POINTER(c_i), ctypes.POINTER(c_i),
                                                  ctypes.POINTER(c_i64)]
        lib.rf_checkpoint_tensor_info.restype = c_i
        lib.rf_checkpoint_read.argtypes = [c_p, ctypes.c_char_p, c_p]
        lib.rf_checkpoint_read.restype = c_i
        lib.rf_checkpoint_error.argtypes = []
        lib.rf_checkpoint_error.restype = ctypes.c_char_p
        _lib = lib
    return _lib


# enum rf_dtype (include/rfsdp_types.h) -> NumPy; bf16 and e4m3 have no NumPy dtype: their bits as
# uint16 / uint8, widened to float32 by Checkpoint.read(..., as_float=True)
_DTYPES = {0: np.float32, 1: np.uint16, 2: np.uint8, 3: np.uint8, 4: np.int32, 5: np.int64, 6: np.float64}
_DTYPE_NAMES = {0: "f32", 1: "bf16", 2: "fp8e4m3", 3: "u8", 4: "i32", 5: "i64", 6: "f64"}
_MAX_DIMS = 8


def _error():
    return RfsdpError(library().rf_checkpoint_error().decode("utf-8", "replace"))


def _bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _e4m3_to_f32(codes):
    c = codes.astype(np.int32)
    sign = np.where(c & 0x80, -1.0, 1.0)
    exp = (c >> 3) & 0xF
    man = (c & 0x7).astype(np.float64)
    val = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1.0 + man / 8.0) * 2.0 ** (exp.astype(np.float64) - 7))
    val = np.where((c & 0x7F) == 0x7F, np.nan, val)
    return (sign * val).astype(np.float32)


class Checkpoint:
    """A checkpoint directory (docs/checkpoint.md) read through librfsdp: any tensor whole, gathered from
    the rank files of whatever world size saved it, every chunk's checksum verified."""

    def __init__(self, path):
        lib = library()
        self._h = ctypes.c_void_p()
        if lib.rf_checkpoint_open(ctypes.byref(self._h), os.fsencode(path)) != 0:
            raise _error()
        self.path = path
        self.step = lib.rf_checkpoint_step(self._h)
        self.world = lib.rf_checkpoint_world(self._h)
        self.extra = json.loads(lib.rf_checkpoint_extra_json(self._h).decode())
        n = lib.rf_checkpoint_tensor_count(self._h)
        self.tensors = [lib.rf_checkpoint_tensor_name(self._h, i).decode() for i in range(n)]

    def close(self):
        if getattr(self, "_h", None):
            library().rf_checkpoint_close(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    def __contains__(self, name):
        return name in self.tensors

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self):
        return len(self.tensors)

    def info(self, name):
        """(dtype name, shape) of tensor `name`: dtype one of f32, bf16, fp8e4m3, u8, i32, i64, f64."""
        dt, nd = ctypes.c_int(), ctypes.c_int()
        shape = (ctypes.c_int64 * _MAX_DIMS)()
        if library().rf_checkpoint_tensor_info(self._h, name.encode(), ctypes.byref(dt), ctypes.byref(nd), shape):
            raise _error()
        return _DTYPE_NAMES[dt.value], tuple(shape[i] for i in range(nd.value))

    def read(self, name, as_float=True):
        """Tensor `name` whole as a NumPy array of its shape. bf16 and e4m3 tensors come as float32
        (as_float, exact for bf16) or as their raw bits (uint16 / uint8)."""
        if self._h is None:
            raise RfsdpError("%s: the checkpoint is closed" % self.path)
        dt, nd = ctypes.c_int(), ctypes.c_int()
        shape = (ctypes.c_int64 * _MAX_DIMS)()
        lib = library()
        if lib.rf_checkpoint_tensor_info(self._h, name.encode(), ctypes.byref(dt), ctypes.byref(nd), shape):
            raise _error()
        out = np.empty(tuple(shape[i] for i in range(nd.value)), dtype=_DTYPES[dt.value])
        if lib.rf_checkpoint_read(self._h, name.encode(), out.ctypes.data_as(ctypes.c_void_p)):
            raise _error()
        if as_float and dt.value == 1:
            return _bf16_to_f32(out)
        if as_float and dt.value == 2:
            return _e4m3_to_f32(out)
        return out

    __getitem__ = read

    def torch(self, name):
        """Tensor `name` as a torch tensor sharing the NumPy array's memory (DLPack: no copy)."""
        import torch  # noqa: PLC0415 (torch is optional)

        return torch.from_dlpack(self.read(name))

    def __repr__(self):
        return "Checkpoint(%r: step %d, saved at W=%d, %d tensors)" % (self.path, self.step, self.world,
                                                                       len(self.tensors))


def read_log(path):
    """`rfsdp train --log` as a list of dicts: the first line is the run's plan and memory
    ({"plan": ..., "memory": ...}), then one dict per step."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class _PlanRequest(ctypes.Structure):
    """struct rf_plan_request (include/rfsdp_plan.h), field for field; rf_plan_request_init checks the size."""
    _fields_ = [("model", ctypes.c_char_p), ("optim", ctypes.c_char_p), ("layout", ctypes.c_char_p),
                ("shard", ctypes.c_char_p), ("param_dtype", ctypes.c_char_p), ("reduce_dtype", ctypes.c_char_p),
                ("fp8", ctypes.c_char_p), ("fp8_pow2", ctypes.c_int), ("block_rows", ctypes.c_int64),
                ("align_bytes", ctypes.c_int64), ("max_buffers", ctypes.c_int), ("max_padding", ctypes.c_double),
                ("buffers", ctypes.c_int), ("replicate", ctypes.c_char_p), ("memory_per_rank", ctypes.c_double),
                ("batch", ctypes.c_int64), ("seq", ctypes.c_int64), ("accum", ctypes.c_int),
                ("prefetch", ctypes.c_int), ("no_reshard", ctypes.c_int), ("rank", ctypes.c_int),
                ("compute_dtype", ctypes.c_char_p), ("network", ctypes.c_char_p), ("peak_gflops", ctypes.c_double),
                ("efficiency", ctypes.c_double)]


def _plan_library():
    lib = library()
    if not hasattr(lib, "_rf_plan_ready"):
        c_p, c_i = ctypes.c_void_p, ctypes.c_int
        lib.rf_plan_request_init.argtypes = [ctypes.POINTER(_PlanRequest), ctypes.c_size_t]
        lib.rf_plan_request_init.restype = c_i
        lib.rf_plan_create.argtypes = [ctypes.POINTER(c_p), ctypes.POINTER(_PlanRequest), ctypes.POINTER(c_i), c_i]
        lib.rf_plan_create.restype = c_i
        lib.rf_plan_json.argtypes = [c_p, c_i]
        lib.rf_plan_json.restype = c_p  # freed by rf_plan_free_json
        lib.rf_plan_free_json.argtypes = [c_p]
        lib.rf_plan_free_json.restype = None
        lib.rf_plan_free.argtypes = [c_p]
        lib.rf_plan_free.restype = None
        lib.rf_fsdp_error.argtypes = []
        lib.rf_fsdp_error.restype = ctypes.c_char_p
        lib._rf_plan_ready = True
    return lib


def plan(config, world, **options):
    """The plan of the model `config` (a Hugging Face config.json or a units file) at `world` ranks, as
    `rfsdp plan --json` prints it: a dict of the layout's numbers (padding_ratio, max_shard_elems,
    buffer_count, split_blocks, peers, ...) and, with batch=B, the simulator's (memory_per_rank_bytes,
    memory_parts, bytes_per_step_intra and _inter, predicted_step_ms, ...). The options are rfsdp plan's,
    "-" written "_": optim, layout, shard, param_dtype, reduce_dtype, fp8, fp8_pow2, block_rows, align_bytes,
    max_buffers, max_padding, buffers, replicate, memory_per_rank, batch, seq, accum, prefetch, no_reshard,
    rank, compute_dtype, network, peak_gflops, efficiency. A mistake raises RfsdpError naming the option."""
    lib = _plan_library()
    req = _PlanRequest()
    if lib.rf_plan_request_init(ctypes.byref(req), ctypes.sizeof(req)) != 0:
        raise RfsdpError(lib.rf_fsdp_error().decode())
    keep = [str(config).encode()]  # the request borrows its strings
    req.model = keep[0]
    kinds = dict(_PlanRequest._fields_)
    for name, value in options.items():
        if name == "model" or name not in kinds:
            raise TypeError("plan(): unknown option %r (rfsdp plan's: %s)" % (name, ", ".join(k for k in kinds if k != "model")))
        if kinds[name] is ctypes.c_char_p:
            keep.append(str(value).encode())
            value = keep[-1]
        elif kinds[name] is ctypes.c_double:
            value = float(value)
        else:
            value = int(value)
        setattr(req, name, value)
    worlds = (ctypes.c_int * 1)(int(world))
    handle = ctypes.c_void_p()
    if lib.rf_plan_create(ctypes.byref(handle), ctypes.byref(req), worlds, 1) != 0:
        raise RfsdpError(lib.rf_fsdp_error().decode())
    try:
        text = lib.rf_plan_json(handle, int(world))
        if not text:
            raise RfsdpError(lib.rf_fsdp_error().decode())
        try:
            return json.loads(ctypes.string_at(text).decode())
        finally:
            lib.rf_plan_free_json(text)
    finally:
        lib.rf_plan_free(handle)
