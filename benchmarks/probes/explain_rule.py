"""Why a rule did or did not fire on one of its own cases: the explain report, the post-grad graph fusekit's pass
saw, and the rule's search forms (as Inductor's pattern printer writes them).

python benchmarks/probes/explain_rule.py decode_gemm.qkv_bias float16 [case, default: the rule's last CPU case]
    [--default: compile with the default rules only, as test_compiled_on_cuda_fires_and_matches does where the rule is
    on by default; otherwise the rule is named]"""
import ast
import sys

import torch
from torch._inductor import pattern_matcher as pm

import fusion_backend
from fusion_backend import forms, table

argv = [a for a in sys.argv[1:] if a != "--default"]
pid, dt = argv[0], getattr(torch, argv[1])
p = table.by_id(pid)
case = ast.literal_eval(argv[2]) if len(argv) > 2 else p.cases[-1]
args = p.make_args(case, dt, "cuda")
rep = fusion_backend.explain(p.search_fn(), *args, options=None if "--default" in sys.argv else {"patterns": [p.id]})
print(f"== {pid} {dt} case {case}: {rep}")
for g in rep.graphs:
    print(g.graph_code)
for i, f in enumerate(forms.search_forms(p, dt, "cuda")):
    print(f"-- form {i} (cast={f.cast})\n{pm.PatternPrettyPrinter.run(f.expr)}")
