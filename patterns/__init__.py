"""fusekit's pattern tables, one module per family. Ships as ``fusion_backend.patterns``."""
from .attention import PATTERNS as ATTENTION
from .decode import PATTERNS as DECODE
from .batched_matmul import PATTERNS as BATCHED_MATMUL
from .elementwise import PATTERNS as ELEMENTWISE
from .quantize import PATTERNS as QUANTIZE

# Order matters where rules overlap: a longer chain must be tried before its own suffix.
# Decode before attention: its rules take the short-query SDPA sites the attention rules would also take.
PATTERNS = [*DECODE, *ATTENTION, *BATCHED_MATMUL, *QUANTIZE, *ELEMENTWISE]
