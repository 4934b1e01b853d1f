"""Training data: sources, held-out split, tokenized stream."""

from __future__ import annotations

import json

import pytest

from hallamonic.convert.data import is_heldout, iter_documents, tokenize_stream
from hallamonic.convert.recipe import DataSection
from hallamonic.data import DataError
from hallamonic.tiny import build_tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def test_local_sources_yield_documents(tmp_path):
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": f"doc {i}"}) for i in range(3)) + "\n")
    (tmp_path / "b.txt").write_text("first paragraph\n\nsecond paragraph\n")
    assert list(iter_documents(DataSection(path=str(tmp_path / "a.jsonl")))) == ["doc 0", "doc 1", "doc 2"]
    assert list(iter_documents(DataSection(path=str(tmp_path / "b.txt")))) == ["first paragraph", "second paragraph\n"]
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"content": ["x y", "z"]}), tmp_path / "c.parquet")
    assert list(iter_documents(DataSection(path=str(tmp_path / "c.parquet"), text_field="content"))) == ["x y", "z"]


def test_bad_sources_name_the_file(tmp_path):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"body": "no text field"}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: no `text` field"):
        list(iter_documents(DataSection(path=str(tmp_path / "bad.jsonl"))))
    with pytest.raises(DataError, match="does not exist"):
        list(iter_documents(DataSection(path=str(tmp_path / "missing.jsonl"))))
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported data file type"):
        list(iter_documents(DataSection(path=str(tmp_path / "x.csv"))))


def test_heldout_documents_never_reach_the_training_stream(tmp_path, tokenizer):
    docs = [f"document number {i} " + "word " * (i % 7) for i in range(200)]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in docs))
    section = DataSection(path=str(tmp_path / "d.jsonl"), heldout_fraction=0.1)
    held = [i for i in range(200) if is_heldout(i, 0, 0.1)]
    assert 5 < len(held) < 40
    train = tokenize_stream(tokenizer, section, seed=0, max_tokens=10**6)
    test = tokenize_stream(tokenizer, section, seed=0, max_tokens=10**6, heldout=True)
    text_train = tokenizer.decode(train.tolist())
    text_test = tokenizer.decode(test.tolist())
    for i in range(200):
        marker = f"document number {i} "
        assert (marker in text_test) == (i in held)
        assert (marker in text_train) == (i not in held)
    assert (train == tokenizer.eos_token_id).sum() == 200 - len(held)  # one separator per document


def test_a_datasets_builder_streams_local_files_through_the_recipe(tmp_path, tokenizer):
    """`data.dataset: json` + `data.data_files`: the streamed-dataset path, with no hub."""
    from hallamonic.convert.recipe import load_recipe

    docs = [f"document number {i} " + "word " * (i % 5) for i in range(30)]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"text": d, "id": i}) for i, d in enumerate(docs)))
    section = load_recipe("tiny", ["data.dataset=json", f"data.data_files={tmp_path / 'd.jsonl'}"]).data
    assert section.path is None and section.config is None
    assert list(iter_documents(section)) == docs
    from_file = tokenize_stream(tokenizer, DataSection(path=str(tmp_path / "d.jsonl")), seed=0, max_tokens=10**6)
    streamed = tokenize_stream(tokenizer, section, seed=0, max_tokens=10**6)
    assert streamed.tolist() == from_file.tolist()  # the same documents, the same held-out split
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": docs[:3]}), tmp_path / "d.parquet")
    section = DataSection(dataset="parquet", config=None, data_files={"train": str(tmp_path / "d.parquet")}, text_field="body")
    assert list(iter_documents(section)) == docs[:3]


def test_a_dataset_that_cannot_be_streamed_is_named(tmp_path):
    section = DataSection(dataset="json", config=None, data_files=str(tmp_path / "missing-*.jsonl"))
    with pytest.raises(DataError, match=r"cannot stream dataset 'json' \(split 'train', data_files '.*missing-\*.jsonl'\)"):
        list(iter_documents(section))
    (tmp_path / "d.jsonl").write_text(json.dumps({"content": "x"}) + "\n")
    with pytest.raises(DataError, match=r"dataset 'json' has no `text` field \(found \['content'\]\)"):
        list(iter_documents(DataSection(dataset="json", config=None, data_files=str(tmp_path / "d.jsonl"))))
