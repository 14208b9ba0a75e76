"""What an installing user gets: one version everywhere, type hints marked,
no benchmark harness that needs root in the package.

Run from a copy of tests/ against the installed wheel too (.ci/run), with
CHANGELOG.md next to the copy.
"""

import importlib.metadata as md
import importlib.util
import json
import re
from pathlib import Path

import pytest

import keras_mpfp16

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(keras_mpfp16.__file__).resolve().parent


def changelog_releases() -> list[tuple[str, str]]:
    text = (ROOT / "CHANGELOG.md").read_text()
    return re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", text, re.M)


def test_changelog_latest_release_is_the_package_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    releases = changelog_releases()
    assert releases, "CHANGELOG.md has no dated release heading"
    assert releases[0][0] == keras_mpfp16.__version__, (
        f"CHANGELOG's latest release {releases[0]} but "
        f"keras_mpfp16.__version__ = {keras_mpfp16.__version__}"
    )
    dates = [d for _, d in releases]
    assert dates == sorted(dates, reverse=True), dates
    # Later entries go under Unreleased, above the latest release.
    assert text.index("## [Unreleased]") < text.index(f"## [{releases[0][0]}]")


def _installed_from_this_package(dist) -> bool:
    """Whether the imported keras_mpfp16 is the one `dist` installed."""
    here = PACKAGE / "__init__.py"
    located = Path(dist.locate_file("keras_mpfp16/__init__.py"))
    if located.exists() and located.resolve() == here:
        return True  # a wheel install
    direct = dist.read_text("direct_url.json")
    if direct:  # an editable install records its source directory
        url = json.loads(direct).get("url", "")
        if url.startswith("file://"):
            source = Path(url[len("file://") :]) / "keras_mpfp16" / "__init__.py"
            return source.exists() and source.resolve() == here
    return False


def test_installed_metadata_has_the_package_version():
    try:
        dist = md.distribution("keras-mpfp16")
    except md.PackageNotFoundError:
        pytest.skip("keras-mpfp16 is not installed (imported from a checkout)")
    if not _installed_from_this_package(dist):
        pytest.skip(
            f"the imported keras_mpfp16 ({PACKAGE}) is not the installed "
            f"distribution's (PYTHONPATH or another checkout)"
        )
    assert dist.version == keras_mpfp16.__version__, (
        f"installed metadata says {dist.version}, keras_mpfp16.__version__ "
        f"{keras_mpfp16.__version__}: reinstall (pip install -e . or the wheel)"
    )


def test_package_is_marked_typed_and_ships_no_root_harness():
    assert (PACKAGE / "py.typed").is_file()
    # The emulated cluster (network namespaces, /etc/hosts) is a tool in
    # examples/benchmarks/, not library code.
    assert importlib.util.find_spec("keras_mpfp16.benchmark.cluster") is None
    assert not list(PACKAGE.rglob("cluster*.py"))
