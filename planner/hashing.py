"""Content hashes: canonical JSON (sorted keys, no spaces) under SHA-256."""

import hashlib
import json
from typing import Any

from pydantic import BaseModel


def canonical_json(obj: BaseModel | dict[str, Any]) -> str:
    data = obj.model_dump(mode="json") if isinstance(obj, BaseModel) else obj
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)


def content_hash(obj: BaseModel | dict[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(obj).encode()).hexdigest()


def plan_hash_of(plan_dict: dict[str, Any]) -> str:
    """The hash a plan carries: of everything in it except the hash field itself."""
    body = {k: v for k, v in plan_dict.items() if k != "plan_hash"}
    return content_hash(body)


def plan_hash_spliced(plan_dict: dict[str, Any], key: str, canonical_value: str) -> str:
    """plan_hash_of(plan_dict) with plan_dict[key] given as its canonical JSON text instead of
    as objects: the plan's tables, written straight from arrays (planner/piece_layout.py),
    are hashed without a million dicts being built and dumped. The text goes in where a
    marker string sits; a marker met anywhere else (some table named like it) falls back to
    parsing the text."""
    body = {k: v for k, v in plan_dict.items() if k != "plan_hash"}
    body[key] = _MARKER
    text = canonical_json(body)
    token = json.dumps(_MARKER)
    if text.count(token) != 1:
        body[key] = json.loads(canonical_value)
        return content_hash(body)
    head, tail = text.split(token)
    digest = hashlib.sha256(head.encode())
    digest.update(canonical_value.encode())
    digest.update(tail.encode())
    return "sha256:" + digest.hexdigest()


_MARKER = "\u0000spliced value: canonical JSON goes here\u0000"
