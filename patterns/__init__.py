"""fusekit's pattern tables, one module per family. Ships as ``fusion_backend.patterns``."""
from .attention import PATTERNS as ATTENTION
from .decode import INDUCTOR as DECODE_INDUCTOR, LIMITS as DECODE_LIMITS, PATTERNS as DECODE, PREFILL  # one module
from .decode_gemm import EPILOGUES as DECODE_GEMM_EPILOGUES, PATTERNS as DECODE_GEMM
from .batched_matmul import PATTERNS as BATCHED_MATMUL
from .elementwise import PATTERNS as ELEMENTWISE
from .quantize import PATTERNS as QUANTIZE

# Order matters where rules overlap: a longer chain must be tried before its own suffix.
# Decode and prefill before attention: their rules take the grouped-head SDPA sites (short and long queries)
# the attention rules would also take.
# Decode GEMMs after the matmul epilogues (a linear with a fused epilogue is theirs first) and before the
# elementwise rules (silu_mul would take gate/up's product); except a linear's bias and GELU at a decode step's few
# rows, which decode_linear's epilogue takes before the matmul epilogue's tiled GEMM would.
PATTERNS = [*DECODE, *PREFILL, *ATTENTION, *DECODE_GEMM_EPILOGUES, *BATCHED_MATMUL, *DECODE_GEMM,
            *QUANTIZE, *ELEMENTWISE]

# Inductor settings a family needs where one of its rules fired (registry.InductorSettings).
INDUCTOR = {"decode": DECODE_INDUCTOR}

# What a family's kernels do not take (shapes that stay Inductor's), as `fusekit doctor` lists it.
LIMITS = (*DECODE_LIMITS,)
