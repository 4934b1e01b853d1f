"""Write a phase-2 training file that interleaves FineWeb-Edu text with the two shared novels.

Why: LAMBADA's passages come from novels (BookCorpus), and phase 2 on FineWeb-Edu text already
recalled better than on FineWeb (evals/results/smollm2-135m-phase2-sweep/lambada-1000). This asks
whether narrative text in phase 2 helps recall more, at what cost in FineWeb-Edu bits.

    python evals/results/smollm2-135m-phase2-sweep/make_mix.py outputs/mix/edu-books.jsonl

The output is derived from ../shared/data at run time (never committed): JSONL records of about
CHUNK characters, alternating FineWeb-Edu pieces (cut at sentence ends) and novel chapters (the
Gutenberg header and licence dropped, hard-wrapped lines joined into paragraphs, chapters cut to
the same size at paragraph ends), taken so each source has given the same number of characters.
"""
import json
import re
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data"
CHUNK = 6000  # characters per record (~1,400 tokens)
BOOKS = ("pg1342_pride_and_prejudice.txt", "pg3261_news_from_nowhere.txt")


def novel_pieces(name: str) -> list[str]:
    """The novel's body as paragraphs joined into pieces of at most ~CHUNK characters."""
    text = (DATA / name).read_text(encoding="utf-8-sig").replace("\r\n", "\n")
    body = re.split(r"\*\*\* ?START OF[^\n]*\n", text, maxsplit=1)[1]
    body = re.split(r"\*\*\* ?END OF|End of (the )?Project Gutenberg", body, maxsplit=1)[0]
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", body)]
    paragraphs = [p for p in paragraphs if p and not p.lower().startswith(("produced by", "chapter "))]
    return _pack(paragraphs, "\n\n")


def edu_pieces() -> list[str]:
    """FineWeb-Edu's training head cut at sentence ends into pieces of ~CHUNK characters."""
    text = (DATA / "fineweb_edu_head_train.txt").read_text(encoding="utf-8")
    return _pack(re.split(r"(?<=[.!?])\s+", text), " ")


def _pack(units: list[str], joiner: str) -> list[str]:
    pieces, current, size = [], [], 0
    for unit in units:
        current.append(unit)
        size += len(unit)
        if size >= CHUNK:
            pieces.append(joiner.join(current))
            current, size = [], 0
    if current:
        pieces.append(joiner.join(current))
    return pieces


def main(out: str) -> None:
    books = [piece for name in BOOKS for piece in novel_pieces(name)]
    sources = {"edu": edu_pieces(), "books": books}
    given = {name: 0 for name in sources}
    records = []
    while any(sources.values()):
        name = min((n for n in sources if sources[n]), key=lambda n: given[n])  # the source behind
        piece = sources[name].pop(0)
        given[name] += len(piece)
        records.append({"text": piece, "source": name})
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    print(f"{out}: {len(records)} records, characters {given}")


if __name__ == "__main__":
    main(sys.argv[1])
