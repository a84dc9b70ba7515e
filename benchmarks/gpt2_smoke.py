"""GPU smoke run: the 124M GPT-2 (random init from its config) in fp16 on CUDA under eager, Inductor and
fusekit: max relative error against eager, latency, compile time, and fusekit's match report."""
import argparse
import json
import time

import torch
import transformers
from triton.testing import do_bench

import fusion_backend


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config()).cuda().half().eval()
    ids = torch.randint(0, model.config.vocab_size, (a.batch, a.seq), device="cuda")
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "transformers": transformers.__version__, "batch": a.batch, "seq": a.seq}
    with torch.no_grad():
        ref = model(ids).logits.float()
        rep = fusion_backend.explain(model, ids)  # what fusekit matched on CUDA
        print(rep, flush=True)
        res["report"] = rep.to_dict()
        for name, backend in [("eager", None), ("inductor", "inductor"), ("fusekit", "fusekit")]:
            torch._dynamo.reset()
            f = model if backend is None else torch.compile(model, backend=backend)
            t0 = time.perf_counter()
            out = f(ids).logits.float()
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
            ms = do_bench(lambda: f(ids), warmup=100, rep=500, return_mode="median")
            err = ((out - ref).abs().max() / ref.abs().max()).item()
            res[name] = {"ms": ms, "first_call_s": compile_s, "max_rel_err_vs_eager": err}
            print(f"{name:9s} {ms:8.3f} ms  first call {compile_s:6.1f} s  max rel err vs eager {err:.2e}",
                  flush=True)
    if a.json:
        json.dump(res, open(a.json, "w"), indent=1, default=str)


if __name__ == "__main__":
    main()
