#!/usr/bin/env python3
"""TensorBoard's own reading of rfsdp's event files, committed for tests/test_tensorboard.c.

Runs `BUILD/tests/test_tensorboard --write-ref tests/data/tensorboard` (the synthetic fixed and
resumed event files), then reads each with TensorBoard's RawEventFileLoader (every record, in file
order, its CRCs checked) parsed by TensorBoard's Event protobuf and EventAccumulator (the folder as TensorBoard's UI loads it) and writes
tests/data/tensorboard/ref.json. Needs tensorboard from PyPI:
    $(scripts/pyenv tensorboard)/bin/python tests/ref_tensorboard.py [BUILD]
"""
import json
import os
import subprocess
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto import event_pb2

build = sys.argv[1] if len(sys.argv) > 1 else "build"
out = "tests/data/tensorboard"
subprocess.run([os.path.join(build, "tests", "test_tensorboard"), "--write-ref", out], check=True)

ref = {}
for name in ("fixed", "resumed"):
    folder = os.path.join(out, name)
    path = os.path.join(folder, "events.out.tfevents.rfsdp")
    events = []
    for record in RawEventFileLoader(path).Load():
        ev = event_pb2.Event.FromString(record)
        e = {"wall_time": ev.wall_time, "step": ev.step}
        if ev.HasField("file_version"):
            e["file_version"] = ev.file_version
        if ev.HasField("summary"):
            e["values"] = [{"tag": v.tag, "simple_value": v.simple_value} for v in ev.summary.value]
        events.append(e)
    acc = EventAccumulator(folder)
    acc.Reload()
    scalars = {tag: [[s.step, s.value] for s in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    ref[name] = {"events": events, "accumulator": scalars}

with open(os.path.join(out, "ref.json"), "w") as f:
    json.dump(ref, f, indent=1, sort_keys=True)
    f.write("\n")
print("wrote", os.path.join(out, "ref.json"))
