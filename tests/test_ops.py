"""torch.library.opcheck for every fusekit op (schema, fake, AOT dispatch), on CPU and, where the
extension is built, on CUDA; plus the ops' contract against their references."""

import pytest
import torch

from conftest import HAS_GPU, pattern_params
from fusion_backend import ops, registry, table


def _op_args(p, case, dtype, device):
    args = list(p.make_args(case, dtype, device))
    bound = registry.op_arguments(p, args)
    return [bound[n] for n, _ in p.params]


def _opcheck(op, args):
    """opcheck, whose AOT-dispatch comparison does not take NaN == NaN: where the op's contract has NaN
    outputs (a fully masked softmax row), that comparison is made here with equal_nan."""
    if any(isinstance(a, torch.Tensor) and a.dtype == torch.float8_e4m3fn for a in args):
        # opcheck's test_schema compares inputs with allclose, which fp8 lacks on CPU: compare their bits here
        before = [a.clone() for a in args if isinstance(a, torch.Tensor)]
        torch.library.opcheck(op, args, test_utils=("test_autograd_registration", "test_faketensor",
                                                    "test_aot_dispatch_dynamic"))
        after = [a for a in args if isinstance(a, torch.Tensor)]
        assert all(torch.equal(b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b,
                               a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a)
                   for b, a in zip(before, after)), "an input was written"
        return
    out = op(*args)
    if not any(torch.isnan(o).any() for o in (out if isinstance(out, (tuple, list)) else [out])
               if o.is_floating_point()):
        torch.library.opcheck(op, args)
        return
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(op, args, test_utils=utils)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(op, backend="aot_eager", fullgraph=True)(*args), out,
                               equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("p,dtype", pattern_params())
def test_opcheck_cpu(p, dtype):
    op = registry.op_overload(p.op)
    for case in p.fixtures.cases:
        _opcheck(op, _op_args(p, case, dtype, "cpu"))


@pytest.mark.parametrize("p,dtype", pattern_params(dtypes=False))
def test_opcheck_tensor_scalar_companions(p, dtype):
    floats = p.tensor_scalars
    if not floats:
        pytest.skip("no float parameters")
    op = registry.op_overload(p.op)
    args = _op_args(p, p.fixtures.cases[0], dtype, "cpu")
    kwargs = {f"{n}_t": torch.tensor(float(args[[m for m, _ in p.params].index(n)]) * 2) for n in floats}
    torch.library.opcheck(op, args, kwargs)
    want = p.reference(*[kwargs.get(f"{n}_t", a) for (n, _), a in zip(p.params, args)])
    torch.testing.assert_close(op(*args, **kwargs), want, rtol=0, atol=0)


def test_every_op_has_a_schema_matching_its_reference():
    for p in table.all_patterns():
        schema = registry.op_overload(p.op)._schema
        positional = [a.name for a in schema.arguments if not a.kwarg_only]
        assert positional == [n for n, _ in p.params], (p.id, str(schema))
        companions = {a.name for a in schema.arguments if a.kwarg_only}
        # a companion for each float the rule binds (an op shared by rules may have more)
        assert companions >= {f"{n}_t" for n in p.tensor_scalars}, (p.id, str(schema))
        assert all(c[:-2] in positional for c in companions), (p.id, str(schema))
    used = {p.op for p in table.all_patterns()} | {"verify"}
    assert used == set(ops.OPS), "every op in ops.OPS is used by a pattern, and vice versa"


def test_ops_are_functional():
    for name in ops.OPS:
        schema = getattr(torch.ops.fusekit, name).default._schema
        assert not schema.is_mutable and all(a.alias_info is None for a in schema.arguments), name


def test_typed_wrappers_match_references():
    from fusion_backend.patterns import elementwise, quantize

    x, y = torch.randn(5, 7), torch.randn(5, 7)
    torch.testing.assert_close(ops.add_mul_exp(x, y, 1.5), elementwise.add_mul_exp_ref(x, y, 1.5))
    torch.testing.assert_close(ops.add_mul_exp(x, y, torch.tensor(1.5)), elementwise.add_mul_exp_ref(x, y, 1.5))
    torch.testing.assert_close(ops.mul_add(x, y, x), elementwise.mul_add_ref(x, y, x))
    xq = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 1e9, -1e9, 0.2]) * 0.1
    assert torch.equal(ops.quant_i8(xq, 0.1, 0.0), quantize.quant_i8_ref(xq, 0.1, 0.0))
    assert ops.quant_i8(xq, 0.1, 0.0).tolist() == [0, 2, 2, 0, -2, 127, -128, 0]  # half to even


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("p,dtype", pattern_params())
def test_opcheck_cuda(p, dtype):
    from fusion_backend import _ext

    if _ext.missing_cuda_kernel(p.op, torch.device("cuda")):
        pytest.skip(_ext.missing_cuda_kernel(p.op, torch.device("cuda")))
    if not ops.cuda_kernel_takes(p.op, dtype):
        pytest.skip(f"{p.op}'s CUDA kernel does not take {dtype} (the rule takes it on CPU only)")
    op = registry.op_overload(p.op)
    for case in p.fixtures.cases:
        _opcheck(op, _op_args(p, case, dtype, "cuda"))
