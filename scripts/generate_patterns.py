#!/usr/bin/env python
"""Regenerate patterns/generated/ from the pinned transformers (and SGLang, with --sglang).

    python scripts/generate_patterns.py            # write
    python scripts/generate_patterns.py --check    # exit 1 when the checked-in data is stale
    python scripts/generate_patterns.py --sglang   # the SGLang half (run in .venv-sglang)
    python scripts/generate_patterns.py --task-heads   # generated/task_heads.json (task-head and base classes)
    python scripts/generate_patterns.py llama gpt_oss   # only these model_types (writes them)
    python scripts/generate_patterns.py --engine-sources --vllm-src DIR [--sglang-src DIR]
        # engine facts read from sources: generated/vllm/*.json from vLLM's unzipped wheel (DIR holds
        # vllm/model_executor/models; `pip download vllm==0.33.0 --no-deps` and unzip, vLLM is not
        # installed), generated/sglang/*.json from the installed SGLang (or --sglang-src, an unzipped
        # sglang 0.5.23 wheel), and generated/producer/transformers_linear.json from the installed transformers
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    from tools.archgen.generate import ARCHITECTURES, GENERATED_DIR, generate

    ap = argparse.ArgumentParser()
    ap.add_argument("model_types", nargs="*")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--sglang", action="store_true",
                    help="the SGLang registry half of generated/sglang/*.json (needs sglang installed)")
    ap.add_argument("--out", type=Path, default=GENERATED_DIR)
    ap.add_argument("--engine-sources", action="store_true", help="engine facts from SGLang/vLLM/transformers sources")
    ap.add_argument("--vllm-src", type=Path, help="an unzipped vLLM wheel (the folder holding vllm/)")
    ap.add_argument("--sglang-src", type=Path, help="an unzipped SGLang wheel (default: the installed SGLang)")
    ap.add_argument("--task-heads", action="store_true",
                    help="generated/task_heads.json: task-head and base classes' names (tools/archgen/task_heads.py)")
    args = ap.parse_args()
    if args.task_heads:
        from tools.archgen.task_heads import generate as generate_task_heads
        from tools.archgen.task_heads import render

        files = {"task_heads.json": render(generate_task_heads(list(ARCHITECTURES)))}
        args.model_types = ["(task heads)"]  # no README rewrite
    elif args.engine_sources:
        files = engine_source_files(args.vllm_src, args.sglang_src, GENERATED_DIR / "index.json")
        args.model_types = ["(engine sources)"]  # no README rewrite
    elif args.sglang:
        from tools.archgen.sglang_facts import generate_sglang

        files = generate_sglang()
    else:
        files = generate(tuple(args.model_types) or ARCHITECTURES)
        if args.model_types:  # partial run: keep the index of everything (the TOMLs' twin is always whole)
            files.pop("index.json")
    stale = []
    if not args.model_types:  # the README's covered list, from the index and the SGLang registry halves
        import json

        from tools.archgen.generate import readme_with_coverage
        from tools.archgen.sglang_facts import registry_doc

        index = json.loads(files.get("index.json") or (args.out / "index.json").read_text())
        sglang_doc = registry_doc(args.out)
        if not sglang_doc["model_types"]:
            raise SystemExit(f"{args.out}/sglang/: no SGLang registry facts (run with --sglang first)")
        if args.sglang:  # what this run would write
            sglang_doc = {"sglang": None, "model_types": {}}
            for name, text in sorted(files.items()):
                facts = dict(json.loads(text)["registry"])
                sglang_doc["sglang"] = facts.pop("sglang")
                sglang_doc["model_types"][Path(name).stem] = facts
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


def _wheel_version(unzipped: Path, dist: str) -> str:
    """The version an unzipped wheel's `<dist>-<version>.dist-info` folder names (the sources carry no
    readable version of their own)."""
    found = next(unzipped.glob(f"{dist}-*.dist-info"), None)
    if found is None:
        raise SystemExit(f"{unzipped}: no {dist}-*.dist-info (unzip the whole wheel, or at least its dist-info)")
    return found.name[len(dist) + 1 :].removesuffix(".dist-info")


def engine_source_files(vllm_src: Path | None, sglang_src: Path | None, index: Path) -> dict[str, str]:
    import json
    from importlib.metadata import version as installed

    from tools.archgen.engine_sources import generate_producer_linear, generate_sglang_sources, generate_vllm

    files: dict[str, str] = {}
    pinned = json.loads(index.read_text()).get("transformers")
    if installed("transformers") == pinned:  # the producer file follows the patterns' transformers
        files.update(generate_producer_linear(index))
    else:
        print(f"producer/transformers_linear.json not regenerated: transformers {installed('transformers')} is "
              f"installed, the patterns are from {pinned}", file=sys.stderr)  # fmt: skip
    if vllm_src is not None:
        version = _wheel_version(vllm_src, "vllm")
        files.update(generate_vllm(vllm_src / "vllm" / "model_executor" / "models", version, index))
    if sglang_src is not None:
        files.update(generate_sglang_sources(sglang_src / "sglang" / "srt" / "models",
                                             _wheel_version(sglang_src, "sglang"), index))
    else:
        from tools.archgen.sglang_facts import sglang_source_files

        files.update(sglang_source_files())
    return files


if __name__ == "__main__":
    raise SystemExit(main())
