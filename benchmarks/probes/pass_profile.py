"""fusekit's pass alone on one captured graph: a 12-layer GPT-2 (n_embd 64, fp32, CPU; the compile-time
issue's reference), captured once at Inductor's post-grad hook, then the pass timed on fresh copies.

    python benchmarks/probes/pass_profile.py [--layers 12] [--profile]

Prints the first call in this process (search patterns from the disk cache, or traced if it is empty), the
second, the match attempts and the sites; --profile adds cProfile's top entries of a third call.
"""
import argparse
import copy
import cProfile
import pstats
import time

import torch
import transformers
from torch._inductor import config as inductor_config
from torch._inductor.compile_fx import compile_fx

import fusion_backend
from fusion_backend import passes
from fusion_backend.backend import split_options
from fusion_backend.report import no_compile_caches


def captured_graph(layers: int) -> torch.fx.GraphModule:
    cfg = transformers.GPT2Config(n_layer=layers, n_head=4, n_embd=64, vocab_size=256, n_positions=128)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    box = {}

    class Capture:
        def __call__(self, graph):
            box["gm"] = copy.deepcopy(graph.owning_module)

        def uuid(self):
            return None

    def backend(gm, example_inputs):
        with inductor_config.patch(post_grad_custom_post_pass=Capture()):
            return compile_fx(gm, example_inputs)

    torch._dynamo.reset()
    with no_compile_caches(), torch.no_grad():
        torch.compile(model, backend=backend)(torch.randint(0, 256, (2, 32)))
    return box["gm"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    gm0 = captured_graph(a.layers)
    fk, _ = split_options(None, {"cpu_reference": True})

    def once() -> float:
        gm = copy.deepcopy(gm0)
        t0 = time.perf_counter()
        passes.FusekitPass(fk)(gm.graph)
        return time.perf_counter() - t0

    print(f"graph: {len(gm0.graph.nodes)} nodes")
    print(f"pass, first call in this process: {once():.3f} s")
    print(f"pass, second call: {once():.3f} s")
    rep = fusion_backend.report(last=1)
    print(f"match attempts: {rep.match_attempts:,}; sites: {dict(rep.sites)}")
    if a.profile:
        prof = cProfile.Profile()
        prof.enable()
        once()
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
