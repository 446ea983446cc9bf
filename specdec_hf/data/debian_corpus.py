"""Deterministic builder of the two offline corpora used by the demo verifier and the drafter.

Model and dataset hubs are unreachable from the machines this project is developed on, but Debian's package
archive is reachable through `apt-get`. This module turns Debian packages into two small, human-made corpora:

* **translation** (English → German): sentence pairs from
    - the Ding dictionary's example sentences (`trans-de-en`, GPL-2+), one group per dictionary line;
    - the LibreOffice help, paragraphs matched by help file and `<p id="par_id…">` (`libreoffice-help-en-us`,
      `libreoffice-help-de`, MPL-2.0), one group per help file;
    - Debian package descriptions and their German translations (DDTP), matched by `Description-md5`, long
      descriptions aligned paragraph by paragraph and synopses one to one, one group per source package.
  Only 1-to-1 sentence matches are kept (equal sentence counts, char-length ratio ≤ 2.2, 2–60 words per side).
  The man pages, Debian manuals and GNOME help of the same Debian archive are **left out** (about 20k pairs, costly
  to parse from roff/DocBook/Mallard); the corpus is therefore ~75% of the size given there.
* **summarization** (English): a package's long description → its one-line synopsis (prose only, 15–400 words,
  duplicate documents removed).

Both corpora are split by document group (a stable hash of the group name), so no dictionary line, help file or
source package straddles two splits; validation/test rows whose English text also occurs in train are removed.

Example:

```bash
python -m specdec_hf.data.debian_corpus --task translation --output_dir data/debian_en_de
python -m specdec_hf.data.debian_corpus --task summarization --output_dir data/debian_sum
```

Only the standard library and `apt-get` (plus `apt-helper`, shipped with apt, to decompress the lz4 index files)
are used.
"""

from __future__ import annotations

import argparse
import hashlib
import html
import io
import json
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

TRANSLATION_PACKAGES = ("trans-de-en", "libreoffice-help-en-us", "libreoffice-help-de")
# Per-mille of groups sent to validation and test: [0, VAL) -> validation, [VAL, TEST) -> test, rest -> train.
MT_SPLIT_PER_MILLE = (17, 36)
SUM_SPLIT_PER_MILLE = (19, 39)
MAX_LENGTH_RATIO = 2.2
MIN_WORDS, MAX_WORDS = 2, 60
SUM_MIN_WORDS, SUM_MAX_WORDS = 15, 400
APT_HELPER = "/usr/lib/apt/apt-helper"

_SENTENCE_BOUNDARY = re.compile(r"(?<=[.!?])\s+(?=[\"'„“‚(]?[A-ZÄÖÜ0-9])")
_DING_ANNOTATION = re.compile(r"\s*(\{[^}]*\}|\[[^\]]*\])")
_LO_PARAGRAPH = re.compile(r'<p id="(par_id[^"]*)"[^>]*>(.*?)</p>', re.DOTALL)
_TAG = re.compile(r"<[^>]+>")
_WHITESPACE = re.compile(r"\s+")
_BULLET = re.compile(r"^\s*([-*+•o]|\d+[.)])\s")

MT_NOTICE = """# Sources and licences

Built by `python -m specdec_hf.data.debian_corpus --task translation` from Debian (bookworm) packages.

- rows with `"source": "ding"` — Ding dictionary example sentences (Debian package `trans-de-en`,
  © Frank Richter, TU Chemnitz), GPL-2+.
- rows with `"source": "lohelp"` — LibreOffice help (`libreoffice-help-en-us` / `libreoffice-help-de`,
  © The Document Foundation and contributors), MPL-2.0.
- rows with `"source": "ddtp_desc"` / `"ddtp_synopsis"` — Debian package descriptions and their German
  translations (Debian Description Translation Project), under the licences of the respective packages in
  Debian main.
"""

SUM_NOTICE = """# Sources and licences

Built by `python -m specdec_hf.data.debian_corpus --task summarization` from Debian (bookworm) package
descriptions (`Translation-en` index of Debian main): long description → synopsis. Each text is under the licence
of its package in Debian main; `id` is the binary package and `group` its source package.
"""


# ----------------------------------------------------------------------------------------------------------------
# Fetching
# ----------------------------------------------------------------------------------------------------------------
def _run(cmd: list[str], cwd: Path | None = None) -> bytes:
    """Runs a command and returns its stdout, raising a readable error when it is missing or fails."""
    if shutil.which(cmd[0]) is None and not Path(cmd[0]).exists():
        raise RuntimeError(f"`{cmd[0]}` is not available: this builder needs a Debian/Ubuntu system with apt.")
    result = subprocess.run(cmd, cwd=cwd, capture_output=True)
    if result.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(cmd)}` failed ({result.returncode}):\n{result.stderr.decode(errors='replace')}"
        )
    return result.stdout


def apt_update(work_dir: Path) -> Path:
    """
    Downloads the package indices (with English and German descriptions) into a private apt state directory.

    Args:
        work_dir (`Path`): Scratch directory; the indices go to `work_dir / "apt/lists"`.

    Returns:
        `Path`: the lists directory holding the `*.lz4` index files.
    """
    lists, cache = work_dir / "apt" / "lists", work_dir / "apt" / "cache"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    (cache / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    _run(
        [
            "apt-get", "-q", "-o", f"Dir::State::Lists={lists.resolve()}", "-o", f"Dir::Cache={cache.resolve()}",
            "-o", "Acquire::Languages=en,de", "-o", "APT::Sandbox::User=root", "update",
        ]
    )  # fmt: skip
    return lists


def apt_download(packages: Iterable[str], work_dir: Path) -> dict[str, Path]:
    """
    Downloads `.deb` files with `apt-get download`.

    Args:
        packages (`Iterable[str]`): Binary package names.
        work_dir (`Path`): Scratch directory; the files go to `work_dir / "debs"`.

    Returns:
        `dict[str, Path]`: package name → downloaded `.deb`.
    """
    deb_dir = work_dir / "debs"
    deb_dir.mkdir(parents=True, exist_ok=True)
    packages = list(packages)
    _run(["apt-get", "-q", "-o", "APT::Sandbox::User=root", "download", *packages], cwd=deb_dir)
    found = {}
    for name in packages:
        matches = sorted(deb_dir.glob(f"{name}_*.deb"))
        if not matches:
            raise RuntimeError(f"apt-get download did not produce a .deb for {name!r} in {deb_dir}")
        found[name] = matches[-1]
    return found


def iter_deb_files(deb: Path, prefix: str) -> Iterator[tuple[str, bytes]]:
    """
    Yields `(path, content)` for the regular files of a `.deb` whose path starts with `prefix`.

    A `.deb` is an `ar` archive holding `data.tar.{xz,gz,bz2}`; both layers are read with the standard library.

    Args:
        deb (`Path`): The package file.
        prefix (`str`): Path prefix inside the package, e.g. `"usr/share/trans/"`.
    """
    data = deb.read_bytes()
    if not data.startswith(b"!<arch>\n"):
        raise ValueError(f"{deb} is not a Debian package (no ar header)")
    pos = 8
    while pos + 60 <= len(data):
        header = data[pos : pos + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58].decode().strip())
        body = data[pos + 60 : pos + 60 + size]
        pos += 60 + size + (size % 2)
        if not name.startswith("data.tar"):
            continue
        if name.endswith(".zst"):
            raise RuntimeError(f"{deb}: zstd-compressed data members are not supported by the standard library")
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as archive:
            for member in archive:
                path = member.name.removeprefix("./")
                if member.isfile() and path.startswith(prefix):
                    yield path, archive.extractfile(member).read()
        return
    raise ValueError(f"{deb} has no data.tar member")


def read_index(lists: Path, pattern: str) -> str:
    """Decompresses the apt index files matching `pattern` (glob) with `apt-helper cat-file` and joins them."""
    files = sorted(lists.glob(pattern))
    if not files:
        raise RuntimeError(f"no apt index matching {pattern!r} in {lists}; did `apt-get update` fetch it?")
    return "\n\n".join(_run([APT_HELPER, "cat-file", str(f)]).decode("utf-8", errors="replace") for f in files)


def parse_deb822(text: str, fields: tuple[str, ...]) -> Iterator[dict[str, str]]:
    """
    Parses deb822 stanzas (Packages, Translation-*) keeping only `fields`; continuation lines are kept verbatim.

    Args:
        text (`str`): The index text.
        fields (`tuple[str, ...]`): Field names to keep.
    """
    for stanza in text.split("\n\n"):
        record: dict[str, str] = {}
        key = None
        for line in stanza.split("\n"):
            if line.startswith((" ", "\t")):
                if key is not None:
                    record[key] += "\n" + line
            elif ":" in line:
                name, value = line.split(":", 1)
                key = name if name in fields else None
                if key is not None:
                    record[key] = value.strip()
        if record:
            yield record


def source_packages(lists: Path) -> dict[str, str]:
    """Maps binary package → source package from the main `Packages` index."""
    mapping = {}
    for record in parse_deb822(read_index(lists, "*_dists_bookworm_main_binary-*_Packages*"), ("Package", "Source")):
        if "Package" in record:
            mapping[record["Package"]] = record.get("Source", record["Package"]).split(" ")[0]
    return mapping


# ----------------------------------------------------------------------------------------------------------------
# Text helpers
# ----------------------------------------------------------------------------------------------------------------
def normalize(text: str) -> str:
    """Collapses whitespace."""
    return _WHITESPACE.sub(" ", text).strip()


def split_sentences(text: str) -> list[str]:
    """Splits a paragraph into sentences at `.`/`!`/`?` followed by an upper-case letter, digit or quote."""
    return [s for s in (normalize(p) for p in _SENTENCE_BOUNDARY.split(normalize(text))) if s]


def is_good_pair(en: str, de: str) -> bool:
    """Keeps pairs with 2–60 words per side, a char-length ratio ≤ 2.2, and an English side that is not German."""
    en_words, de_words = len(en.split()), len(de.split())
    if not (MIN_WORDS <= en_words <= MAX_WORDS and MIN_WORDS <= de_words <= MAX_WORDS):
        return False
    return max(len(en), len(de)) / min(len(en), len(de)) <= MAX_LENGTH_RATIO and en != de


def align_paragraphs(en: list[str], de: list[str]) -> Iterator[tuple[str, str]]:
    """Pairs sentences of parallel paragraphs, keeping only paragraphs with equal sentence counts (1-to-1)."""
    if len(en) != len(de):
        return
    for en_par, de_par in zip(en, de, strict=True):
        en_sents, de_sents = split_sentences(en_par), split_sentences(de_par)
        if len(en_sents) == len(de_sents):
            yield from zip(en_sents, de_sents, strict=True)


def description_paragraphs(body: str) -> list[str]:
    """Splits a deb822 long description (continuation lines, ` .` separators) into paragraphs of raw lines."""
    paragraphs, current = [], []
    for line in body.split("\n"):
        if line.strip() == ".":
            paragraphs.append("\n".join(current))
            current = []
        else:
            current.append(line[1:] if line.startswith(" ") else line)
    paragraphs.append("\n".join(current))
    return [p for p in paragraphs if p.strip()]


def is_prose(paragraph: str) -> bool:
    """True when no line of a description paragraph is verbatim (two leading spaces) or a list item."""
    return not any(line.startswith(" ") or _BULLET.match(line) for line in paragraph.split("\n"))


def split_of(group: str, per_mille: tuple[int, int]) -> str:
    """Assigns a group to `validation`, `test` or `train` by a stable hash of its name."""
    bucket = int(hashlib.md5(group.encode("utf-8")).hexdigest(), 16) % 1000
    return "validation" if bucket < per_mille[0] else "test" if bucket < per_mille[1] else "train"


# ----------------------------------------------------------------------------------------------------------------
# Translation sources (one function each)
# ----------------------------------------------------------------------------------------------------------------
def ding_pairs(deb: Path) -> Iterator[dict]:
    """
    Example sentences of the Ding dictionary (`de :: en` lines, alternatives separated by `|`).

    An alternative is kept when both sides are single sentences (capitalised, ending in `.`, `!` or `?`).
    The group is `ding:<0-based line number>`.
    """
    for _, content in iter_deb_files(deb, "usr/share/trans/de-en"):
        for line_no, line in enumerate(content.decode("utf-8").split("\n")):
            if line.startswith("#") or " :: " not in line:
                continue
            de_side, en_side = line.split(" :: ", 1)
            de_alts, en_alts = de_side.split(" | "), en_side.split(" | ")
            if len(de_alts) != len(en_alts):
                continue
            for de, en in zip(de_alts, en_alts, strict=True):
                de, en = normalize(_DING_ANNOTATION.sub("", de)), normalize(_DING_ANNOTATION.sub("", en))
                if ";" in de or ";" in en or not all(_is_sentence(s) for s in (de, en)):
                    continue
                yield {"translation": {"en": en, "de": de}, "source": "ding", "group": f"ding:{line_no}"}


def _is_sentence(text: str) -> bool:
    """A single capitalised sentence ending in terminal punctuation."""
    return bool(text) and text[0].isupper() and text[-1] in ".!?" and len(split_sentences(text)) == 1


def _lohelp_paragraphs(content: bytes) -> dict[str, list[str]]:
    """`par_id` → sentences of each `<p id="par_id…">` paragraph of a LibreOffice help page."""
    paragraphs: dict[str, list[str]] = {}
    for par_id, inner in _LO_PARAGRAPH.findall(content.decode("utf-8", errors="replace")):
        if par_id not in paragraphs:
            paragraphs[par_id] = split_sentences(html.unescape(_TAG.sub("", inner)))
    return paragraphs


def lohelp_pairs(deb_en: Path, deb_de: Path) -> Iterator[dict]:
    """
    LibreOffice help paragraphs matched by help file and paragraph id, aligned sentence by sentence.

    The group is `lohelp:<path of the help file below the language directory>`.
    """
    root = "usr/share/libreoffice/help/"
    german = {
        path[len(root) + len("de/") :]: content
        for path, content in iter_deb_files(deb_de, root + "de/")
        if path.endswith(".html")
    }
    for path, content in iter_deb_files(deb_en, root + "en-US/"):
        rel = path[len(root) + len("en-US/") :]
        if rel not in german:
            continue
        en_pars, de_pars = _lohelp_paragraphs(content), _lohelp_paragraphs(german[rel])
        for par_id, en_sents in en_pars.items():
            de_sents = de_pars.get(par_id)
            if de_sents is None or len(de_sents) != len(en_sents):
                continue
            for en, de in zip(en_sents, de_sents, strict=True):
                yield {"translation": {"en": en, "de": de}, "source": "lohelp", "group": f"lohelp:{rel}"}


def ddtp_pairs(lists: Path, sources: dict[str, str]) -> Iterator[dict]:
    """
    Debian package descriptions matched to their German DDTP translation by `Description-md5`.

    Synopses are paired one to one (`"source": "ddtp_synopsis"`); long descriptions paragraph by paragraph, then
    sentence by sentence (`"source": "ddtp_desc"`). The group is `ddtp:<source package>`.
    """
    english = {}
    for record in parse_deb822(
        read_index(lists, "*_main_i18n_Translation-en*"), ("Package", "Description-md5", "Description-en")
    ):
        if "Description-md5" in record and "Description-en" in record:
            english.setdefault(record["Description-md5"], record)
    for record in parse_deb822(
        read_index(lists, "*_main_i18n_Translation-de*"), ("Package", "Description-md5", "Description-de")
    ):
        en_record = english.get(record.get("Description-md5", ""))
        if en_record is None or "Description-de" not in record:
            continue
        group = "ddtp:" + sources.get(record["Package"], record["Package"])
        en_syn, _, en_body = en_record["Description-en"].partition("\n")
        de_syn, _, de_body = record["Description-de"].partition("\n")
        yield {
            "translation": {"en": normalize(en_syn), "de": normalize(de_syn)},
            "source": "ddtp_synopsis",
            "group": group,
        }
        en_pars, de_pars = description_paragraphs(en_body), description_paragraphs(de_body)
        if all(is_prose(p) for p in en_pars + de_pars):
            for en, de in align_paragraphs(en_pars, de_pars):
                yield {"translation": {"en": en, "de": de}, "source": "ddtp_desc", "group": group}


# ----------------------------------------------------------------------------------------------------------------
# Summarization source
# ----------------------------------------------------------------------------------------------------------------
def summarization_rows(lists: Path, sources: dict[str, str]) -> Iterator[dict]:
    """
    Package long description → synopsis, prose only, 15–400 words, first occurrence of each document kept.

    `id` is the binary package, `group` its source package.
    """
    seen = set()
    for record in parse_deb822(read_index(lists, "*_main_i18n_Translation-en*"), ("Package", "Description-en")):
        if "Description-en" not in record or "Package" not in record:
            continue
        synopsis, _, body = record["Description-en"].partition("\n")
        paragraphs = description_paragraphs(body)
        if not paragraphs or not all(is_prose(p) for p in paragraphs):
            continue
        document, summary = " ".join(normalize(p) for p in paragraphs), normalize(synopsis)
        if not summary or not SUM_MIN_WORDS <= len(document.split()) <= SUM_MAX_WORDS or document in seen:
            continue
        seen.add(document)
        package = record["Package"]
        yield {"document": document, "summary": summary, "id": package, "group": sources.get(package, package)}


# ----------------------------------------------------------------------------------------------------------------
# Splitting and writing
# ----------------------------------------------------------------------------------------------------------------
def split_rows(rows: Iterable[dict], per_mille: tuple[int, int], key: str) -> dict[str, list[dict]]:
    """
    Splits rows by group and removes validation/test rows whose `key` text occurs in train, and exact duplicates.

    Args:
        rows (`Iterable[dict]`): Rows with a `"group"` field.
        per_mille (`tuple[int, int]`): Hash buckets (out of 1000) for validation and test.
        key (`str`): `"en"` (translation rows) or `"document"` (summarization rows).
    """
    splits: dict[str, list[dict]] = {"train": [], "validation": [], "test": []}
    seen: dict[str, set] = {name: set() for name in splits}
    for row in rows:
        name = split_of(row["group"], per_mille)
        fingerprint = json.dumps(row.get("translation", row.get("document")), sort_keys=True, ensure_ascii=False)
        if fingerprint not in seen[name]:
            seen[name].add(fingerprint)
            splits[name].append(row)
    train_texts = {_text(row, key) for row in splits["train"]}
    for name in ("validation", "test"):
        splits[name] = [row for row in splits[name] if _text(row, key) not in train_texts]
    return splits


def _text(row: dict, key: str) -> str:
    return row["translation"][key] if "translation" in row else row[key]


def write_splits(splits: dict[str, list[dict]], output_dir: Path, notice: str) -> None:
    """Writes `<split>.jsonl` (one JSON object a line, UTF-8) and `NOTICE.md` into `output_dir`."""
    output_dir.mkdir(parents=True, exist_ok=True)
    for name, rows in splits.items():
        with open(output_dir / f"{name}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    (output_dir / "NOTICE.md").write_text(notice, encoding="utf-8")


def build_translation(output_dir: Path, work_dir: Path) -> dict[str, list[dict]]:
    """
    Builds the English → German corpus.

    Args:
        output_dir (`Path`): Where `train/validation/test.jsonl` and `NOTICE.md` are written.
        work_dir (`Path`): Scratch directory for downloads.

    Returns:
        `dict[str, list[dict]]`: the split rows.
    """
    lists = apt_update(work_dir)
    debs = apt_download(TRANSLATION_PACKAGES, work_dir)
    sources = source_packages(lists)

    def rows() -> Iterator[dict]:
        for generator in (
            ding_pairs(debs["trans-de-en"]),
            lohelp_pairs(debs["libreoffice-help-en-us"], debs["libreoffice-help-de"]),
            ddtp_pairs(lists, sources),
        ):
            for row in generator:
                if is_good_pair(row["translation"]["en"], row["translation"]["de"]):
                    yield row

    splits = split_rows(rows(), MT_SPLIT_PER_MILLE, key="en")
    write_splits(splits, output_dir, MT_NOTICE)
    return splits


def build_summarization(output_dir: Path, work_dir: Path) -> dict[str, list[dict]]:
    """
    Builds the package-description summarization corpus.

    Args:
        output_dir (`Path`): Where `train/validation/test.jsonl` and `NOTICE.md` are written.
        work_dir (`Path`): Scratch directory for downloads.

    Returns:
        `dict[str, list[dict]]`: the split rows.
    """
    lists = apt_update(work_dir)
    splits = split_rows(summarization_rows(lists, source_packages(lists)), SUM_SPLIT_PER_MILLE, key="document")
    write_splits(splits, output_dir, SUM_NOTICE)
    return splits


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=("translation", "summarization"), required=True)
    parser.add_argument("--output_dir", type=Path, required=True)
    parser.add_argument("--work_dir", type=Path, default=None, help="download directory (default: <output_dir>/_work)")
    parser.add_argument("--keep_work_dir", action="store_true", help="keep the downloads after the build")
    args = parser.parse_args(argv)
    if shutil.which("apt-get") is None:
        parser.error("apt-get not found: the corpora are built from Debian packages (run on Debian/Ubuntu)")
    work_dir = args.work_dir or args.output_dir / "_work"
    start = time.perf_counter()
    build = build_translation if args.task == "translation" else build_summarization
    splits = build(args.output_dir, work_dir)
    if not args.keep_work_dir and args.work_dir is None:
        shutil.rmtree(work_dir, ignore_errors=True)
    counts = ", ".join(f"{name} {len(rows):,}" for name, rows in splits.items())
    print(f"{args.task}: {counts} rows in {args.output_dir} ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
