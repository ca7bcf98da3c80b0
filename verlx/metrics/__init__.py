"""Every metric the trainer logs is computed here, by family:

- `data.py`: scores, rewards, advantages, returns, values and lengths of a step's batch (veRL's names);
- `throughput.py`: the step's timings, tokens per second and peak memory;
- `phases.py`: each worker phase's MFU and peak device memory (timed by workers/perf.PhaseTimer);
- `accumulator.py`: how workers sum their per-micro-batch metrics on the device (one sync per call);
- `multi_turn.py`: the agent loop's turns, tool calls and stop reasons.

Metrics that are a by-product of a check or a loss are computed beside it: staleness
(trainer/rollout_modes/staleness.py), rollout correction (algorithms/rollout_correction.py and trainer/old_log_prob.py),
the policy loss's clip fractions (algorithms/policy_losses/), the reward signal (trainer/reward_signal.py).
Where metrics go (console, files, trackers): utils/tracking.py.
"""
