"""Stand-ins for the third-party sglang / vllm packages, built from their documented APIs (not from our code),
so the adapters' control flow can be run and recorded on machines where neither package can be installed."""
