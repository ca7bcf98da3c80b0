"""Where and when generation runs relative to training (docs/async.md).

config_checks   the keys' checks before Ray starts (placement, modes, staleness, rollout correction)
rollout_group   the rollout worker group of hybrid_engine=false and the weight broadcast into it
pipeline        the driver's generation pipeline: one_step_off and async (staleness bound, drop/wait, partial
                rollout, stall watchdog)
staleness       per-sample policy versions and the staleness metrics logged in every mode
"""
