"""The benches and load tests behind ``harnessrl bench ...``, each measuring against a
baseline in the same run: the services a bench starts (``benchstack``), the proxy, capture
and vLLM-path benches, the load tests (plain and sandboxed), the async-training check, the
vLLM CPU server they start, and the one-GPU check (``gpu_check``, ``scripts/gpu_check``)."""
