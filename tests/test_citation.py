"""What research code carries: CITATION.cff is valid Citation File Format 1.2.0 (what `cffconvert --validate` checks:
the format's JSON schema over the file read as cffconvert reads it), names the paper, and agrees with
pyproject.toml and LICENSE on the version and the licence. The schema is cffconvert 2.0.0's
(`cffconvert/schemas/1.2.0/schema.json` in its wheel), copied to tests/data/ so that no test needs the network."""

from __future__ import annotations

import json
import tomllib
from typing import Any, Dict, List

import jsonschema
import yaml

from helpers import ROOT

CITATION = ROOT / "CITATION.cff"
SCHEMA = ROOT / "tests" / "data" / "citation-file-format-1.2.0.schema.json"
PAPER = "Linear Differential Vision Transformer: Learning Visual Contrasts via Pairwise Differentials"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


class CffLoader(yaml.SafeLoader):
    """YAML's safe loader with timestamps kept as the strings they are written as, as cffconvert loads a CFF file
    (the schema wants `date-released: 2025-11-02` as a string, which the plain safe loader makes a date)."""


CffLoader.add_constructor("tag:yaml.org,2002:timestamp", yaml.SafeLoader.construct_yaml_str)


def load_cff(text: str) -> Dict[str, Any]:
    cff = yaml.load(text, Loader=CffLoader)  # a SafeLoader: no tag builds an object
    assert isinstance(cff, dict), "CITATION.cff is not a YAML mapping"
    return cff


def schema_errors(cff: Dict[str, Any]) -> List[str]:
    """Every violation of the schema, each with where it is, in the draft the schema names (formats only where
    jsonschema has a checker)."""
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    validator = validator_class(schema, format_checker=validator_class.FORMAT_CHECKER)
    return [
        f"{'/'.join(map(str, error.absolute_path)) or '(top)'}: {error.message}"
        for error in sorted(validator.iter_errors(cff), key=lambda e: list(map(str, e.absolute_path)))
    ]


def test_the_schema_is_cff_1_2_0_in_draft_7():
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    assert schema["$id"] == "https://citation-file-format.github.io/1.2.0/schema.json"
    assert jsonschema.validators.validator_for(schema) is jsonschema.Draft7Validator


def test_citation_cff_is_valid_cff_1_2_0():
    cff = load_cff(CITATION.read_text(encoding="utf-8"))
    assert cff["cff-version"] == "1.2.0"
    assert schema_errors(cff) == []


def test_a_citation_cff_that_breaks_the_schema_is_refused():
    """The check can fail: a misspelt key, a version written as a number and a licence outside SPDX's list."""
    broken = load_cff(CITATION.read_text(encoding="utf-8"))
    broken["cff-version"] = 1.2
    broken["licence"] = broken.pop("license")
    broken["preferred-citation"]["license"] = "MIT-ish"
    errors = schema_errors(broken)
    assert any(e.startswith("(top)") and "'licence' was unexpected" in e for e in errors), errors
    assert any(e.startswith("cff-version:") for e in errors), errors
    assert any(e.startswith("preferred-citation/license:") for e in errors), errors


def test_citation_cff_names_this_repository_and_prefers_the_paper():
    cff = load_cff(CITATION.read_text(encoding="utf-8"))
    assert (cff["title"], cff["type"]) == ("vca-repro", "software")
    paper = cff["preferred-citation"]
    assert paper["url"] == "https://arxiv.org/abs/2511.00833"
    assert paper["title"] == PAPER
    assert (paper["year"], paper["conference"]["name"]) == (2025, "NeurIPS 2025")
    assert any(i["value"] == "arXiv:2511.00833" for i in paper["identifiers"])


def test_citation_cff_and_license_agree_with_pyproject():
    """The version and the licence are stated in pyproject.toml first: a release that moves either moves it there."""
    cff = load_cff(CITATION.read_text(encoding="utf-8"))
    assert cff["version"] == PROJECT["version"]
    assert cff["license"] == PROJECT["license"]["text"] == "MIT"
    first = (ROOT / "LICENSE").read_text(encoding="utf-8").splitlines()[0]
    assert first == "MIT License", first
