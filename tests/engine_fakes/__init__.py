"""Engine test helpers: stand-ins for the third-party sglang / vllm packages built from their documented APIs (not
from our code), so the adapters can run on machines where neither can be installed, and a closed-form checkpoint
for the GPU tests."""
