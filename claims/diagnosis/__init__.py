"""Why is this claim pending, and will this claim fit?

``diagnose(state, obj)`` takes a ResourceClaim, a ResourceClaimTemplate or a Pod (as dicts) and a
:class:`~claims.fleetstate.FleetState`, and returns a :class:`Diagnosis`: a ``category``, a one-line
``summary`` for the on-call engineer, per-request device groups (model x MIG profile) with how many devices
each stage of the allocator rejected and why, the claims holding matching devices (oldest first), the
``placement`` the allocator replay would choose, ``lint`` findings and ``suggestions``.

The verdict "fits / does not fit" always comes from the allocator replay (``claims.allocator``), run on the
nodes where the claim could possibly fit; the per-device pass only explains it. Selector results are
shared between devices with the same projection of the attributes a selector reads (``FleetState.results``).

Layout: ``requests`` and ``matching`` read a claim and its selectors; ``groups`` holds the per-fleet context
and the candidate groups; ``analysis`` runs each request's devices through the allocator's checks;
``placement`` runs the replay; ``details`` and ``wording`` turn the analysis into the result (``result``);
``extended`` covers pods with extended resource requests; ``engine`` is the entry points, exported here.
"""

from __future__ import annotations

from claims.diagnosis.engine import diagnose, diagnose_name, prepare
from claims.diagnosis.extended import EXTENDED_CLAIM_NAME, extended_resource_claim
from claims.diagnosis.matching import explain_miss, split_conjuncts
from claims.diagnosis.result import CATEGORIES, Diagnosis
from claims.diagnosis.wording import constraint_values

__all__ = [
    "CATEGORIES",
    "EXTENDED_CLAIM_NAME",
    "Diagnosis",
    "constraint_values",
    "diagnose",
    "diagnose_name",
    "explain_miss",
    "extended_resource_claim",
    "prepare",
    "split_conjuncts",
]
