import os

import pytest
import torch

import fusion_backend
from fusion_backend import table
from fusion_backend.patterns import batched_matmul as BM

CPU = {"cpu_reference": True}
HAS_GPU = torch.cuda.is_available()


def pattern_params(dtypes=True):
    """(pattern, dtype) pairs from the tables: every test that takes them is generated. The quick subset
    (`-m "not slow"`) keeps the first rule of each op in its first dtype; the rest are marked slow."""
    out, ops = [], set()
    for p in table.all_patterns():
        quick = p.op not in ops
        ops.add(p.op)
        for i, dt in enumerate(p.dtypes if dtypes else p.dtypes[:1]):
            out.append(pytest.param(p, dt, id=f"{p.id}-{str(dt).replace('torch.', '')}",
                                    marks=() if quick and i == 0 else (pytest.mark.slow,)))
    return out


def explain(fn, *args, **opts):
    return fusion_backend.explain(fn, *args, options={**CPU, **opts})


def assert_same(out, ref):
    """CPU kernels are the references themselves: results must be identical."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o, r, rtol=0, atol=0, equal_nan=True)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(int(os.environ.get("FUSEKIT_TEST_SEED", "0")))


@pytest.fixture(autouse=True)
def _tf32_for_fp32_matmul_rules(request):
    """fp32 matmul rules fire only where TF32 is allowed (batched_matmul.tf32_allowed): their tests run there."""
    spec = getattr(request.node, "callspec", None)
    p, dt = (spec.params.get("p"), spec.params.get("dtype")) if spec else (None, None)
    if getattr(p, "op", None) != "matmul_epilogue" or dt != torch.float32:
        yield
        return
    with BM.fp32_matmul_precision("tf32"):
        yield
