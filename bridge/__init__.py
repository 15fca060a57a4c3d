"""dcgm-bridge: GPU telemetry for LLM benchmark runs.

Scrape NVIDIA dcgm-exporter endpoints, record every scrape, build AIPerf-compatible reports and
forward the samples as OTLP. Keep this module light: the sidecar's start-up time under a 25m CPU
limit depends on what importing `bridge` pulls in.
"""

__version__ = "0.1.0"
