"""The agent-loop rollout (rollout.mode=async, docs/rollout.md) and multi-turn, tool-calling rollouts built from
token ids (docs/multi_turn.md).

Pieces, one module each: `tools` (tool registry, the @tool decorator, schemas), `tool_config` (the YAML tool file),
`builtin_tools` (calculator, python), `sandbox` (a limited subprocess for code), `sandbox_fusion_tool` and
`search_tool` (veRL's HTTP tools), `http_service` (their JSON POSTs), `parsers` (tool-call formats), `chat` (chat-
template deltas and the once-per-sample re-tokenisation check), `trajectory` (token ids, masks and log-probs of one
sample), `loops` (the agent-loop registry: single_turn_agent, tool_agent, user `module:Class`), `interactions`
(simulated users, veRL's interface) and `interaction_config` (their YAML file), `execution` (concurrent tool calls
with timeouts and caps), `driver` (the samples' requests through any engine's request stream), `runner` (a batch of
samples as coroutines → the rollout batch), `oversampling` (over_sample_rate: cancel the slowest samples), `metrics`
(the driver's multi_turn/* and tool/* metrics), `config_checks` (rollout.mode, agent.*, multi_turn.*).
"""
