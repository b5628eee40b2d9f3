"""Tensor comparison: policy tiers (exact / ULP / statistical), streaming metrics, mismatch classification.

- `weightcheck.compare.policy`: the regex → tier DSL and the built-in policy (`Policy`, `PolicyRule`,
  `parse_policy`).
- `weightcheck.compare.operands`: logical tensors read a block of rows at a time (`PlainOperand`,
  `QuantOperand` dequantizing on the fly).
- `weightcheck.compare.engine`: `compare_pair(a, b, rule) -> Verdict` (equal / within tolerance / failed,
  with `Metrics`).
- `weightcheck.compare.classify`: `classify(...)` explains a failure (shifted/swapped, transposed, never
  written, ...).
- `weightcheck.compare.metrics`, `weightcheck.compare.ulp`: the numbers behind the verdicts.

Importing this package imports no torch; the submodules import it when they compute.
"""
