"""Means over seeds 0-2 and paired differences against the default init (gain 1.2), whose runs are
the committed study results of the same code (harmonic: study-enwik8-cpu-two-level/seed0, seed1
and study-enwik8-cpu-layout/harmonic-seed2; harmonic-two-level: study-enwik8-cpu-two-level/seed0-2)."""

import json
from pathlib import Path
from statistics import mean

HERE = Path(__file__).parent
RESULTS = HERE.parent
DEFAULT = {
    "harmonic": ["study-enwik8-cpu-two-level/seed0", "study-enwik8-cpu-two-level/seed1", "study-enwik8-cpu-layout/harmonic-seed2"],
    "harmonic-two-level": [f"study-enwik8-cpu-two-level/seed{s}" for s in range(3)],
}
MAMBA_TEST = {1024: 2.581, 2048: 2.712}  # Mamba's three-seed test means (study-enwik8-cpu-layout)

rows = [json.loads(line) for line in (HERE / "results.jsonl").read_text().splitlines()]
for model, folders in DEFAULT.items():
    for seed, folder in enumerate(folders):
        bits = json.loads((RESULTS / folder / "results.json").read_text())["models"][model]
        for context in (1024, 2048):
            rows.append({"model": model, "level_gain": 1.2, "context": context, "seed": seed,
                         "valid_bits": bits["valid_bits"][str(context)], "test_bits": bits["bits"][str(context)]})

print("| model | level gain | valid 1K | valid 2K | test 1K | test 2K | vs gain 1.2, valid 1K / 2K (paired) | test behind Mamba 1K / 2K |")
print("|---|---:|---:|---:|---:|---:|---|---|")
for model in DEFAULT:
    for gain in sorted({r["level_gain"] for r in rows if r["model"] == model}, reverse=True):
        pick = lambda c, key, g=gain: [r[key] for r in sorted(rows, key=lambda r: r["seed"]) if (r["model"], r["level_gain"], r["context"]) == (model, g, c)]  # noqa: E731
        cells = [mean(pick(c, k)) for k in ("valid_bits", "test_bits") for c in (1024, 2048)]
        deltas = [mean(a - b for a, b in zip(pick(c, "valid_bits"), pick(c, "valid_bits", 1.2))) for c in (1024, 2048)]
        behind = [100 * (cells[2 + i] / MAMBA_TEST[c] - 1) for i, c in enumerate((1024, 2048))]
        print(f"| {model} | {gain} | " + " | ".join(f"{x:.3f}" for x in cells)
              + f" | {deltas[0]:+.3f} / {deltas[1]:+.3f} | {behind[0]:.1f} / {behind[1]:.1f}% |")
