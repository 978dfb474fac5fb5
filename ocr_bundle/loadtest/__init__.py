"""The stress test (stress_test.py): replay and metrics (replay), GPU memory and vLLM /metrics
pollers (pollers), and its reports (report)."""
