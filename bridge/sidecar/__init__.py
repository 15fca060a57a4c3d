"""The run: the session (state machine), the per-page pipeline, the finish step, the control API,
the pull /metrics page, the live view, `profile` and `demo`."""
