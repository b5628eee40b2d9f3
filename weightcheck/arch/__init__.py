"""Architecture knowledge generated from the real model definitions (developer tooling).

`weightcheck.arch.tiny` builds tiny transformers models from each architecture's own config class;
`weightcheck.arch.generate` derives the patterns in `patterns/generated/` from what transformers'
`save_pretrained` writes for them, and (where SGLang is installed) reads SGLang's model classes.
Nothing here is imported by `weightcheck lint`: it needs torch and transformers.
"""
