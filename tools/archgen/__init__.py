"""Architecture knowledge generated from the real model definitions (developer tooling, not run by lint).

`tools.archgen.tiny` builds tiny transformers models from each architecture's own config class;
`tools.archgen.generate` derives the patterns in `patterns/generated/` from what transformers'
`save_pretrained` writes for them and fits them over probed configs; `tools.archgen.sglang_facts` and
`tools.archgen.sglang_probe` read and run SGLang's model classes (where SGLang is installed);
`tools.archgen.engine_sources` reads SGLang's and vLLM's model sources. Run through
`scripts/generate_patterns.py` from the repository root. Needs torch and transformers; imports
`weightcheck` (never the other way round: the runtime package does not import `tools`).
"""
