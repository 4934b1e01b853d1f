"""`hallamonic study` end to end on a tiny setting: protocol, report, resume, refusals."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from hallamonic.cli import app
from hallamonic.study import runner
from hallamonic.study.recipe import ARCHITECTURES, load_study_recipe

CLI = CliRunner()


def study(out, overrides, *extra):
    args = ["study", "study-ci", "-o", str(out)] + [a for o in overrides for a in ("--set", o)] + list(extra)
    return CLI.invoke(app, args)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, enwik8_path):
    """The bundled CI recipe as shipped (only the data file's absolute path is set)."""
    out = tmp_path_factory.mktemp("study")
    overrides = [f"data.path={enwik8_path}"]
    result = study(out, overrides)
    assert result.exit_code == 0, result.output
    return out, overrides, result.output


def test_every_model_and_context_is_trained_under_one_protocol(finished):
    out, _, output = finished
    results = json.loads((out / "results.json").read_text())
    models = load_study_recipe("study-ci").models
    assert set(results["models"]) == set(models) == set(ARCHITECTURES[:5]) | {"harmonic-diagonal"}
    records = [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*/ctx-*/result.json"))]
    assert len(records) == len(models) * 2
    # Same steps, tokens and test windows for every model at a context: only the architecture differs.
    for context in (64, 128):
        same = {(r["steps"], r["tokens"], r["test_windows"]) for r in records if r["context"] == context}
        assert len(same) == 1, same
    target = results["models"]["harmonic"]["params"]
    for name, entry in results["models"].items():
        assert abs(entry["params"] - target) <= 0.05 * target
        assert set(entry["bits"]) == {"64", "128"} and all(0 < b < 8 for b in entry["bits"].values()), (name, entry)
    for name in results["models"]:  # every model learned something: last logged loss below the first
        rows = [json.loads(line) for line in (out / "runs" / name / "ctx-128" / "metrics.jsonl").read_text().splitlines()]
        assert rows[-1]["loss"] < rows[0]["loss"] < math.log(256) + 0.5, name
    assert "parameters" in output and "gap vs transformer" in output


def test_gaps_and_ablation_deltas_follow_from_the_bits(finished):
    out, _, _ = finished
    results = json.loads((out / "results.json").read_text())
    bits = {name: entry["bits"] for name, entry in results["models"].items()}
    for base in ("transformer", "mamba"):
        for c, gap in results["gap_percent"][base].items():
            assert gap == pytest.approx(100 * (bits[base][c] - bits["harmonic"][c]) / bits[base][c])
    for name in ("harmonic-no-hierarchy", "harmonic-raw-states"):
        for c, delta in results["variant_delta_bits"][name].items():
            assert delta == pytest.approx(bits[name][c] - bits["harmonic"][c])
        for base in ("transformer", "mamba"):
            gaps = results["variant_gap_percent"][name][base]
            assert set(gaps) == {"64", "128"}
            for c, gap in gaps.items():
                assert gap == pytest.approx(100 * (bits[base][c] - bits[name][c]) / bits[base][c])
    table = (out / "results.md").read_text()
    assert "| harmonic |" in table and "gap vs mamba" in table
    for png in ("bits_vs_context.png", "training_curves.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resume_keeps_finished_runs_and_redoes_a_missing_one_identically(finished):
    out, overrides, _ = finished
    lost = out / "runs" / "mamba" / "ctx-128" / "result.json"
    before = json.loads(lost.read_text())
    kept = out / "runs" / "harmonic" / "ctx-64" / "result.json"
    kept_text = kept.read_text()
    lost.unlink()
    result = study(out, overrides, "--resume")
    assert result.exit_code == 0, result.output
    assert "[harmonic @ 64] done earlier" in result.output
    assert kept.read_text() == kept_text
    assert json.loads(lost.read_text())["bits"] == before["bits"]  # same seed, data order, steps: same model


def test_a_run_interrupted_mid_training_resumes_from_its_checkpoint(tmp_path, tiny_overrides, monkeypatch):
    overrides = tiny_overrides + ["models=[harmonic]", "contexts=[32]"]
    reference = runner.run_study(load_study_recipe("study-ci", overrides), tmp_path / "a", echo=lambda *_: None)

    calls = {"n": 0}
    real_loss = runner.next_token_loss

    def crash_on_third_step(model, batch):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_loss(model, batch)

    recipe = load_study_recipe("study-ci", overrides)
    monkeypatch.setattr(runner, "next_token_loss", crash_on_third_step)
    with pytest.raises(KeyboardInterrupt):
        runner.run_study(recipe, tmp_path / "b", echo=lambda *_: None)
    assert (tmp_path / "b" / "runs" / "harmonic" / "ctx-32" / "checkpoints" / "step-000002").is_dir()
    monkeypatch.setattr(runner, "next_token_loss", real_loss)
    resumed = runner.run_study(recipe, tmp_path / "b", resume=True, echo=lambda *_: None)
    record = json.loads((tmp_path / "b" / "runs" / "harmonic" / "ctx-32" / "result.json").read_text())
    assert record["resumed_from_step"] == 2
    assert resumed["models"]["harmonic"]["bits"] == reference["models"]["harmonic"]["bits"]


def test_existing_folder_and_changed_recipe_are_refused(finished):
    out, overrides, _ = finished
    result = study(out, overrides)
    assert result.exit_code == 2 and "--resume" in result.output
    result = study(out, overrides + ["train.lr=0.01"], "--resume")
    assert result.exit_code == 2 and "different recipe" in result.output


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    result = study(tmp_path / "x", [f"data.path={tmp_path / 'missing.txt'}"])
    assert result.exit_code == 2 and "does not exist" in result.output
    assert not (tmp_path / "x").exists()


def test_a_diverging_run_is_recorded_and_the_study_goes_on(tmp_path, tiny_overrides, monkeypatch):
    real_loss = runner.next_token_loss

    def nan_for_transformers(model, batch):
        loss = real_loss(model, batch)
        return loss * float("nan") if model.config.model_type == "llama" else loss

    monkeypatch.setattr(runner, "next_token_loss", nan_for_transformers)
    recipe = load_study_recipe("study-ci", tiny_overrides + ["models=[harmonic, transformer]", "contexts=[32]"])
    results = runner.run_study(recipe, tmp_path, echo=lambda *_: None)
    assert results["models"]["transformer"]["failed"] == {"32": "diverged"}
    assert "32" in results["models"]["harmonic"]["bits"] and results["gap_percent"]["transformer"] == {}
    assert "| transformer |" in (tmp_path / "results.md").read_text()


def test_sessions_running_subsets_share_one_report(tmp_path, tiny_overrides):
    """A GPU study split over sessions: each runs some models or contexts into one folder."""
    quiet = {"echo": lambda *_: None}
    runner.run_study(load_study_recipe("study-ci", tiny_overrides + ["models=[harmonic]", "contexts=[32]"]), tmp_path, **quiet)
    results = runner.run_study(
        load_study_recipe("study-ci", tiny_overrides + ["models=[transformer]", "contexts=[64]"]), tmp_path, resume=True, **quiet
    )
    assert set(results["models"]) == {"harmonic", "transformer"} and results["contexts"] == [32, 64]
    assert set(results["models"]["harmonic"]["bits"]) == {"32"} and set(results["models"]["transformer"]["bits"]) == {"64"}
    for entry in results["models"].values():  # validation bits are scored beside the test bits
        assert entry["valid_bits"].keys() == entry["bits"].keys()


def test_variants_trained_without_harmonic_still_get_their_gaps(tmp_path, tiny_overrides):
    """One more seed of a variant and a baseline alone: no `harmonic` row, yet the gaps are reported."""
    recipe = load_study_recipe("study-ci", tiny_overrides + ["models=[harmonic-diagonal, transformer]", "contexts=[32]"])
    results = runner.run_study(recipe, tmp_path, echo=lambda *_: None)
    bits = {name: entry["bits"]["32"] for name, entry in results["models"].items()}
    assert results["gap_percent"] == {"transformer": {}}
    gap = results["variant_gap_percent"]["harmonic-diagonal"]["transformer"]["32"]
    assert gap == pytest.approx(100 * (bits["transformer"] - bits["harmonic-diagonal"]) / bits["transformer"])
    table = (tmp_path / "results.md").read_text()
    assert f"| harmonic-diagonal vs transformer | {gap:+.2f}% |" in table
    assert "gap vs transformer" not in table and "- harmonic (bits)" not in table  # no rows of dashes only


def test_mambas_mixer_in_the_llama_layout_trains_and_is_a_baseline_of_the_report(tmp_path, tiny_overrides):
    recipe = load_study_recipe("study-ci", tiny_overrides + ["models=[harmonic, mamba-llama-layout]", "contexts=[32]"])
    results = runner.run_study(recipe, tmp_path, echo=lambda *_: None)
    bits = {name: entry["bits"]["32"] for name, entry in results["models"].items()}
    gap = results["gap_percent"]["mamba-llama-layout"]["32"]
    assert gap == pytest.approx(100 * (bits["mamba-llama-layout"] - bits["harmonic"]) / bits["mamba-llama-layout"])
    assert f"| gap vs mamba-llama-layout | | {gap:+.2f}% |" in (tmp_path / "results.md").read_text()
    record = json.loads((tmp_path / "runs" / "mamba-llama-layout" / "ctx-32" / "result.json").read_text())
    assert record["implementation"].startswith(("transformers PyTorch path", "mamba_ssm"))  # not "attention"


def test_context_bands_train_each_context_with_its_own_bands(tmp_path, tiny_overrides):
    from hallamonic.study.recipe import context_bands

    recipe = load_study_recipe("study-ci", tiny_overrides + ["models=[harmonic]", "model.timescale_bands=context"])
    runner.run_study(recipe, tmp_path, echo=lambda *_: None)
    for context in (32, 64):
        saved = json.loads((tmp_path / "runs" / "harmonic" / f"ctx-{context}" / "config.json").read_text())
        assert [tau for band in saved["timescale_bands"] for tau in band] == pytest.approx(
            [tau for band in context_bands(context) for tau in band]
        )


def test_wikitext_with_a_tokenizer_reports_bits_per_token(tmp_path, enwik8_path):
    """The WikiText setting: a local WikiText file, split by position, with the recipe's tokenizer."""
    from hallamonic.tiny import build_tiny_tokenizer

    wikitext = enwik8_path.parent / "wikitext2_raw_test.txt"
    if not wikitext.is_file():
        pytest.skip(f"needs {wikitext}")
    build_tiny_tokenizer(400).save_pretrained(tmp_path / "tok")
    recipe = load_study_recipe("study-ci", [
        f"data.path={wikitext}", f"data.tokenizer={tmp_path / 'tok'}", "data.max_bytes=200000",
        "models=[harmonic, transformer]", "contexts=[32]", "train.tokens=1024", "train.batch_tokens=256",
        "eval.tokens=512", "model.hidden_size=16", "model.intermediate_size=48",
    ])
    results = runner.run_study(recipe, tmp_path / "out", echo=lambda *_: None)
    assert results["unit"] == "bits per token"
    vocab = json.loads((tmp_path / "out" / "runs" / "harmonic" / "ctx-32" / "config.json").read_text())["vocab_size"]
    assert vocab >= 400
    for entry in results["models"].values():
        assert 0 < entry["bits"]["32"] < math.log2(vocab) + 1


def test_micro_batches_give_the_step_of_the_whole_batch(tmp_path, tiny_overrides):
    """Gradient accumulation: 2 micro-batches of 1 sequence train exactly like 1 batch of 2."""
    from safetensors.torch import load_file

    from hallamonic.study.data import load_study_corpus
    from hallamonic.study.models import build_architectures
    from hallamonic.study.recipe import load_study_recipe as load

    weights = {}
    for micro in (None, 64):
        recipe = load("study-ci", tiny_overrides + ["models=[harmonic]", "contexts=[64]", "train.batch_tokens=128",
                                                     "train.tokens=128", f"train.micro_batch_tokens={micro or 'null'}"])
        corpus = load_study_corpus(recipe.data)
        arch = build_architectures(recipe.model, corpus.vocab_size, ["harmonic"], 64)["harmonic"]
        runner.train_one(recipe, arch, 64, corpus, tmp_path / str(micro), resume=False)
        weights[micro] = load_file(tmp_path / str(micro) / "runs" / "harmonic" / "ctx-64" / "model.safetensors")
    for key, whole in weights[None].items():
        torch.testing.assert_close(weights[64][key], whole, atol=1e-6, rtol=1e-5)
