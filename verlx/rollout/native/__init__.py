"""The native rollout engine: a compact pure-torch decoder with a preallocated KV cache, CUDA-graph decode,
continuous batching and on-device sampling. Registered as `actor_rollout_ref.rollout.name=native`."""
