"""The stress test (stress_test.py): replay and metrics (replay), the sustained rate (sustained),
GPU memory and vLLM /metrics pollers (pollers), and its reports (report)."""
