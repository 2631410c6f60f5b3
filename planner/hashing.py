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
