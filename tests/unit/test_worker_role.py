"""A worker's role is one typed value: the trainer builds it from booleans, veRL's '_'-joined spelling is parsed once
(and written back the same way in messages)."""

from __future__ import annotations

import pytest

from verlx.workers.actor_rollout_ref_worker import WorkerRole


@pytest.mark.parametrize("spelling, actor, rollout, ref", [
    ("actor_rollout_ref", True, True, True), ("actor_ref", True, False, True), ("rollout", False, True, False),
    ("ref", False, False, True), ("actor_rollout", True, True, False)])
def test_verl_spellings_parse_to_the_parts_and_print_back(spelling, actor, rollout, ref):
    role = WorkerRole.parse(spelling)
    assert (role.actor, role.rollout, role.ref) == (actor, rollout, ref)
    assert str(role) == spelling
    assert WorkerRole.parse(role) is role


def test_parts_print_in_verl_order_whatever_order_they_were_given():
    assert str(WorkerRole.parse("ref_actor")) == "actor_ref"


@pytest.mark.parametrize("spelling", ["critic", "actor_critic", "", "_"])
def test_an_unknown_part_names_the_role_and_the_allowed_parts(spelling):
    with pytest.raises(ValueError, match=r"parts must be among \('actor', 'rollout', 'ref'\)"):
        WorkerRole.parse(spelling)
