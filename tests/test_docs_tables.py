"""The docs' and README's tables and quoted figures agree with their JSON.

`examples/benchmarks/report.py` writes every table of figures in docs/ and
README.md from docs/benchmarks/*.json; `--check` compares without writing. These tests run
it (no training, a second or two) and check that it catches a wrong table, a
wrong figure in the prose and a command that does not match its file.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "examples" / "benchmarks" / "report.py"
DOCS = ROOT / "docs"


def report(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, str(REPORT), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def test_every_docs_table_and_quoted_figure_matches_its_json():
    result = report(DOCS / "benchmarks", "--check")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 difference(s)" in result.stdout


@pytest.fixture
def docs_copy(tmp_path):
    """A copy of docs/ (pages and JSON) and README.md beside it, to tamper with."""
    copy = tmp_path / "docs"
    shutil.copytree(DOCS, copy, ignore=shutil.ignore_patterns("*.png"))
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    return copy


def tamper(page: Path, old: str, new: str) -> None:
    text = page.read_text()
    assert old in text, f"{old!r} not in {page.name}; update this test"
    page.write_text(text.replace(old, new, 1))


def first_table_row(page: Path) -> str:
    """The first data row of the first generated table of `page`."""
    text = page.read_text()
    body = text[text.index("<!-- table:") :]
    rows = [ln for ln in body.splitlines() if ln.startswith("| ")]
    return rows[1]  # rows[0] is the header; the |---| line does not match


@pytest.mark.parametrize("page", ["benchmarks.md", "layers.md", "convergence.md"])
def test_check_fails_on_an_edited_table_and_rewriting_restores_it(docs_copy, page):
    path = docs_copy / page
    row = first_table_row(path)
    digits = next(c for c in row if c.isdigit())
    edited = row.replace(digits, str((int(digits) + 1) % 10), 1)
    tamper(path, row, edited)
    result = report(docs_copy / "benchmarks", "--check")
    assert result.returncode == 1, result.stdout
    assert (
        f"{page}: table" in result.stdout and "differs from its JSON" in result.stdout
    )

    rewrite = report(docs_copy / "benchmarks")
    assert rewrite.returncode == 0, rewrite.stdout + rewrite.stderr
    assert row in path.read_text()
    assert report(docs_copy / "benchmarks", "--check").returncode == 0


def test_check_fails_on_a_wrong_figure_in_the_prose(docs_copy):
    # The example: the loss scale settles at 2^20 after 4 skips.
    tamper(docs_copy / "benchmarks.md", "2^20 after 4 skips", "2^20 after 10 skips")
    result = report(docs_copy / "benchmarks", "--check")
    assert result.returncode == 1
    assert "benchmarks.md: the prose should say" in result.stdout


def test_check_fails_when_a_json_file_changes(docs_copy):
    path = docs_copy / "benchmarks" / "overhead_float32.json"
    tamper(path, '"ratio_ours_over_plain": 1.1', '"ratio_ours_over_plain": 1.2')
    result = report(docs_copy / "benchmarks", "--check")
    assert result.returncode == 1
    assert "table overhead differs" in result.stdout


def test_check_fails_when_a_command_disagrees_with_its_file(docs_copy):
    # The example: the docs showed --rounds 7 for an 8-round file.
    tamper(
        docs_copy / "benchmarks.md",
        "overhead --policy float32 --rounds 8",
        "overhead --policy float32 --rounds 7",
    )
    result = report(docs_copy / "benchmarks", "--check")
    assert result.returncode == 1
    assert "says --rounds 7, the file records 8" in result.stdout
    # ... and run_all.sh now runs a command that no page shows.
    assert "run_all.sh runs" in result.stdout


def test_check_fails_for_a_json_file_no_page_writes(docs_copy):
    shutil.copy(
        docs_copy / "benchmarks" / "threads.json",
        docs_copy / "benchmarks" / "threads_extra.json",
    )
    result = report(docs_copy / "benchmarks", "--check")
    assert result.returncode == 1
    assert "threads_extra.json: no page shows a command" in result.stdout


def test_docs_do_not_point_outside_the_repository():
    for page in DOCS.rglob("*.md"):
        text = page.read_text()
        for bad in ("../shared", "FACTS.md", "/work/"):
            assert bad not in text, f"{page.relative_to(ROOT)} cites {bad!r}"


def test_check_fails_on_a_mean_and_std_in_the_prose_that_no_json_holds(docs_copy):
    page = docs_copy / "convergence.md"
    text = page.read_text()
    # The first occurrence is in the summary prose, before the tables.
    assert text.index("92.26 ± 0.29") < text.index("<!-- table:")
    tamper(page, "92.26 ± 0.29", "92.36 ± 0.29")
    result = report(docs_copy / "benchmarks", "--check")
    assert result.returncode == 1
    assert "'92.36 ± 0.29' in the prose is not a figure of the JSON" in result.stdout


def test_check_covers_the_readme_benchmark_table(docs_copy):
    readme = docs_copy.parent / "README.md"
    assert "<!-- table:readme -->" in readme.read_text()
    row = first_table_row(readme)
    digits = next(c for c in row if c.isdigit())
    tamper(readme, row, row.replace(digits, str((int(digits) + 1) % 10), 1))
    result = report(docs_copy / "benchmarks", "--check")
    assert result.returncode == 1, result.stdout
    assert "README.md: table readme differs from its JSON" in result.stdout

    assert report(docs_copy / "benchmarks").returncode == 0
    assert row in readme.read_text()
    # Without the marker the README's figures would go unchecked.
    tamper(readme, "<!-- table:readme -->", "")
    result = report(docs_copy / "benchmarks", "--check")
    assert "table readme is not placed in any page" in result.stdout


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _readme_row(readme: Path, start: str) -> str:
    (row,) = [ln for ln in readme.read_text().splitlines() if ln.startswith(start)]
    return row


def test_readme_cluster_rows_span_every_node_count_measured(docs_copy):
    """The 16-bit-wire and sparse-gradient rows show the range over every
    node count in their JSON, not the best one: a 4-node figure changed in
    the JSON changes the README's row (it did not when the rows were read
    from the 2-node jobs only)."""
    readme = docs_copy.parent / "README.md"
    wire = _readme_row(readme, "| emulated 2–4 nodes at 1 Gbit/s: 16-bit wire")
    assert "2 nodes 0.46–0.53×" in wire and "4 nodes 0.83×" in wire, wire
    assert "| 0.46–0.83× |" in wire, wire
    sparse = _readme_row(readme, "| emulated 2 and 4 nodes at 1 Gbit/s: IMDB-shaped")
    assert "| 0.95–2.41× |" in sparse, sparse

    def four_nodes(name, key, value):
        def edit(data):
            for job in data["jobs"]:
                if job["nodes"] == 4 and job.get("rate") == "1gbit":
                    if job["name"] in ("dense", "imdb"):
                        job["ratios"][key] = value

        _edit_json(docs_copy / "benchmarks" / name, edit)

    four_nodes("cluster_main.json", "f16/f32 step", 0.97)
    four_nodes("cluster_sparse.json", "dense/sparse step", 0.5)
    result = report(docs_copy / "benchmarks", "--check")
    assert result.returncode == 1, result.stdout
    assert "+| emulated 2–4 nodes at 1 Gbit/s: 16-bit wire" in result.stdout
    assert "4 nodes 0.83–0.97×) | 0.46–0.97× |" in result.stdout
    assert "(2 nodes 2.41×, 4 nodes 0.50×) | 0.50–2.41× |" in result.stdout


def test_readme_horovod_np2_row_is_read_from_its_json(docs_copy):
    readme = docs_copy.parent / "README.md"
    row = _readme_row(readme, "| np=2, benchmark model: ours ÷ Horovod 0.28.1")
    assert "| 1.62–1.68× | 5 |" in row, row
    assert "(1.11× of it is the single process" in row, row

    def edit(data):
        data["median_ratios"]["ours_f16_over_hvd_f16"] = 1.5

    _edit_json(docs_copy / "benchmarks" / "horovod.json", edit)
    result = report(docs_copy / "benchmarks", "--check")
    assert result.returncode == 1, result.stdout
    assert "README.md: table readme differs from its JSON" in result.stdout
    assert "| 1.50–1.68× | 5 |" in result.stdout
