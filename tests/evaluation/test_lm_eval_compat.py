"""lm-eval-harness's own LAMBADA scoring agrees with `hallamonic eval --task lambada`.

The task below copies the harness's `lambada_openai` definition (same doc_to_text /
doc_to_target / metrics) but reads a local JSONL, so the test runs offline.
"""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("lm_eval", reason="lm-eval-harness not installed (pip install lm-eval)")

TASK_YAML = """\
task: lambada_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{text.split(' ')[:-1]|join(' ')}}}}"
doc_to_target: "{{{{' '+text.split(' ')[-1]}}}}"
metric_list:
  - metric: perplexity
    aggregation: perplexity
    higher_is_better: false
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def test_harness_and_hallamonic_agree_on_lambada(checkpoint, lambada_file, tmp_path, monkeypatch):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from hallamonic.evaluation.data import lambada_texts
    from hallamonic.evaluation.lambada import evaluate_lambada
    from hallamonic.loading import load_causal_lm

    # max_length: the tiny model's 64-token RoPE window would make the harness cut contexts.
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "lambada_local.yaml").write_text(TASK_YAML.format(data=lambada_file))
    # max_length: else the harness cuts contexts to the tiny model's 64-token RoPE window.
    out = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={checkpoint},trust_remote_code=True,dtype=float32,max_length=512",
        tasks=["lambada_local"],
        task_manager=TaskManager(include_path=str(tasks)),
        batch_size=1,
        device="cpu",
    )
    harness = out["results"]["lambada_local"]

    model, tokenizer = load_causal_lm(checkpoint)
    ours = evaluate_lambada(model, tokenizer, lambada_texts(lambada_file, None), progress=False)
    print(json.dumps({"harness": {k: v for k, v in harness.items() if "stderr" not in k}, "ours": ours}))
    assert math.isclose(harness["perplexity,none"], ours["perplexity"], rel_tol=1e-4)
    assert harness["acc,none"] == ours["accuracy"]
