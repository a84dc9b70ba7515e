"""Why a rule offers no entry to a CUDA graph: the graph after the pass, and which of the rule's search-form
requirements (ops, parent->child edges) the graph lacks. python benchmarks/probes/why_no_attention_site.py [rule]"""
import sys

import torch

import fusion_backend
from fusion_backend import _ext, forms, matcher, table

_ext.load_for_device()
pid = sys.argv[1] if len(sys.argv) > 1 else "attention.sdpa_math"
p = table.by_id(pid)
dtype = torch.float16
args = p.make_args(p.cases[-1], dtype, "cuda")
rep = fusion_backend.explain(p.search_fn(), *args, options={"patterns": [pid]})
print(rep)
for g in rep.graphs:
    print(g.graph_code)


def grab(gm, example_inputs):
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx

    def post(graph):

        idx = matcher.GraphIndex(graph)
        ops, edges = forms.common_requirements(p, dtype, "cuda")
        print("graph dtypes", matcher.graph_dtypes(graph))
        print("missing ops:", [sorted(map(str, f)) for f in ops if f.isdisjoint(idx.targets)])
        print("missing edges:", [(sorted(map(str, a)), i, sorted(map(str, c))) for a, i, c in edges
                                 if not any((x, i, y) in idx.edges for x in a for y in c)])
        for k, f in enumerate(forms.search_forms(p, dtype, "cuda")):
            print("form", k, "fits", idx.fits(*f.needs))
    with config.patch(post_grad_custom_post_pass=post):
        return compile_fx(gm, example_inputs)

torch._dynamo.reset()
torch.compile(p.search_fn(), backend=grab)(*args)
