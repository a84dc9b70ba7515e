"""Why a rule did or did not fire on one of its own cases: the explain report, the post-grad graph fusekit's pass
saw, and the rule's search forms (as Inductor's pattern printer writes them).

python benchmarks/probes/explain_rule.py decode_gemm.qkv_bias float16 [case, default: the rule's last CPU case]"""
import ast
import sys

import torch
from torch._inductor import pattern_matcher as pm

import fusion_backend
from fusion_backend import forms, table

pid, dt = sys.argv[1], getattr(torch, sys.argv[2])
p = table.by_id(pid)
case = ast.literal_eval(sys.argv[3]) if len(sys.argv) > 3 else p.cases[-1]
args = p.make_args(case, dt, "cuda")
rep = fusion_backend.explain(p.search_fn(), *args, options={"patterns": [p.id]})
print(f"== {pid} {dt} case {case}: {rep}")
for g in rep.graphs:
    print(g.graph_code)
for i, f in enumerate(forms.search_forms(p, dt, "cuda")):
    print(f"-- form {i} (cast={f.cast})\n{pm.PatternPrettyPrinter.run(f.expr)}")
