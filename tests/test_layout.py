"""The package's import graph: no cycle (type-only imports aside), and the flow patterns -> engine -> ops:
the rule families import only the declarations they build on, and the engine's declarations import no
family back (the table above both puts the families in order)."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _imports(path: pathlib.Path, package: str) -> set[str]:
    tree = ast.parse(path.read_text())
    type_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                 and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    out = set()
    for n in ast.walk(tree):
        if id(n) in type_only or not isinstance(n, ast.ImportFrom):
            continue
        if n.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - n.level + 1] + ([n.module] if n.module else []))
        else:
            base = n.module or ""
        if base.startswith("fusion_backend"):
            out.add(base)
            out.update(f"{base}.{a.name}" for a in n.names)
    return out


def graph() -> dict[str, set[str]]:
    files = {}
    for f in (ROOT / "fusion_backend").rglob("*.py"):
        rel = f.relative_to(ROOT).with_suffix("")
        files[".".join(rel.parts).removesuffix(".__init__")] = f
    for f in (ROOT / "patterns").glob("*.py"):  # shipped as fusion_backend.patterns
        files[f"fusion_backend.patterns.{f.stem}".removesuffix(".__init__")] = f
    g = {}
    for mod, f in files.items():
        package = mod if f.name == "__init__.py" else mod.rsplit(".", 1)[0]
        g[mod] = {d for d in _imports(f, package) if d in files and d != mod
                  and d != "fusion_backend" and not mod.startswith(d + ".")}
    return g


def test_no_import_cycle():
    g = graph()
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for d in sorted(g[m]):
            assert state.get(d) != 1, " -> ".join(path + [d])
            if d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [m])


def test_flow_patterns_engine_ops():
    g = graph()
    families = [m for m in g if m.startswith("fusion_backend.patterns.")]
    assert families
    for m in families:  # a family builds on the declarations only
        assert g[m] <= {"fusion_backend.registry", "fusion_backend.guards", "fusion_backend.ops"}, (m, g[m])
    for m in ("fusion_backend.registry", "fusion_backend.guards", "fusion_backend.ops", "fusion_backend._ext"):
        assert not any(d.startswith("fusion_backend.patterns") or d == "fusion_backend.table" for d in g[m]), (m, g[m])
    for m in g:  # the pass never reaches the tools (CLI, benchmarks, profiler)
        if not m.startswith("fusion_backend.tools"):
            assert not any(d.startswith("fusion_backend.tools") for d in g[m]), (m, g[m])


def test_each_kernel_sits_in_a_family_that_calls_it():
    """csrc/<family>/<op>.cu: each op's kernel sits in the folder of a family whose rules call it, and every kernel
    file binds ops of that family only (the headers they share stay at the top). A family that only reuses other
    families' ops has no folder (see the next test)."""
    import re

    from fusion_backend import collectives, kv_cache, table

    # the collective and KV-cache rewrites are outside the tables
    uses: dict[str, set[str]] = {collectives.FAMILY: set(collectives.KERNELS), kv_cache.FAMILY: {kv_cache.KERNEL}}
    for p in table.all_patterns():
        uses.setdefault(table.family(p.id), set()).update({p.op} | ({p.rolling_op} if p.rolling_op else set()))
    folders = {d.name for d in (ROOT / "csrc").iterdir() if d.is_dir() and list(d.glob("*.cu"))}
    assert folders and folders <= set(uses), folders - set(uses)
    assert not list((ROOT / "csrc").glob("*.cu")), "kernels live in their family's folder"
    for family in folders:
        bound = {op for f in (ROOT / "csrc" / family).glob("*.cu") for op in re.findall(r'm\.impl\("(\w+)"', f.read_text())}
        assert bound <= uses[family], (family, bound - uses[family])
        assert {f"{op}.cu" for op in bound} <= {f.name for f in (ROOT / "csrc" / family).glob("*.cu")}
    bound_anywhere = {op for f in (ROOT / "csrc").glob("*/*.cu") for op in re.findall(r'm\.impl\("(\w+)"', f.read_text())}
    assert {p.op for p in table.all_patterns()} <= bound_anywhere | {"verify"}


def test_the_engine_names_no_family():
    """What a family needs (its Inductor settings, its checks, its kernels' arch) is declared in its patterns/ file;
    the engine's code (fusion_backend/*.py; the CLI and benchmarks in tools/ aside) names no family: no identifier or
    string holds a family's name. ops.py is the op surface: its table names ops, some after their family."""
    import io
    import tokenize

    from fusion_backend import table

    families = {table.family(p.id) for p in table.all_patterns()}
    for f in sorted((ROOT / "fusion_backend").glob("*.py")):
        if f.name == "ops.py":
            continue
        toks = list(tokenize.generate_tokens(io.StringIO(f.read_text()).readline))
        for i, t in enumerate(toks):
            if t.type not in (tokenize.NAME, tokenize.STRING) or t.line.lstrip().startswith(("from ", "import ")):
                continue  # (an import names torch's modules, e.g. torch.nn.attention)
            if t.type == tokenize.STRING and (i == 0 or toks[i - 1].type in (tokenize.INDENT, tokenize.NEWLINE,
                                                                            tokenize.NL, tokenize.DEDENT)):
                continue  # a docstring
            hit = [fam for fam in families if fam in t.string.lower()]
            assert not hit, f"{f.name}:{t.start[0]}: {t.string[:80]!r} names {hit}"


@pytest.mark.slow
def test_a_new_family_is_files_in_patterns_only(tmp_path):
    """A family whose rule reuses an op: a new patterns/<family>.py and one line in patterns/__init__.py, no
    engine file; the rule is then found, matched and fused (a copy of patterns/ holds the change)."""
    import shutil
    import subprocess
    import sys

    shutil.copytree(ROOT / "patterns", tmp_path / "patterns")
    (tmp_path / "patterns" / "residual.py").write_text(
        "from fusion_backend import guards as G\n"
        "from fusion_backend.registry import Pattern\n"
        "from .elementwise import _like, mul_add_ref\n\n"
        "PATTERNS = [Pattern('residual.gate_add', reference=mul_add_ref, op='mul_add', inputs=_like(3),\n"
        "                    guards=(G.same_shape('q', 'k', 'v'), G.contiguous('q', 'k', 'v')))]\n")
    init = tmp_path / "patterns" / "__init__.py"
    text = init.read_text()
    assert "*QUANTIZE, *ELEMENTWISE]" in text
    init.write_text("from .residual import PATTERNS as RESIDUAL\n" + text.replace(
        "*QUANTIZE, *ELEMENTWISE]", "*QUANTIZE, *RESIDUAL, *ELEMENTWISE]"))
    code = (
        "import importlib, sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if 'Editable' not in getattr(f, '__name__', '')]\n"
        f"sys.path[:0] = [{str(tmp_path)!r}, {str(ROOT)!r}]\n"
        "sys.modules['fusion_backend.patterns'] = importlib.import_module('patterns')\n"
        "import torch, fusion_backend\n"
        "x = [torch.randn(4, 8) for _ in range(3)]\n"
        "rep = fusion_backend.explain(lambda q, k, v: q * k + v, *x,\n"
        "    options={'cpu_reference': True, 'patterns': ['residual.gate_add']})\n"
        "torch.testing.assert_close(rep.output, x[0] * x[1] + x[2])\n"
        "print(rep.sites['residual.gate_add'])\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "FUSEKIT_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-1] == "1", r.stdout[-500:]
