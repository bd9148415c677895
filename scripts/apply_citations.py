"""Apply citations.tsv: replace each old citation text by its new one, wherever the text now lives.

    python scripts/apply_citations.py [citations.tsv] [--dry-run]

Each line of the table is ``path<TAB>old text<TAB>new text`` (``#`` lines are comments; ``\\n``, ``\\t``
and ``\\\\`` in the two texts stand for a newline, a tab and a backslash). ``path`` is where the old text
was when the table was written; files move, so when it is not there, every tracked text file of the tree is
searched for it. A row is applied only when the old text occurs exactly once in exactly one file; anything
else (not found, found several times, found in several files) is reported and left alone, as is a row whose
new text is already in place. Python lines made longer than the project's 110 characters are reported.
The exit status is 1 when any row was not applied.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINE = 110  # pyproject.toml [tool.ruff] line-length
TEXT_SUFFIXES = (".py", ".md", ".txt", ".toml", ".yaml", ".yml", ".cfg", ".html")


def unescape(text: str) -> str:
    """``\\n``, ``\\t`` and ``\\\\`` to a newline, a tab and a backslash; any other backslash stays."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "nt\\":
            out.append({"n": "\n", "t": "\t", "\\": "\\"}[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def read_table(path: Path) -> list[tuple[int, str, str, str]]:
    """(line number, path, old, new) of every row; a malformed row stops the run with its line number."""
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 3 or not parts[1]:
            sys.exit(f"{path}:{number}: expected path<TAB>old text<TAB>new text, got {len(parts)} fields")
        rows.append((number, parts[0], unescape(parts[1]), unescape(parts[2])))
    return rows


def tree_files() -> list[Path]:
    """The repository's tracked text files (git ls-files), so .venv and build output are never touched."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    return [ROOT / name for name in listed.split("\0") if name.endswith(TEXT_SUFFIXES)]


def holders(text: str, hint: Path, files: list[Path]) -> list[Path]:
    """Files holding ``text``: the hinted path alone if it has it, else every file of the tree that does."""
    if hint.is_file() and text in hint.read_text(encoding="utf-8"):
        return [hint]
    found = []
    for path in files:
        try:
            if text in path.read_text(encoding="utf-8"):
                found.append(path)
        except (OSError, UnicodeDecodeError):
            continue
    return found


def long_lines(text: str, new: str) -> list[str]:
    """Lines of ``text`` that hold part of ``new`` and exceed the line length."""
    start = text.index(new)
    first = text.rfind("\n", 0, start) + 1
    end = text.find("\n", start + len(new))
    block = text[first : end if end != -1 else len(text)]
    return [line for line in block.split("\n") if len(line) > MAX_LINE]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("table", nargs="?", default=str(ROOT / "citations.tsv"))
    parser.add_argument("--dry-run", action="store_true", help="report what would change, write nothing")
    args = parser.parse_args()
    files = tree_files()
    failed = 0
    for number, hint, old, new in read_table(Path(args.table)):
        where = f"row {number} ({hint})"
        found = holders(old, ROOT / hint, files)
        if not found:
            if new and holders(new, ROOT / hint, files):
                print(f"{where}: already applied")
                continue
            print(f"NOT APPLIED {where}: old text not found anywhere: {old[:80]!r}")
            failed += 1
            continue
        if len(found) > 1:
            names = ", ".join(str(p.relative_to(ROOT)) for p in found)
            print(f"NOT APPLIED {where}: old text is in several files: {names}")
            failed += 1
            continue
        path = found[0]
        text = path.read_text(encoding="utf-8")
        if text.count(old) > 1:
            print(f"NOT APPLIED {where}: old text occurs {text.count(old)} times in {path.relative_to(ROOT)}")
            failed += 1
            continue
        result = text.replace(old, new, 1)
        moved = "" if path == ROOT / hint else f" (moved: now {path.relative_to(ROOT)})"
        print(f"{'would apply' if args.dry_run else 'applied'} {where}{moved}")
        for line in long_lines(result, new) if new and path.suffix == ".py" else []:
            print(f"  warning: line of {len(line)} characters (> {MAX_LINE}): {line.strip()[:80]!r}")
        if not args.dry_run:
            path.write_text(result, encoding="utf-8")
    print(f"{failed} row(s) not applied" if failed else "every row applied")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
