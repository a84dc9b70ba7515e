"""Sites per rule for the bench models on the GPU (prefill under no_grad, decode step), with whatever
fusion_backend is importable: run once with the old package on PYTHONPATH and once with the new one."""
import json, sys, torch, warnings
warnings.filterwarnings("ignore")
import fusion_backend
from fusion_backend.tools import models
out = {}
for name in sys.argv[2].split(","):
    model, inputs, _ = models.make(name, "cuda")
    with torch.no_grad():
        rep = fusion_backend.explain(model, **inputs)
    out[name] = {k: v for k, v in sorted(rep.sites.items()) if v}
    print(name, out[name], flush=True)
    del model
json.dump(out, open(sys.argv[1], "w"), indent=1)
