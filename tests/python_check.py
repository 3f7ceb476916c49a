#!/usr/bin/env python3
"""python/rfsdp against the C side (run by tests/test_python.c with PYTHONPATH=python and
RFSDP_LIBRARY=BUILD/librfsdp.so): python_check.py CKPT SAFETENSORS LOG LOSS1 LOSS2 ... [--plan MODEL C_JSON]

- every parameter of the checkpoint CKPT (saved at W=3: each tensor gathered from three rank
  files) read whole equals, bit for bit, the same tensor of SAFETENSORS (`rfsdp ckpt export` of
  CKPT), parsed here from the format's bytes with NumPy alone;
- every optimizer state has the dtype and shape `rfsdp ckpt info` gives (its "STATE" lines are
  checked by the C side), the 8-bit codes as uint8;
- read_log(LOG) gives the plan line, then one dict per step whose losses are LOSS1, LOSS2, ...
  (the C side's reading of the same log);
- a missing tensor and a missing checkpoint raise RfsdpError naming them;
- with torch installed: torch.from_dlpack on the array shares its memory (no copy);
- with --plan MODEL C_JSON: rfsdp.plan(MODEL, 3, ...) equals `rfsdp plan --json`'s line C_JSON of the
  same options field for field (but the planner's time), and its mistakes raise RfsdpError naming
  the option."""
import json
import struct
import sys

import numpy as np

import rfsdp

args = sys.argv[1:]
plan_args = []
if "--plan" in args:  # --plan MODEL C_JSON: rfsdp.plan() against `rfsdp plan --json`'s line
    k = args.index("--plan")
    args, plan_args = args[:k], args[k + 1:]
ckpt_dir, st_path, log_path = args[0:3]
losses = [float(x) for x in args[3:]]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    kinds = {"F32": np.float32, "BF16": np.uint16, "F16": np.float16, "U8": np.uint8}
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=kinds[t["dtype"]]).reshape(t["shape"])
    return out


ref = read_safetensors(st_path)
ck = rfsdp.Checkpoint(ckpt_dir)
check(ck.world == 3, "world %d, expected 3" % ck.world)
params = [n for n in ck.tensors if n in ref]
check(len(params) >= 9, "only %d of the checkpoint's tensors are in the export" % len(params))
for name in params:
    a = ck[name]
    check(a.dtype == np.float32 and a.shape == ref[name].shape, "%s: %s %s" % (name, a.dtype, a.shape))
    check(np.array_equal(a.view(np.uint32), ref[name].view(np.uint32)), "%s differs from the export" % name)
for name in ck.tensors:
    if name in ref:
        continue
    dtype, shape = ck.info(name)
    a = ck.read(name)
    check(a.shape == shape, "%s: shape %s, info %s" % (name, a.shape, shape))
    want = np.uint8 if dtype == "u8" else np.float32
    check(a.dtype == want, "%s: dtype %s (%s)" % (name, a.dtype, dtype))
    print("STATE %s %s %s" % (name, dtype, "x".join(str(d) for d in shape)))

log = rfsdp.read_log(log_path)
check("plan" in log[0] and "memory" in log[0], "the log's first line is not the plan")
got = [r["loss"] for r in log[1:]]
check(got == losses, "log losses %s, the C side read %s" % (got, losses))

for bad, call in (("no-such-tensor", lambda: ck["no-such-tensor"]), ("/nonexistent/ck", lambda: rfsdp.Checkpoint("/nonexistent/ck"))):
    try:
        call()
        failures.append("%s: no error" % bad)
    except rfsdp.RfsdpError as e:
        check(bad in str(e), "%s: the error does not name it: %s" % (bad, e))

try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    a = ck[params[0]]
    t = torch.from_dlpack(a)
    check(t.data_ptr() == a.ctypes.data and torch.equal(t, torch.from_numpy(a.copy())), "DLPack copied")
    print("DLPACK checked (torch %s)" % torch.__version__)
else:
    print("DLPACK not checked: torch is not installed in this python")

if plan_args:
    model, c_json = plan_args
    with open(c_json) as f:
        want = json.loads(f.read())
    got = rfsdp.plan(model, 3, batch=6, seq=16, optim="adamw8bit", accum=2, replicate=1, network="here")
    for d in (want, got):
        d.pop("plan_ms")  # the planner's own time
    diff = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
    check(not diff, "rfsdp.plan() differs from rfsdp plan --json in %s" % diff)
    check(got["memory_per_rank_bytes"] > 0 and got["world"] == 3 and "peers" in got, "plan: %s" % got)
    print("PLAN %d fields equal to rfsdp plan --json" % len(got))
    for bad, opts in (("--replicate 2 does not divide", {"replicate": 2}), ("--rank 5", {"batch": 6, "seq": 16, "rank": 5})):
        try:
            rfsdp.plan(model, 3, **opts)
            failures.append("plan(%s): no error" % opts)
        except rfsdp.RfsdpError as e:
            check(bad in str(e), "plan(%s): the error does not say '%s': %s" % (opts, bad, e))
    try:
        rfsdp.plan(model, 3, no_such_option=1)
        failures.append("plan(no_such_option=1): no error")
    except TypeError as e:
        check("no_such_option" in str(e), "plan(no_such_option=1): %s" % e)

ck.close()
for f in failures:
    print("FAIL", f)
print("python_check: %d tensors compared, %d failures" % (len(params), len(failures)))
sys.exit(1 if failures else 0)
