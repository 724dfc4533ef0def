"""The cold-start / restart / sleep benchmark (`warmctl bench`): plain vLLM vs the project's unit
vs an alternative, started from the rendered unit, measured with warmctl's own client."""
