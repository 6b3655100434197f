"""Validators for schemas of the official OpenAI API description (tests/fixtures/openai).

The file marks nullable fields in the OpenAPI 3.0 manner (``nullable: true``); they are
rewritten to JSON Schema types (``type: [T, "null"]``, ``null`` added to enums) so real
traffic validates (see tests/fixtures/openai/README.md).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC = Path(__file__).parent / "fixtures" / "openai" / "openapi.yaml"
URI = "urn:openai-openapi"


def _nullable(node: Any) -> Any:
    if isinstance(node, dict):
        node = {k: _nullable(v) for k, v in node.items()}
        if node.pop("nullable", False):
            kind = node.get("type")
            if isinstance(kind, str):
                node["type"] = [kind, "null"]
            elif isinstance(kind, list) and "null" not in kind:
                node["type"] = [*kind, "null"]
            if isinstance(node.get("enum"), list) and None not in node["enum"]:
                node["enum"] = [*node["enum"], None]
            if "type" not in node and ("$ref" in node or "anyOf" in node or "oneOf" in node or "allOf" in node):
                node = {"anyOf": [node, {"type": "null"}]}
        return node
    if isinstance(node, list):
        return [_nullable(v) for v in node]
    return node


@functools.cache
def _registry() -> Registry:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with SPEC.open(encoding="utf-8") as f:
        doc = yaml.load(f, Loader=loader)
    doc = {"components": {"schemas": _nullable(doc["components"]["schemas"])}}
    return Registry().with_resource(URI, Resource.from_contents(doc, default_specification=DRAFT202012))


def validate(instance: Any, schema_name: str) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``instance`` matches the named schema."""
    validator = jsonschema.Draft202012Validator(
        {"$ref": f"{URI}#/components/schemas/{schema_name}"}, registry=_registry()
    )
    validator.validate(instance)
