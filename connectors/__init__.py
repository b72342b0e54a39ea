"""Engine-side connectors: processes run next to an inference engine (not in the service)."""
