#!/usr/bin/env python
"""Regenerate patterns/generated/ from the pinned transformers (and SGLang, with --sglang).

    python scripts/generate_patterns.py            # write
    python scripts/generate_patterns.py --check    # exit 1 when the checked-in data is stale
    python scripts/generate_patterns.py --sglang   # the SGLang half (run in .venv-sglang)
    python scripts/generate_patterns.py llama gpt_oss   # only these model_types (writes them)
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    from weightcheck.arch.generate import ARCHITECTURES, GENERATED_DIR, generate

    ap = argparse.ArgumentParser()
    ap.add_argument("model_types", nargs="*")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--sglang", action="store_true", help="the SGLang half: sglang.json (needs sglang installed)")
    ap.add_argument("--out", type=Path, default=GENERATED_DIR)
    args = ap.parse_args()
    if args.sglang:
        from weightcheck.arch.sglang_facts import generate_sglang

        files = generate_sglang()
    else:
        files = generate(tuple(args.model_types) or ARCHITECTURES)
        if args.model_types:  # partial run: keep the index of everything
            files.pop("index.json")
    stale = []
    if not args.model_types:  # the README's covered list, from the index and sglang.json
        import json

        from weightcheck.arch.generate import readme_with_coverage

        index = json.loads(files.get("index.json") or (args.out / "index.json").read_text())
        sglang_doc = json.loads(files.get("sglang.json") or (args.out / "sglang.json").read_text())
        readme = Path(__file__).resolve().parent.parent / "README.md"
        text = readme_with_coverage(readme.read_text(), index, sglang_doc)
        if text != readme.read_text():
            stale.append("README.md")
            if not args.check:
                readme.write_text(text)
    for name, text in sorted(files.items()):
        path = args.out / name
        old = path.read_text() if path.exists() else ""
        if old != text:
            stale.append(name)
            if args.check:
                sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                                           f"checked-in/{name}", f"regenerated/{name}", n=1))
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    if args.check and stale:
        print(f"\nstale generated data: {', '.join(stale)} (run scripts/generate_patterns.py)", file=sys.stderr)
        return 1
    print(f"{len(files)} files, {len(stale)} {'stale' if args.check else 'written'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
