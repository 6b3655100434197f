"""The documentation holds what it promises: every config key in the configuration
reference, every metric in the metrics reference, links and cited files that exist, a
README short enough to be a front page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from latgate.foundation.config import keys, schema
from latgate.foundation.metrics import Metrics

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted(DOCS.glob("*.md"))]
README_MAX_LINES = 250

#: Fields of the resolved config that are not keys a file writes (set by the loader, or
#: written as a section name such as ``[[auth.keys]]`` / ``[routing.policies.NAME]``).
NOT_KEYS = {
    schema.ProviderConfig: {"name", "endpoints"},
    schema.EndpointConfig: {"id", "api_base", "exact"},
    schema.AuthConfig: {"keys"},
    schema.RoutingConfig: {"policies"},
}
SECTION_MODELS = (
    schema.ServerConfig,
    schema.DefaultsConfig,
    schema.ProviderConfig,
    schema.EndpointConfig,
    schema.PolicyConfig,
    schema.RoutingConfig,
    schema.ModelConfig,
    schema.AuthKey,
    schema.AuthConfig,
    schema.StateConfig,
    schema.HealthConfig,
)

#: Files the docs cite that live in other projects (TileRT's router source).
FOREIGN_FILES = {"tilert/pd_vllm/pd_router.py"}


def _prose(page: Path) -> str:
    """A markdown page without its fenced code blocks."""
    return re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)


def config_keys() -> set[str]:
    """Every key a config file may write: section fields, the provider and pool-section
    keys, the engine settings kept as hints, ``[default]``'s own keys, the top-level tables."""
    names = {f for model in SECTION_MODELS for f in model.model_fields if f not in NOT_KEYS.get(model, set())}
    names |= {"url"}  # an endpoints table entry's address
    return names | set(keys.PROVIDER_KEYS) | set(keys.ENGINE_HINT_KEYS) | set(keys.DEFAULT_SECTION_KEYS) | set(keys.SECTIONS)


def test_the_configuration_reference_names_every_config_key() -> None:
    text = _prose(DOCS / "configuration.md")
    spans = " ".join(re.findall(r"`([^`]+)`", text))  # keys are written in code spans
    missing = sorted(k for k in config_keys() if not re.search(rf"(?<![\w-]){re.escape(k)}(?![\w-])", spans))
    assert not missing, f"keys not in docs/configuration.md: {missing}"


def test_the_metrics_reference_names_every_metric() -> None:
    metrics = Metrics(providers=["p"], models=["m"])
    names = {family.name for family in metrics.registry.collect()}
    text = (DOCS / "metrics.md").read_text(encoding="utf-8")
    # prometheus-client drops a counter's _total from the family name
    missing = sorted(n for n in names if f"`{n}`" not in text and f"`{n}_total`" not in text)
    assert names and not missing, f"metrics not in docs/metrics.md: {missing}"


def test_readme_is_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub renders it: lower case, punctuation dropped, spaces -> '-'."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = _prose(page)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.MULTILINE)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_heading(page: Path) -> None:
    text = _prose(page)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(target)
    assert not broken, f"{page.name}: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_source_file_exists(page: Path) -> None:
    """A path in backticks ending in .py is a file of this repository, given from its root
    or from src/latgate/ (the module paths ARCHITECTURE.md draws); ``NAME`` marks a template."""
    cited = {p for p in re.findall(r"`([\w./-]+\.py)\b", page.read_text(encoding="utf-8")) if "NAME" not in p}
    missing = sorted(
        p for p in cited - FOREIGN_FILES if not (ROOT / p).exists() and not (ROOT / "src/latgate" / p).exists()
    )
    assert not missing, f"{page.name} cites files that do not exist: {missing}"


def test_no_source_file_cites_a_document_that_does_not_exist() -> None:
    missing = []
    for path in (ROOT / "src").rglob("*.py"):
        for name in re.findall(r"\b([\w./-]+\.md)\b", path.read_text(encoding="utf-8")):
            if not any((base / name).exists() for base in (ROOT, path.parent, DOCS)):
                missing.append(f"{path.relative_to(ROOT)}: {name}")
    assert not missing, missing


def test_the_architecture_names_only_modules_that_exist() -> None:
    """Every module and package ARCHITECTURE.md draws, in its diagrams too, is in src/latgate/."""
    text = (DOCS / "ARCHITECTURE.md").read_text(encoding="utf-8")
    modules = set(re.findall(r"(?<![\w/.-])((?:[a-z_]+/)*[a-z_]+\.py)\b", text))
    packages = set(re.findall(r"(?<![\w/.-])([a-z_]+/)(?=[\s`:),])", text))
    missing = sorted(
        name
        for name in (modules | packages) - FOREIGN_FILES
        if "name" not in name.lower() and not (ROOT / "src/latgate" / name).exists() and not (ROOT / name).exists()
    )
    assert modules and not missing, f"ARCHITECTURE.md names what is not in src/latgate/: {missing}"
