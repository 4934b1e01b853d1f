"""The README's table: the study's rows (../study-enwik8-cpu-two-level/seed*/results.json) beside
Mamba's mixer in the Llama layout (results.jsonl, from mixer.sh): means of seeds 0-2, test bits."""
import json
from pathlib import Path

HERE = Path(__file__).parent
CONTEXTS = ("256", "512", "1024", "2048")
rows: dict[str, dict[str, dict[int, tuple[float, float]]]] = {}
for seed in (0, 1, 2):
    models = json.loads((HERE.parent / f"study-enwik8-cpu-two-level/seed{seed}/results.json").read_text())["models"]
    for name in ("harmonic-two-level", "harmonic-two-level-no-hierarchy", "mamba"):
        for c in CONTEXTS:
            rows.setdefault(name, {}).setdefault(c, {})[seed] = (models[name]["valid_bits"][c], models[name]["bits"][c])
for line in (HERE / "results.jsonl").read_text().splitlines():
    r = json.loads(line)  # name: mamba-mixer-in-llama-CONTEXT-sSEED
    seed = int(r["name"].rsplit("-s", 1)[1])
    rows.setdefault("mamba mixer, Llama layout", {}).setdefault(str(r["ctx"]), {})[seed] = (r["valid"], r["test"])


def mean(name: str, c: str, i: int) -> float:
    values = [v[i] for v in rows[name][c].values()]
    return sum(values) / len(values)


print("| model (mean of 3 seeds: valid / test) | " + " | ".join(CONTEXTS) + " |")
print("|---|" + "---:|" * len(CONTEXTS))
for name in rows:
    print(f"| {name} | " + " | ".join(f"{mean(name, c, 0):.3f} / {mean(name, c, 1):.3f}" for c in CONTEXTS) + " |")
for ref in ("mamba mixer, Llama layout", "mamba"):
    for name in ("harmonic-two-level", "harmonic-two-level-no-hierarchy"):
        gaps = [100 * (mean(name, c, 1) / mean(ref, c, 1) - 1) for c in CONTEXTS]
        print(f"| {name} behind {ref} (test) | " + " | ".join(f"{g:+.1f}%" for g in gaps) + " |")
