"""The HBM reservation as a fraction of the capacity (issue 18), as TorchRec's
HeuristicalStorageReservation(percentage) gives it: `gpu.hbm_reserved_fraction`, resolved to
bytes in one place (GpuSpec.hbm_reserved, through HardwareSpec.profile) so the planner and
the checker see the same bytes as for `hbm_reserved_bytes`; never given with a non-zero
`hbm_reserved_bytes`; left out of the JSON when absent (old hashes hold)."""

import json
import math
from fractions import Fraction
from typing import Any

import pytest

from planner import plan
from planner.check import check_plan
from planner.errors import BadInputError
from planner.hashing import plan_hash_of
from planner.plan_model import Plan
from planner.planning import resolve
from planner.presets import preset_dict
from planner.spec import GpuSpec, HardwareSpec
from planner.validation import validate_model

H100 = preset_dict("h100")
CAP = int(HardwareSpec.model_validate(H100).gpu.hbm_capacity_bytes)


def _request(overrides: dict[str, Any], model: str = "deeprecsys_rm1") -> dict[str, Any]:
    return {"model": model, "options": {"solver": "greedy"},
            "hardware": {"preset": "h100", "hosts": 1, "overrides": {"gpu": overrides}}}


def _gpu(**fields: Any) -> dict[str, Any]:
    return {"name": "g", "hbm_capacity_bytes": CAP, "hbm_bandwidth_gb_per_s": 3350.0,
            **fields}


def test_a_fraction_is_the_capacity_share_rounded_up_to_a_byte() -> None:
    for f in (0.0, 0.15, 0.1 + 0.2, 0.5, 0.999):
        gpu = GpuSpec.model_validate(_gpu(hbm_reserved_fraction=f))
        want = math.ceil(Fraction(f) * CAP)
        assert gpu.hbm_reserved() == want
        # What TorchRec leaves to the embeddings, int((1 - f) * capacity), give or take the
        # rounding of its float product.
        assert abs((CAP - want) - int((1 - f) * CAP)) <= 1
    assert GpuSpec.model_validate(_gpu(hbm_reserved_bytes="8GiB")).hbm_reserved() == 8 * 2**30
    # The profile every consumer builds on carries the bytes.
    spec = resolve(_request({"hbm_reserved_fraction": 0.25})).hardware
    assert spec.profile().hbm_reserved_bytes == math.ceil(CAP / 4)
    assert spec.profile().hbm_cap == CAP - math.ceil(CAP / 4)


def test_fraction_and_bytes_plan_alike_and_the_checker_holds_the_plan_to_it() -> None:
    f = 0.3
    by_fraction = plan(_request({"hbm_reserved_fraction": f}))
    by_bytes = plan(_request({"hbm_reserved_bytes": math.ceil(Fraction(f) * CAP)}))
    assert by_fraction.request.hardware.gpu.hbm_reserved_fraction == f
    assert [g.hbm_cap_bytes for g in by_fraction.gpus] == [g.hbm_cap_bytes for g in
                                                           by_bytes.gpus]
    assert by_fraction.gpus[0].hbm_cap_bytes == CAP - math.ceil(Fraction(f) * CAP)
    assert by_fraction.tables == by_bytes.tables
    assert check_plan(by_fraction).errors == []
    # The same pieces under a reservation that leaves less than they need: the checker,
    # reading the fraction, finds the GPUs over their cap.
    d = by_fraction.model_dump(mode="json")
    most = max(g.hbm_bytes for g in by_fraction.gpus)
    d["request"]["hardware"]["gpu"]["hbm_reserved_fraction"] = 1 - most / 2 / CAP
    d["plan_hash"] = plan_hash_of(d)
    errors = check_plan(Plan.model_validate(d)).errors
    assert any("over its cap" in e for e in errors), errors


def test_a_preset_reservation_is_replaced_by_an_override_of_the_other_kind() -> None:
    assert H100["gpu"]["hbm_reserved_bytes"] == "10GiB"
    gpu = resolve(_request({"hbm_reserved_fraction": 0.2})).hardware.gpu
    assert int(gpu.hbm_reserved_bytes) == 0 and gpu.hbm_reserved_fraction == 0.2
    gpu = resolve(_request({"hbm_reserved_bytes": "4GiB"})).hardware.gpu
    assert gpu.hbm_reserved() == 4 * 2**30 and gpu.hbm_reserved_fraction is None
    # An explicit null is no fraction: the preset keeps its bytes.
    gpu = resolve(_request({"hbm_reserved_fraction": None})).hardware.gpu
    assert gpu.hbm_reserved() == 10 * 2**30


@pytest.mark.parametrize(("where", "field"), [
    ("overrides", "hardware.overrides.gpu.hbm_reserved_fraction"),
    ("spec", "hardware.gpu.hbm_reserved_fraction"),
])
def test_both_kinds_at_once_are_refused_naming_the_field(where: str, field: str) -> None:
    both = {"hbm_reserved_fraction": 0.1, "hbm_reserved_bytes": "1GiB"}
    if where == "overrides":
        request = _request(both)
    else:
        hw = json.loads(resolve(_request({})).hardware.model_dump_json())
        hw["gpu"] |= both
        request = {"model": "deeprecsys_rm1", "hardware": hw}
    with pytest.raises(BadInputError) as err:
        resolve(request)
    assert err.value.field == field
    assert "either hbm_reserved_fraction or hbm_reserved_bytes" in err.value.message
    # An explicit zero is the default, not a second reservation.
    resolve(_request({"hbm_reserved_fraction": 0.1, "hbm_reserved_bytes": 0}))


@pytest.mark.parametrize("value", [1.0, -0.1, 1.5, "0.1", True, float("nan")])
def test_a_fraction_outside_zero_to_one_is_refused(value: Any) -> None:
    with pytest.raises(BadInputError) as err:
        validate_model(GpuSpec, _gpu(hbm_reserved_fraction=value))
    assert err.value.field == "hbm_reserved_fraction"


def test_a_fraction_that_leaves_no_hbm_is_refused() -> None:
    with pytest.raises(BadInputError) as err:
        validate_model(GpuSpec, {**_gpu(hbm_reserved_fraction=0.95), "hbm_capacity_bytes": 10})
    assert "leaves no HBM" in err.value.message


def test_absent_fraction_stays_out_of_the_json() -> None:
    """Requests and plans written before the field keep their bytes and hashes."""
    spec = resolve(_request({})).hardware
    assert "hbm_reserved_fraction" not in spec.model_dump_json()
    assert "hbm_reserved_fraction" not in json.dumps(spec.model_dump(mode="json"))
    given = resolve(_request({"hbm_reserved_fraction": 0.1})).hardware
    assert json.loads(given.model_dump_json())["gpu"]["hbm_reserved_fraction"] == 0.1
