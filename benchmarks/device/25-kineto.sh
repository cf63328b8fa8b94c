#!/usr/bin/env bash
# Kineto reader on a fresh H200 capture (run from the repo root after run_all.sh put maxinstr
# on PYTHONPATH). Results in $OUT/kineto/:
#   h200_graph_threads.pt.trace.json.gz  torch.profiler trace of: record_function stages, a CUDA
#       graph captured once and replayed 4x, a worker thread launching kernels inside its own
#       record_function, pinned H2D/D2H copies and a cudaMemsetAsync. The coordinator can copy
#       it into tests/data/kineto/ as a fixture (what the current ones lack: graphs, a worker thread).
#   summary.txt  what maxinstr.traces.open_trace and attribute() make of it, and the raw facts
#       to check it against (which arg keys graph kernels carry, ops without correlation, ...).
set -uo pipefail
out="${OUT:-/tmp/out}/kineto"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 - "$out" <<'EOF' 2>&1 | tee "$out/summary.txt"
import collections, gzip, json, os, shutil, sys, threading
import torch
from torch.profiler import ProfilerActivity, profile, record_function

out = sys.argv[1]
torch.manual_seed(0)
dev = "cuda"
d = 1024
w = torch.randn(d, d, device=dev, dtype=torch.bfloat16) / 32

def step(x):
    return torch.nn.functional.gelu(x @ w) + 1

# CUDA graph of 3 kernels (captured outside the profiler)
static_x = torch.randn(64, d, device=dev, dtype=torch.bfloat16)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        step(static_x)
torch.cuda.current_stream().wait_stream(s)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    static_y = step(static_x)

host = torch.randn(1 << 20, pin_memory=True)
def worker():
    with record_function("worker_stage"):
        y = torch.randn(256, d, device=dev, dtype=torch.bfloat16)
        for _ in range(5):
            y = step(y)
    torch.cuda.synchronize()

torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    with record_function("copy_in"):
        g = host.to(dev, non_blocking=True)
        try:  # a real cudaMemsetAsync (torch's zero_ is a fill kernel); CuPy's zeros uses one
            import cupy
            with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                z = cupy.zeros(1 << 20, dtype=cupy.uint8)
        except Exception as exc:  # noqa: BLE001
            print("no CuPy memset:", exc)
    for i in range(4):
        with record_function("graph_replay"):
            graph.replay()
    with record_function("main_with_worker"):
        t = threading.Thread(target=worker)
        t.start()
        x = static_x
        for _ in range(3):
            x = step(x)
        t.join()
    with record_function("copy_out"):
        back = g.to("cpu", non_blocking=True)
    torch.cuda.synchronize()
raw = os.path.join(out, "h200_graph_threads.pt.trace.json")
prof.export_chrome_trace(raw)
with open(raw, "rb") as src, gzip.open(raw + ".gz", "wb") as dst:
    shutil.copyfileobj(src, dst)
os.remove(raw)

doc = json.load(gzip.open(raw + ".gz"))
ev = doc["traceEvents"]
cats = collections.Counter((e.get("ph"), e.get("cat")) for e in ev)
print("raw event counts:", dict(cats))
kernel_keys = collections.Counter(k for e in ev if e.get("cat") == "kernel" for k in e.get("args", {}))
print("kernel arg keys:", dict(kernel_keys))
runtime_names = collections.Counter(e["name"] for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver"))
print("runtime/driver calls:", dict(runtime_names))
no_corr = sum(1 for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "correlation" not in e.get("args", {}))
print("GPU ops without args.correlation:", no_corr)

from maxinstr.traces import open_trace
from maxinstr.attribute.attribute import attribute
from maxinstr.attribute.model import Rule
trace = open_trace(raw + ".gz")
print("open_trace:", trace.format, "ranges", len(trace.ranges), "calls", len(trace.calls), "ops", len(trace.ops))
print("op kinds:", collections.Counter(trace.ops.kind.tolist()), "bytes:", int(trace.ops.bytes.sum()))
print("graph_node_id set on", int((trace.ops.graph_node_id >= 0).sum()), "ops; GRAPH calls:", int((trace.calls.kind == 2).sum()))
print("notes:", trace.notes)
print("thread names:", trace.thread_names)
att = attribute(trace)
print("rules:", {Rule(k).name: v for k, v in collections.Counter(att.op_rule.tolist()).items()})
names = trace.strings
ann = trace.ranges.domain_id == list(names).index("user_annotation")
for i in range(len(trace.ranges)):
    if ann[i]:
        print(f"  stage {trace.name(int(trace.ranges.name_id[i]))!r} tid {int(trace.ranges.tid[i])}: ops {int(att.op_count[i])}, "
              f"busy {int(att.busy_ns[i])} ns, rules {int(att.range_rules[i]):#b}")
print("attribution notes:", att.notes)
EOF
exit "${PIPESTATUS[0]}"
