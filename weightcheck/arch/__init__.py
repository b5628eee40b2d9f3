"""Architecture knowledge at run time: `weightcheck.arch.oracle` builds what transformers' own model class
writes for a config on the meta device (lint's fallback for a config outside what a generated pattern was
validated on, only when transformers is installed; the conformance tests use it too).

The generator of `patterns/generated/` (tiny models, fitting, the SGLang and vLLM source readers) is
developer tooling outside the runtime package: `tools/archgen/`, run by `scripts/generate_patterns.py`.
"""
