"""What users run around the pass, apart from it: the ``fusekit`` command (cli), the end-to-end prefill and
decode benchmarks (e2e, decode_bench), the profiler report (profile) and the model zoo (models). Nothing here
is in the pass's cache key: editing these files never invalidates a compiled graph."""
