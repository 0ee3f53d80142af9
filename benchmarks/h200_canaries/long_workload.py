"""Point a matrix folder's non-MLA tiny workload at a long-position model with the passkey task (issue 31).

    python long_workload.py WORKLOADS_TOML MODEL_DIR LENGTH...

Rewrites `[workloads.tiny-llama-any]` of WORKLOADS_TOML (a copy of benchmarks/h200_engine/workloads.toml in run.sh's
matrix folder): its model is MODEL_DIR (benchmarks/train_long_passkey.py's output), max_model_len 32784 (the 32k
documents and their answer), and `long_context` asks the passkey task at the LENGTHs, 5 depths, with enough keys
a depth for policy.toml's 200 documents. The model answers no gsm8k, so it has no expected accuracy: its gsm8k
comparisons are between answers that are all wrong, and the passkey task is what this root judges.
"""

from __future__ import annotations

import math
import re
import sys
import tomllib
from pathlib import Path

DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
MIN_DOCUMENTS = 200  # matrix/policy.toml [accuracy] min_n
MAX_MODEL_LEN = 32784


def block(model: str, lengths: list[int], archs: list[str]) -> str:
    keys = math.ceil(MIN_DOCUMENTS / (len(DEPTHS) * len(lengths)))
    quoted = ", ".join(f'"{arch}"' for arch in archs)
    return (f'[workloads.tiny-llama-any]\nmodel = "{model}"\nmla = false\narchs = [{quoted}]\n'
            f"model_args = {{ max_model_len = {MAX_MODEL_LEN}, enforce_eager = false, gpu_memory_utilization = 0.08 }}\n"
            f"long_context = {{ lengths = [{', '.join(map(str, lengths))}], "
            f"depths = [{', '.join(map(str, DEPTHS))}], keys_per_depth = {keys} }}\n\n")


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    path, model, lengths = Path(argv[0]), argv[1], sorted({int(n) for n in argv[2:]})
    if not (Path(model) / "config.json").is_file():
        print(f"long_workload: {model}/config.json is missing: train the model first (train_long_passkey.py)",
              file=sys.stderr)
        return 2
    text = path.read_text()
    archs = tomllib.loads(text)["workloads"]["tiny-llama-any"]["archs"]
    found = re.search(r"^\[workloads\.tiny-llama-any\]\n(?:(?!\[).*\n)*", text, flags=re.M)
    if found is None:
        print(f"long_workload: {path} has no [workloads.tiny-llama-any]", file=sys.stderr)
        return 2
    text = text[:found.start()] + block(model, lengths, archs) + text[found.end():]
    tomllib.loads(text)  # still TOML
    path.write_text(text)
    print(f"long_workload: tiny-llama-any is {model}: passkey at {lengths}, "
          f"{math.ceil(MIN_DOCUMENTS / (len(DEPTHS) * len(lengths)))} keys a depth")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
