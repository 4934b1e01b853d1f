"""The one text reader and dataset opener of convert, study and evaluation."""

from __future__ import annotations

import json

import pytest

from hallamonic.data import DataError, iter_texts, record_texts, stream_dataset


def test_plain_text_is_cut_as_the_caller_needs(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("\ufefffirst line\nsecond line\n\n\nthird\n", encoding="utf-8")  # a BOM is not text
    assert list(iter_texts(path)) == ["first line\nsecond line", "\nthird\n"]
    assert list(iter_texts(path, plain_text="lines")) == ["first line", "second line", "third"]
    assert list(iter_texts(path, plain_text="whole")) == ["first line\nsecond line\n\n\nthird\n"]
    (tmp_path / "b.tokens").write_text("a @-@ b\n")
    assert list(iter_texts(tmp_path / "b.tokens", plain_text="lines")) == ["a @-@ b"]


def test_jsonl_and_parquet_records(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps({"body": "x"}) + "\n\n" + json.dumps({"body": "y"}) + "\n")
    assert list(iter_texts(tmp_path / "a.jsonl", text_field="body")) == ["x", "y"]
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["p", "q"]}), tmp_path / "c.parquet")
    assert list(iter_texts(tmp_path / "c.parquet")) == ["p", "q"]
    with pytest.raises(DataError, match=r"c.parquet: no `body` column \(found \['text'\]\)"):
        list(iter_texts(tmp_path / "c.parquet", text_field="body"))


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("bad.jsonl", '{"text": "ok"}\n{"text": \n', r"bad.jsonl:2: not valid JSON"),
        ("bad.jsonl", '{"body": "no text"}\n', r"bad.jsonl:1: no `text` field \(found \['body'\]\)"),
        ("bad.jsonl", '["a list"]\n', r"bad.jsonl:1: no `text` field \(found list\)"),
        ("bad.jsonl", '{"text": 3}\n', r"bad.jsonl:1: the `text` field is not a string \(int\)"),
        ("x.csv", "a,b\n", r"x.csv: unsupported data file type '.csv'"),
    ],
)
def test_bad_files_name_the_file_and_line(tmp_path, name, content, message):
    (tmp_path / name).write_text(content)
    with pytest.raises(DataError, match=message):
        list(iter_texts(tmp_path / name))


def test_a_missing_file_is_named_before_anything_is_read(tmp_path):
    with pytest.raises(DataError, match=r"data file .*nope.jsonl does not exist"):
        iter_texts(tmp_path / "nope.jsonl")


def test_datasets_are_streamed_and_their_records_read(tmp_path):
    import datasets

    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": f"t{i}", "n": i}) for i in range(4)))
    stream = stream_dataset("json", data_files=str(tmp_path / "a.jsonl"), split="train")
    assert isinstance(stream, datasets.IterableDataset)  # nothing read up front
    assert list(record_texts(stream, "text", "json")) == ["t0", "t1", "t2", "t3"]
    with pytest.raises(DataError, match=r"dataset 'json' has no `body` field \(found \['n', 'text'\]\)"):
        list(record_texts(stream, "body", "json"))
    splits = stream_dataset("json", data_files={"train": str(tmp_path / "a.jsonl"), "test": str(tmp_path / "a.jsonl")})
    assert isinstance(splits, datasets.IterableDatasetDict) and set(splits) == {"train", "test"}
