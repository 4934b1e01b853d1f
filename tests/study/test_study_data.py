"""The study's corpus: positional split, bytes or a tokenizer, clear errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hallamonic.data import DataError
from hallamonic.study.data import load_study_corpus
from hallamonic.study.recipe import StudyDataSection


def test_bytes_split_by_position_covers_the_file_in_order(enwik8_path):
    corpus = load_study_corpus(StudyDataSection(path=str(enwik8_path), max_bytes=10_000, valid_fraction=0.1, test_fraction=0.2))
    raw = np.frombuffer(enwik8_path.read_bytes()[:10_000], dtype=np.uint8)
    assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (7000, 1000, 2000)
    assert np.array_equal(np.concatenate([corpus.train, corpus.valid, corpus.test]), raw)
    assert corpus.vocab_size == 256 and corpus.unit == "bits per byte"


def test_a_tokenizer_folder_gives_bits_per_token(tmp_path, enwik8_path):
    from hallamonic.tiny import build_tiny_tokenizer

    build_tiny_tokenizer(300).save_pretrained(tmp_path / "tok")
    corpus = load_study_corpus(StudyDataSection(path=str(enwik8_path), max_bytes=5_000, tokenizer=str(tmp_path / "tok")))
    assert corpus.unit == "bits per token" and corpus.vocab_size >= 300
    assert 0 < len(corpus.train) < 5_000 and corpus.train.max() < corpus.vocab_size


def test_missing_file_and_bad_tokenizer_are_named(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_study_corpus(StudyDataSection(path=str(tmp_path / "nope.txt")))
    (tmp_path / "a.txt").write_text("hello " * 100)
    with pytest.raises(DataError, match="cannot load tokenizer"):
        load_study_corpus(StudyDataSection(path=str(tmp_path / "a.txt"), tokenizer=str(tmp_path / "no-tokenizer")))


def test_a_datasets_builder_with_one_file_per_split_is_streamed(tmp_path, enwik8_path):
    """`data.dataset: json` + `data.data_files: {train, validation, test}`: the dataset path, with no hub."""
    from hallamonic.study.recipe import load_study_recipe

    raw = enwik8_path.read_bytes()[:6_000].decode("utf-8", errors="ignore")
    parts = {"train": raw[:4000], "validation": raw[4000:5000], "test": raw[5000:]}
    files = {}
    for split, text in parts.items():
        files[split] = tmp_path / f"{split}.jsonl"
        files[split].write_text("\n".join(json.dumps({"text": line}) for line in text.split("\n")))
    mapping = "{" + ", ".join(f"{split}: {path}" for split, path in files.items()) + "}"
    recipe = load_study_recipe("study-ci", ["data.path=null", "data.dataset=json", f"data.data_files={mapping}"])
    assert recipe.data.path is None and recipe.data.data_files == {k: str(v) for k, v in files.items()}
    corpus = load_study_corpus(recipe.data)
    for split, ours in (("train", corpus.train), ("validation", corpus.valid), ("test", corpus.test)):
        assert ours.tobytes() == parts[split].encode("utf-8")  # records joined by newlines: the text back
    assert corpus.source == "hub:json" and corpus.unit == "bits per byte"


def test_a_dataset_without_the_three_splits_is_refused(tmp_path):
    (tmp_path / "all.jsonl").write_text(json.dumps({"text": "hello world"}) + "\n")
    with pytest.raises(DataError, match=r"no \['validation', 'test'\] split\(s\); give `data.data_files` one file per split"):
        load_study_corpus(StudyDataSection(dataset="json", data_files=str(tmp_path / "all.jsonl")))
