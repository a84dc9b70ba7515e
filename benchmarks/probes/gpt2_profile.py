"""GPT-2 8x512 fp16 on a GPU: Inductor vs fusekit, twice each, wall time (do_bench) and the top kernels
and CPU ops of five forwards (torch.profiler). The CPU loop first says how fast this host is (the wall
times of small kernels depend on it).

    python benchmarks/probes/gpt2_profile.py
"""
import time, torch, os
from torch.profiler import profile, ProfilerActivity
from triton.testing import do_bench
import fusion_backend
from fusion_backend.tools import models
from fusion_backend.backend import backend as fk_backend
model, inputs, _ = models.make("gpt2", "cuda")
t = time.time(); s = 0
for i in range(3_000_000): s += i
print(f"cpu loop {time.time()-t:.3f}s  loadavg {os.getloadavg()}", flush=True)
res = {}
for mode in ("inductor", "fusekit", "inductor", "fusekit"):
    torch._dynamo.reset()
    f = torch.compile(model) if mode == "inductor" else torch.compile(model, backend=fk_backend())
    with torch.no_grad():
        for _ in range(3): f(**inputs)
        torch.cuda.synchronize()
        ms = do_bench(lambda: f(**inputs), warmup=50, rep=300)
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(5): f(**inputs)
            torch.cuda.synchronize()
    ev = prof.key_averages()
    gpu = sum(e.self_device_time_total for e in ev) / 5 / 1000
    top = sorted(ev, key=lambda e: -e.self_device_time_total)[:6]
    print(f"{mode:9s} do_bench {ms:.3f} ms  GPU kernels {gpu:.3f} ms/forward", flush=True)
    for e in top:
        print(f"    {e.key[:70]:70s} {e.self_device_time_total/5/1000:.3f} ms  x{e.count//5}")
    cpu_ops = sorted(ev, key=lambda e: -e.self_cpu_time_total)[:4]
    for e in cpu_ops:
        print(f"    cpu {e.key[:66]:66s} {e.self_cpu_time_total/5/1000:.3f} ms  x{e.count//5}")
