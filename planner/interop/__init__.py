"""TorchRec interop: export our plan as TorchRec's sharding plan, import TorchRec table
configs and plans, plan a TorchRec model's collections directly (`plan_from_torchrec`), and
run or score with TorchRec's planner (torchrec is an optional extra; only `sharding_plan`,
`from_module` and `torchrec_model` need it, and they import it inside functions).

Names load on first use, so `planner plan` (which registers this package's CLI) pays nothing.
"""

from importlib import import_module
from typing import Any

_WHERE = {
    "to_torchrec": "export",
    "layout_from_torchrec": "importing",
    "model_from_torchrec_tables": "importing",
    "build_sharding_plan": "sharding_plan",
    "export_from_sharding_plan": "sharding_plan",
    "plan_from_torchrec": "from_module",
    "TorchRecExport": "torchrec_format",
    "TorchRecTable": "torchrec_format",
    "TorchRecProblem": "torchrec_model",
    "TorchRecScore": "torchrec_model",
    "score_with_torchrec": "torchrec_model",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'planner.interop' has no attribute {name!r}")
    return getattr(import_module(f"planner.interop.{_WHERE[name]}"), name)
